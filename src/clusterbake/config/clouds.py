"""The provider sections: local, aws, azure, and the fields every cloud section has."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from clusterbake.config.base import GUID_PATTERN, RESOURCE_GROUP_PATTERN, Strict, check_cidrs
from clusterbake.config.storage import SUBNET_ID_PATTERN, zone_as_text


class LocalConfig(Strict):
    subnet: str = Field("10.77.0.0/24", description="Project bridge subnet; the host takes the first address.")
    outbound: bool = Field(
        False,
        description="Nodes reach beyond this machine (a package index, a registry) through it: NAT on the host "
        "(nftables, IPv4 forwarding on while such a cluster exists). Off: no route off the bridge.",
    )
    state_dir: str = Field("/var/lib/clusterbake", description="Images, caches and cluster state.")
    topology: dict[str, list[str]] = Field(
        default_factory=dict,
        description="For testing topology-aware scheduling: where compute nodes hang in a network that is not "
        "there, as EC2's DescribeInstanceTopology says it: node names (a hostlist, e.g. cpu-[1-8]) to their "
        "switches from the top down, e.g. {'cpu-[1-8]': [spine-1, leaf-1]} (topology.conf, topology/tree).",
    )
    boot_timeout: int = Field(
        60,
        ge=5,
        le=3600,
        description="Seconds a started node has to answer SSH before `cluster up` fails (a first up is rolled back; "
        "the failed nodes' console logs and journals are kept under the cluster's logs).",
    )

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, value: str) -> str:
        network = ipaddress.ip_network(value, strict=True)
        if network.version != 4 or not network.is_private or network.prefixlen > 28:
            raise ValueError("must be a private IPv4 network of /28 or larger, e.g. 10.77.0.0/24")
        return value


# --- the fields every cloud section (aws, azure) has ----------------------------------------------


def ssh_cidrs_field(outside: str):
    """CIDRs allowed to SSH in; `outside`: where nothing else enters from."""
    return Field(
        default_factory=list,
        description=f"CIDRs allowed to reach SSH (port 22) on the nodes; nothing else enters from {outside}.",
    )


def login_user_field(default: str, description: str):
    return Field(default, pattern=r"^[a-z_][a-z0-9_-]{0,31}$", description=description)


def bastion_field():
    return Field(
        None,
        pattern=r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+(:\d+)?$",
        description="SSH jump host user@host[:port] (ProxyJump) when the nodes' private IPs are not reachable.",
    )


def network_interface_field(description: str):
    return Field("auto", pattern=r"^[a-z][a-z0-9]{1,14}$", description=description)


class AwsConfig(Strict):
    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d+$", description="AWS region, e.g. us-east-1.")
    vpc_id: str = Field(pattern=r"^vpc-[0-9a-f]{8,17}$", description="Existing VPC the cluster runs in.")
    subnet_id: str = Field(
        pattern=r"^subnet-[0-9a-f]{8,17}$",
        description="Existing subnet of that VPC; its Availability Zone is where every node runs.",
    )
    ssh_cidrs: list[str] = ssh_cidrs_field("outside")
    key_name: str | None = Field(None, description="EC2 key pair also installed for ssh_user (optional).")
    ami_id: str | None = Field(
        None,
        pattern=r"^ami-[0-9a-f]{8,17}$",
        description="Node image; default: the AMI of the last `make image PROVIDER=aws` "
        "(<state_dir>/images/aws-latest.json).",
    )
    bastion: str | None = bastion_field()
    ssh_user: str = login_user_field("ubuntu", "Login user of the AMI (sudo to root).")
    kms_key_id: str | None = Field(
        None,
        pattern=r"^(arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)/[A-Za-z0-9/_-]+|alias/[A-Za-z0-9/_-]+|"
        r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$",
        description="KMS key (id, ARN or alias) that encrypts the join-bundle secrets; default: the AWS managed "
        "key aws/secretsmanager.",
    )
    network_interface: str = network_interface_field(
        "Interface NCCL and gloo bootstrap on (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME). auto: found on "
        "each node (the one with its route to the head; names differ by type and OS: ens5, enp71s0 on p5); "
        "an interface name overrides it."
    )

    @field_validator("ssh_cidrs")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        return check_cidrs(values)


AZURE_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,78}[A-Za-z0-9_])?$"
# Azure refuses these as a VM's admin user name (its documented list, case-insensitive).
AZURE_RESERVED_USERS = frozenset(
    {
        "administrator", "admin", "user", "user1", "test", "user2", "test1", "user3", "admin1", "1", "123", "a",
        "actuser", "adm", "admin2", "aspnet", "backup", "console", "david", "guest", "john", "owner", "root",
        "server", "sql", "support", "support_388945a0", "sys", "test2", "test3", "user4", "user5",
    }
)  # fmt: skip


class AzureConfig(Strict):
    subscription_id: str = Field(pattern=GUID_PATTERN, description="Azure subscription (a GUID) the cluster runs in.")
    location: str = Field(pattern=r"^[a-z][a-z0-9]+$", description="Azure region, e.g. eastus, westeurope.")
    zone: Literal["1", "2", "3"] | None = Field(
        None, description="Availability zone of every node; default: none (regional, Azure picks)."
    )
    resource_group: str = Field(
        pattern=RESOURCE_GROUP_PATTERN,
        description="Resource group of the cluster's resources; created (tagged clusterbake-cluster) when missing, "
        "and deleted by `cluster down` only if clusterbake created it.",
    )
    nodes_resource_group: str | None = Field(
        None,
        pattern=RESOURCE_GROUP_PATTERN,
        description="Resource group of the compute nodes' VMs, NICs and placement groups, the only group the "
        "head's power identity may write in (never the head's own VM); created and deleted with the cluster; "
        "default: <resource_group>-<cluster>-nodes.",
    )
    subnet_id: str | None = Field(
        None,
        pattern=SUBNET_ID_PATTERN,
        description="Existing subnet, by resource id (/subscriptions/.../virtualNetworks/V/subnets/S); "
        "or give vnet_name and subnet_name.",
    )
    vnet_name: str | None = Field(None, pattern=AZURE_NAME_PATTERN, description="Existing virtual network, by name.")
    subnet_name: str | None = Field(None, pattern=AZURE_NAME_PATTERN, description="Existing subnet of vnet_name.")
    vnet_resource_group: str | None = Field(
        None, pattern=RESOURCE_GROUP_PATTERN, description="Resource group of vnet_name; default: resource_group."
    )
    ssh_cidrs: list[str] = ssh_cidrs_field("outside the cluster")
    admin_user: str = login_user_field("azureuser", "Login user of the VMs (SSH key only, sudo to root).")
    image: str | None = Field(
        None,
        pattern=r"^(/subscriptions/[^\s]+|[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+)$",
        description="Node image: a resource id (managed image or gallery image version) or a marketplace URN "
        "publisher:offer:sku:version; default: the image of the last `make image CONFIG=<this file>` "
        "(<state_dir>/images/azure-latest.json).",
    )
    key_vault_name: str | None = Field(
        None,
        pattern=r"^[a-zA-Z][a-zA-Z0-9-]{1,22}[a-zA-Z0-9]$",
        description="Key Vault that holds the join bundles (names are global in Azure); default: cb-<cluster>-<hash "
        "of subscription and resource group>.",
    )
    security_type: Literal["Standard", "TrustedLaunch"] = Field(
        "Standard",
        description="Security type every VM is created with (always sent: Azure makes Trusted Launch with Secure "
        "Boot the default for Gen2 VMs that name none, and Secure Boot keeps the image's unsigned NVIDIA and "
        "DOCA-OFED DKMS modules from loading). TrustedLaunch: vTPM on, Secure Boot off; needs a gallery image "
        "version or a marketplace image (not a managed image).",
    )
    bastion: str | None = bastion_field()
    network_interface: str = network_interface_field(
        "Interface NCCL and gloo bootstrap on; auto: found on each node (eth0 on Azure's images)."
    )

    @model_validator(mode="before")
    @classmethod
    def _zone_as_text(cls, data):
        return zone_as_text(data)

    @field_validator("ssh_cidrs")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        return check_cidrs(values)

    @field_validator("admin_user")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value.lower() in AZURE_RESERVED_USERS:
            raise ValueError(f"Azure does not allow '{value}' as a VM's admin user; choose another (azureuser)")
        return value

    @property
    def subnet_parts(self) -> tuple[str, str, str]:
        """(resource group, virtual network, subnet) of the existing subnet."""
        if self.subnet_id:
            parts = self.subnet_id.split("/")
            return parts[4], parts[8], parts[10]
        return self.vnet_resource_group or self.resource_group, self.vnet_name, self.subnet_name

    @model_validator(mode="after")
    def _nodes_group_of_their_own(self):
        if self.nodes_resource_group and self.nodes_resource_group.lower() == self.resource_group.lower():
            raise ValueError(
                "azure.nodes_resource_group must differ from azure.resource_group: the head's power identity "
                "may write every VM there, and the head's must not be one of them (leave it unset for the default)"
            )
        return self

    @property
    def subnet_field(self) -> str:
        return "azure.subnet_id" if self.subnet_id else "azure.subnet_name"
