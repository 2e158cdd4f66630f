"""power.json's `azure` section (role slurm_power): what the head's power program creates each elastic
node from, and each lost static node with recovery.replace_lost_nodes: per node group its NIC and VM
bodies, user data and the nodes' addresses. Read-only: nothing is created here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from clusterbake.config import NodeGroup
from clusterbake.providers.azure import power, resources, tags
from clusterbake.providers.azure.api import get_or_none
from clusterbake.providers.azure.catalogue import node_hardware, uses_infiniband
from clusterbake.providers.userdata import NAME_PLACEHOLDER, user_data_template

if TYPE_CHECKING:
    from clusterbake.providers.azure.provider import AzureProvider


def settings(provider: AzureProvider) -> dict | None:
    """power.json's `azure` (power.py): what the head's power program creates each elastic node from, and
    each lost static node with recovery.replace_lost_nodes. None before `cluster up` made the cluster's
    identities, security groups and vault."""
    cluster, rg = provider.config.cluster_name, provider.azure.resource_group
    identity = provider._identity()
    head = provider._identity(power.head_identity_name(cluster))
    network = provider.clients.network
    nsg = get_or_none(network.network_security_groups.get, rg, resources.cluster_name(cluster))
    asg = get_or_none(network.application_security_groups.get, rg, resources.cluster_name(cluster))
    vault = get_or_none(provider.clients.keyvault.vaults.get, rg, provider.vault_name)
    if None in (identity, head, nsg, asg, vault):
        return None
    state = provider.cluster.read_state()
    image = state.get("image") or provider.find_image()
    addresses = provider.addresses(provider.machines())
    public_key = provider.cluster.ssh_key.with_suffix(".pub")
    keys = [public_key.read_text().strip()] if public_key.exists() else []
    context = {"vault_url": vault.properties.vault_uri, "identity": identity}
    groups = {}
    for group in provider.config.node_groups:
        replaceable = provider.config.recovery.replace_lost_nodes
        members = [n for n in provider.nodes if n.nodegroup == group.name and (n.elastic or replaceable)]
        if not members:
            continue
        placement = _group_placement_ids(provider, group)
        hardware = node_hardware(provider.infos, group.types)
        node_tags = tags.node_tags(cluster, "compute", group.name)
        groups[group.name] = {
            "sizes": group.types,
            "nic": resources.nic_body(
                location=provider.azure.location,
                subnet_id=provider.subnet.id,
                address="",
                nsg_id=nsg.id,
                asg_ids=[asg.id],
                node_tags=node_tags,
                accelerated_networking=hardware["accelerated_networking"],
            ),
            "vm": resources.vm_body(
                location=provider.azure.location,
                zone=provider.azure.zone,
                size=group.instance_type,
                image=image,
                computer_name="",
                admin_user=provider.azure.admin_user,
                public_key=keys[0] if keys else "",
                custom_data="",
                nic_id="",
                identity_ids=[identity["id"]],
                node_tags=node_tags,
                spot=group.spot,
                placement_group_id=placement.get("placement_group"),
                availability_set_id=placement.get("availability_set"),
                premium_disk=hardware["premium_disk"],
                security_type=provider.azure.security_type,
            ),
            "user_data": user_data_template(
                cluster=cluster,
                ssh_user=provider.azure.admin_user,
                authorized_keys=keys,
                join=provider._join_source(members[0], context),
            ),
            "addresses": {n.name: addresses[n.name] for n in members},
        }
    return power.power_vars(
        config=provider.config,
        nodes_group=provider.nodes_group,
        head_client_id=head["client_id"],
        name_placeholder=NAME_PLACEHOLDER,
        groups=groups,
    )


def _group_placement_ids(provider: AzureProvider, group: NodeGroup) -> dict:
    """The ids of the group's proximity placement group and availability set, where it has them (read-only)."""
    name = resources.group_resource_name(provider.config.cluster_name, group.name)
    compute, rg = provider.clients.compute, provider.nodes_group
    found = {}
    if provider._wants_placement_group(group):
        ppg = get_or_none(compute.proximity_placement_groups.get, rg, name)
        if ppg is not None:
            found["placement_group"] = ppg.id
    if uses_infiniband(group, provider.infos.get(group.instance_type)):
        fabric = get_or_none(compute.availability_sets.get, rg, name)
        if fabric is not None:
            found["availability_set"] = fabric.id
    return found
