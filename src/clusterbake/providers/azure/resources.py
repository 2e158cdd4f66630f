"""Names and request bodies of what the azure provider creates (ARM's REST shapes).

In two resource groups, all tagged clusterbake-cluster=<cluster>: the compute nodes' own
(nodes_group_name(): their VMs, NICs, OS disks, placement groups and scale sets; the head's power
identity may write there and nowhere else, security review finding 2) and azure.resource_group
(the rest, the head's VM and NIC among it):
- application security group and network security group `clusterbake-<cluster>`: every
  node's NIC is in the ASG (a login node's also in the ASG `clusterbake-<cluster>-login`); the
  NSG (on every NIC) allows TCP 22 from each of azure.ssh_cidrs and to the login nodes from
  each of login_nodes.ssh_cidrs, everything from the ASG to the ASG (the cluster), TCP 988 and 1019-1023
  from the subnet of each Managed Lustre file system the nodes mount (its servers open
  connections to their clients: Microsoft's "Configure a network security group for Azure
  Managed Lustre", outbound rule 108), and denies the rest of the virtual network (Azure's
  default rule AllowVnetInBound would admit it);
- user-assigned managed identity `clusterbake-<cluster>-nodes` (the nodes read their join
  bundle with it, and their blob containers), and with elastic groups `clusterbake-<cluster>-head`
  (the head's power program creates and deletes VMs with it: power.py);
- Key Vault (vault_name(): names are global) with a secret `join-<group>` per node group
  (and its parts `join-<group>--<n>` where the bundle is too big for one: join_secrets.py);
  access policies: the caller (set, get, list, delete), the nodes' identity (get);
- per node group a proximity placement group and, for InfiniBand groups, an availability set
  `clusterbake-<cluster>-<group>` in it (the VMs of one availability set share an InfiniBand
  fabric; Flexible scale sets do not support InfiniBand: Microsoft's "Orchestration modes for
  Virtual Machine Scale Sets", Networking table). An availability set is never zonal: the group's
  zone (azure.zone) is its proximity placement group's;
- per node a NIC `<cluster>-<node>-nic` with its planned static private address and a VM
  `<cluster>-<node>` (computer name = node name), OS disk and NIC deleted with the VM; its
  customData (cloud-init) and userData (IMDS: the boot service) say where the bundle is.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence

from clusterbake.providers.azure import tags
from clusterbake.providers.common import resource_name

SSH_PRIORITY = 100  # 100, 101, ... one rule per CIDR
LOGIN_SSH_PRIORITY = 500  # 500, 501, ... one rule per CIDR of login_nodes.ssh_cidrs
CLUSTER_PRIORITY = 1000
LUSTRE_PRIORITY = 2000  # 2000, 2001, ... one rule per Managed Lustre subnet
LUSTRE_PORTS = ["988", "1019-1023"]
DENY_VNET_PRIORITY = 4000


# clusterbake-<cluster> (the NSG and the ASG), clusterbake-<cluster>-<node group>
# (a group's availability set or placement group).
cluster_name = group_resource_name = resource_name


def identity_name(cluster: str) -> str:
    return resource_name(cluster, "nodes")


def vm_name(cluster: str, node: str) -> str:
    return f"{cluster}-{node}"


def nic_name(cluster: str, node: str) -> str:
    return f"{cluster}-{node}-nic"


def secret_name(nodegroup: str) -> str:
    return f"join-{nodegroup}"


def nodes_group_name(cluster: str, resource_group: str, configured: str | None = None) -> str:
    """The compute nodes' resource group: azure.nodes_resource_group, else <resource_group>-<cluster>-nodes
    (shortened to ARM's 90 characters)."""
    if configured:
        return configured
    suffix = f"-{cluster}-nodes"
    return resource_group[: 90 - len(suffix)].rstrip(".") + suffix


def vault_name(cluster: str, subscription_id: str, resource_group: str) -> str:
    """cb<cluster without dashes, 14 at most><8 hex of subscription/group/cluster>: 3-24 characters, global."""
    digest = hashlib.sha256(f"{subscription_id}/{resource_group}/{cluster}".lower().encode()).hexdigest()[:8]
    return f"cb{cluster.replace('-', '')[:14]}{digest}"


def _ssh_rules(name: str, priority: int, cidrs: Sequence[str], asg_id: str, what: str) -> list[dict]:
    """An inbound TCP 22 rule per CIDR to the ASG's NICs (`what`: the description's words, before .ssh_cidrs)."""
    return [
        {
            "name": f"{name}-{index}",
            "properties": {
                "priority": priority + index,
                "direction": "Inbound",
                "access": "Allow",
                "protocol": "Tcp",
                "sourceAddressPrefix": cidr,
                "sourcePortRange": "*",
                "destinationApplicationSecurityGroups": [{"id": asg_id}],
                "destinationPortRange": "22",
                "description": f"clusterbake: SSH {what}.ssh_cidrs",
            },
        }
        for index, cidr in enumerate(cidrs)
    ]


def security_rules(
    asg_id: str,
    ssh_cidrs: list[str],
    lustre_prefixes: Sequence[str] = (),
    login: tuple[str, Sequence[str]] | None = None,
) -> list[dict]:
    """The NSG's rules; `lustre_prefixes`: the address ranges of the Managed Lustre file systems' subnets;
    `login`: the login nodes' ASG and the users' networks that reach SSH on them (login_nodes.ssh_cidrs)."""
    login_asg, login_cidrs = login or ("", ())
    rules = _ssh_rules("login-ssh", LOGIN_SSH_PRIORITY, login_cidrs, login_asg, "to the login nodes from login_nodes")
    rules += _ssh_rules("ssh", SSH_PRIORITY, ssh_cidrs, asg_id, "from azure")
    rules.append(
        {
            "name": "cluster",
            "properties": {
                "priority": CLUSTER_PRIORITY,
                "direction": "Inbound",
                "access": "Allow",
                "protocol": "*",
                "sourceApplicationSecurityGroups": [{"id": asg_id}],
                "sourcePortRange": "*",
                "destinationApplicationSecurityGroups": [{"id": asg_id}],
                "destinationPortRange": "*",
                "description": "clusterbake: all traffic within the cluster",
            },
        }
    )
    rules += [
        {
            "name": f"amlfs-{index}",
            "properties": {
                "priority": LUSTRE_PRIORITY + index,
                "direction": "Inbound",
                "access": "Allow",
                "protocol": "Tcp",
                "sourceAddressPrefix": prefix,
                "sourcePortRange": "*",
                "destinationApplicationSecurityGroups": [{"id": asg_id}],
                "destinationPortRanges": LUSTRE_PORTS,
                "description": "clusterbake: Azure Managed Lustre's servers connect to their clients",
            },
        }
        for index, prefix in enumerate(lustre_prefixes)
    ]
    rules.append(
        {
            "name": "deny-vnet",
            "properties": {
                "priority": DENY_VNET_PRIORITY,
                "direction": "Inbound",
                "access": "Deny",
                "protocol": "*",
                "sourceAddressPrefix": "VirtualNetwork",
                "sourcePortRange": "*",
                "destinationAddressPrefix": "*",
                "destinationPortRange": "*",
                "description": "clusterbake: nothing else of the virtual network",
            },
        }
    )
    return rules


def rules_differ(current: list, desired: list[dict]) -> bool:
    """Whether the NSG's rules (SDK models) differ from `desired` (names, priorities, access, protocol, sources,
    ports)."""

    def key(name, priority, access, protocol, source, sources, source_groups, port, ports):
        return (
            name,
            priority,
            access or "",
            (protocol or "").lower(),
            tuple(sorted(p for p in [source, *(sources or [])] if p)),
            tuple(sorted(g.lower() for g in source_groups)),
            tuple(sorted(p for p in [port, *(ports or [])] if p)),
        )

    have = {
        key(
            r.name,
            r.priority,
            r.access,
            r.protocol,
            r.source_address_prefix,
            r.source_address_prefixes,
            [g.id for g in r.source_application_security_groups or []],
            r.destination_port_range,
            r.destination_port_ranges,
        )
        for r in current
    }
    want = {
        key(
            r["name"],
            r["properties"]["priority"],
            r["properties"]["access"],
            r["properties"]["protocol"],
            r["properties"].get("sourceAddressPrefix"),
            r["properties"].get("sourceAddressPrefixes"),
            [g["id"] for g in r["properties"].get("sourceApplicationSecurityGroups", [])],
            r["properties"].get("destinationPortRange"),
            r["properties"].get("destinationPortRanges"),
        )
        for r in desired
    }
    return have != want


def image_reference(image: str) -> dict:
    """A resource id as {id}, a marketplace URN publisher:offer:sku:version as its four parts."""
    if image.startswith("/"):
        return {"id": image}
    publisher, offer, sku, version = image.split(":")
    return {"publisher": publisher, "offer": offer, "sku": sku, "version": version}


def nic_body(
    *,
    location: str,
    subnet_id: str,
    address: str,
    nsg_id: str,
    asg_ids: list[str],
    node_tags: dict,
    accelerated_networking: bool = True,
) -> dict:
    """A node's NIC; accelerated networking only where every size the NIC may serve has it (ARM refuses a VM
    of a size without it: VMSizeIsNotPermittedToEnableAcceleratedNetworking)."""
    return {
        "location": location,
        "tags": node_tags,
        "properties": {
            "ipConfigurations": [
                {
                    "name": "ipconfig1",
                    "properties": {
                        "subnet": {"id": subnet_id},
                        "privateIPAllocationMethod": "Static",
                        "privateIPAddress": address,
                        "applicationSecurityGroups": [{"id": asg_id} for asg_id in asg_ids],
                    },
                }
            ],
            "networkSecurityGroup": {"id": nsg_id},
            "enableAcceleratedNetworking": accelerated_networking,
        },
    }


def vm_body(
    *,
    location: str,
    zone: str | None,
    size: str,
    image: str,
    computer_name: str,
    admin_user: str,
    public_key: str,
    custom_data: str,
    nic_id: str,
    identity_ids: list[str],
    node_tags: dict,
    spot: bool = False,
    placement_group_id: str | None = None,
    availability_set_id: str | None = None,
    premium_disk: bool = True,
    security_type: str = "Standard",
) -> dict:
    """A VM. The security type is always sent: Azure makes Trusted Launch (Secure Boot: the image's unsigned
    DKMS modules, NVIDIA's and DOCA-OFED's, would not load) the default for Gen2 VMs that name none, and the
    default depends on the api-version (review B4, B10). TrustedLaunch here is vTPM without Secure Boot.
    An OS disk is Premium SSD where the size has premium storage (PremiumIO), else Standard SSD."""
    security: dict = {"securityType": security_type}
    if security_type == "TrustedLaunch":
        security["uefiSettings"] = {"secureBootEnabled": False, "vTpmEnabled": True}
    body: dict = {
        "location": location,
        "tags": node_tags,
        "identity": {"type": "UserAssigned", "userAssignedIdentities": {i: {} for i in identity_ids}},
        "properties": {
            "hardwareProfile": {"vmSize": size},
            "storageProfile": {
                "imageReference": image_reference(image),
                "osDisk": {
                    "createOption": "FromImage",
                    "caching": "ReadWrite",
                    "deleteOption": "Delete",
                    "managedDisk": {"storageAccountType": "Premium_LRS" if premium_disk else "StandardSSD_LRS"},
                },
            },
            "osProfile": {
                "computerName": computer_name,
                "adminUsername": admin_user,
                # Where the join bundle is, never the bundle (custom data is readable from IMDS).
                "customData": base64.b64encode(custom_data.encode()).decode(),
                "linuxConfiguration": {
                    "disablePasswordAuthentication": True,
                    "ssh": {
                        "publicKeys": [{"path": f"/home/{admin_user}/.ssh/authorized_keys", "keyData": public_key}]
                    },
                },
            },
            "networkProfile": {"networkInterfaces": [{"id": nic_id, "properties": {"deleteOption": "Delete"}}]},
            "securityProfile": security,
            # Boot diagnostics in managed storage: the serial console log, where the boot program prints
            # the SSH host keys the controller pins before it connects (provider._pin_host_keys).
            "diagnosticsProfile": {"bootDiagnostics": {"enabled": True}},
            # The same document as userData: Azure's IMDS serves userData (the image's boot service reads it
            # there, role cloud_boot), never customData (cloud-init's, through the provisioning agent).
            "userData": base64.b64encode(custom_data.encode()).decode(),
        },
    }
    if zone and not availability_set_id:  # an availability set's VMs take their zone from its placement group
        body["zones"] = [zone]
    if spot:
        body["properties"] |= {"priority": "Spot", "evictionPolicy": "Delete", "billingProfile": {"maxPrice": -1}}
    if placement_group_id:
        body["properties"]["proximityPlacementGroup"] = {"id": placement_group_id}
    if availability_set_id:
        body["properties"]["availabilitySet"] = {"id": availability_set_id}
    return body


def availability_set_body(*, location: str, node_tags: dict, placement_group_id: str | None) -> dict:
    """An InfiniBand group's availability set: Aligned (managed disks), one fault and update domain (the
    group is one fabric, planned maintenance takes it whole), in the group's proximity placement group."""
    body: dict = {
        "location": location,
        "tags": node_tags,
        "sku": {"name": "Aligned"},
        "properties": {"platformFaultDomainCount": 1, "platformUpdateDomainCount": 1},
    }
    if placement_group_id:
        body["properties"]["proximityPlacementGroup"] = {"id": placement_group_id}
    return body


def cluster_tag(cluster: str) -> dict[str, str]:
    return tags.cluster_tags(cluster)
