"""Config checks that need Azure (read-only calls): run before anything is created.

Each failure is a ConfigError (exit status 2) that names the config field and what to do.
- the subnet exists (azure.subnet_id, or vnet_name + subnet_name) and its network is in
  azure.location; a private subnet has a way out (check_outbound);
- every VM size is offered in the location (Resource SKUs), not restricted for the
  subscription there, and offered in azure.zone (locationInfo zones, Zone restrictions);
- infiniband only on RDMA sizes (RdmaEnabled), spot only on LowPriorityCapable sizes;
- quota (compute usages of the location): the vCPUs of the nodes still to create fit in each
  VM family's quota and in the total regional vCPUs (spot nodes: the low-priority vCPUs).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from clusterbake.config import ClusterConfig
from clusterbake.errors import ConfigError
from clusterbake.plan import LOGIN_GROUP
from clusterbake.progress import say
from clusterbake.providers.azure.api import get_or_none
from clusterbake.providers.azure.catalogue import Catalogue, SkuInfo, uses_infiniband
from clusterbake.providers.common import check_fallback_types, instance_type_fields

QUOTA_HINT = "request more in the Azure portal (Quotas > Compute) or plan fewer nodes"


@dataclass(frozen=True)
class Subnet:
    id: str
    prefix: str
    location: str
    service_endpoints: tuple[str, ...] = ()
    default_outbound: bool = True  # defaultOutboundAccess not false: Azure's default outbound access
    nat_gateway: bool = False
    route_table: bool = False


def check_subnet(network, config: ClusterConfig) -> Subnet:
    azure = config.azure
    group, vnet_name, subnet_name = azure.subnet_parts
    field = azure.subnet_field
    where = azure.subnet_id or f"{subnet_name} of virtual network {vnet_name} (resource group {group})"
    vnet = get_or_none(network.virtual_networks.get, group, vnet_name)
    if vnet is None:
        field = field if azure.subnet_id else "azure.vnet_name"
        raise ConfigError(
            f"{field}: virtual network {vnet_name} does not exist in resource group {group} of subscription "
            f"{azure.subscription_id}; give an existing network (clusterbake does not create it)"
        )
    if vnet.location.replace(" ", "").lower() != azure.location:
        raise ConfigError(
            f"{field}: {where} is in {vnet.location}, not in azure.location {azure.location}; "
            "VMs can only use a subnet of their own region"
        )
    subnet = get_or_none(network.subnets.get, group, vnet_name, subnet_name)
    if subnet is None:
        raise ConfigError(f"{field}: subnet {subnet_name} does not exist in virtual network {vnet_name} ({group})")
    prefix = subnet.address_prefix or (subnet.address_prefixes or [None])[0]
    ipaddress.ip_network(prefix)
    services = tuple(e.service for e in (subnet.service_endpoints or []) if e.service)
    return Subnet(
        subnet.id,
        prefix,
        azure.location,
        services,
        default_outbound=subnet.default_outbound_access is not False,
        nat_gateway=subnet.nat_gateway is not None,
        route_table=subnet.route_table is not None,
    )


def check_outbound(subnet: Subnet, config: ClusterConfig, powered: bool) -> None:
    """The VMs reach what they must from a private subnet (defaultOutboundAccess false, the default of new
    virtual networks: no default outbound access, "Default outbound access in Azure"): the nodes Key Vault
    (their join bundles), the head Azure Resource Manager when it powers nodes. A NAT gateway gives both; the
    Microsoft.KeyVault service endpoint gives Key Vault only; a route table is taken to route 0.0.0.0/0
    through the operator's firewall (said, not checked: its routes are the operator's)."""
    if subnet.default_outbound or subnet.nat_gateway:
        return
    field = config.azure.subnet_field
    if subnet.route_table:
        say(
            f"    {field}: the subnet is private (no default outbound access) and has a route table, taken to route "
            "to Key Vault and Azure Resource Manager through your firewall (clusterbake does not check it)"
        )
        return
    missing = []
    if "Microsoft.KeyVault" not in subnet.service_endpoints:
        missing.append("Key Vault (the nodes read their join bundles there)")
    if powered:
        missing.append("Azure Resource Manager (the head creates and deletes elastic and replaced nodes' VMs)")
    if missing:
        raise ConfigError(
            f"{field}: subnet {subnet.id} is private (defaultOutboundAccess false: no default outbound access) and "
            f"has no NAT gateway, so its VMs cannot reach {' or '.join(missing)}; attach a NAT gateway to the "
            "subnet (az network vnet subnet update --nat-gateway ...)"
            + ("" if powered else ", or add the Microsoft.KeyVault service endpoint to it")
        )


def check_sizes(config: ClusterConfig, catalogue: Catalogue) -> dict[str, SkuInfo]:
    azure = config.azure
    infos: dict[str, SkuInfo] = {}
    for field, size in instance_type_fields(config):
        info = catalogue.get(size)
        if info is None:
            raise ConfigError(
                f"{field}: {size} is not a VM size offered in {azure.location} (Resource SKUs); "
                "pick one `az vm list-skus --location " + azure.location + "` lists"
            )
        if info.location_restriction:
            raise ConfigError(
                f"{field}: {size} is not available to subscription {azure.subscription_id} in {azure.location} "
                f"({info.location_restriction}); request access for the size or pick another location"
            )
        if azure.zone and not info.offered_in_zone(azure.zone):
            offered = [z for z in info.zones if z not in info.restricted_zones]
            raise ConfigError(
                f"{field}: {size} is not offered in zone {azure.zone} of {azure.location} for this subscription "
                f"(zones: {', '.join(offered) or 'none'}); set azure.zone to one of those"
            )
        infos[size] = info
    for index, group in enumerate(config.node_groups):
        info = infos[group.instance_type]
        if len(group.types) > 1 and uses_infiniband(group, info):
            raise ConfigError(
                f"node_groups.{index}.instance_types: the group's VMs share one InfiniBand fabric (one availability "
                "set), which needs one size; give instance_type, or set infiniband: false to fall over to other sizes"
            )
        check_fallback_types(f"node_groups.{index}", [infos[t] for t in group.types])
        if group.spot and not all(infos[t].low_priority for t in group.types):
            spotless = next(t for t in group.types if not infos[t].low_priority)
            raise ConfigError(
                f"node_groups.{index}.spot: {spotless} is not sold as Spot in {azure.location} "
                "(LowPriorityCapable False); set spot: false or drop it from instance_types"
            )
        if group.infiniband and not info.rdma:
            raise ConfigError(
                f"node_groups.{index}.infiniband: {info.name} has no InfiniBand (RdmaEnabled False); set "
                "infiniband: false or pick an RDMA size (Standard_ND96isr_H100_v5, Standard_HB120rs_v3, ...)"
            )
    return infos


def check_quota(config: ClusterConfig, compute, infos: dict[str, SkuInfo], existing: set[str]) -> None:
    """The vCPUs of the static nodes not created yet (`existing`: names of the cluster's VMs) fit the quota."""
    azure = config.azure
    usages = {u.name.value: (u.current_value, u.limit) for u in compute.usage.list(azure.location)}
    sections = [("head", "head.instance_type", config.head.instance_type, 1, False)]
    if "head" in existing:
        sections[0] = (*sections[0][:3], 0, False)
    if config.login_nodes is not None:
        count = sum(1 for name in config.login_nodes.node_names() if name not in existing)
        sections.append((LOGIN_GROUP, "login_nodes.instance_type", config.login_nodes.instance_type, count, False))
    for index, group in enumerate(config.node_groups):
        missing = sum(1 for n in range(1, group.static_count + 1) if f"{group.name}-{n}" not in existing)
        sections.append((group.name, f"node_groups.{index}.instance_type", group.instance_type, missing, group.spot))
    needed: dict[str, int] = {}
    for _, field, size, count, spot in sections:
        if not count:
            continue
        info = infos[size]
        for usage in ["lowPriorityCores"] if spot else [info.family, "cores"]:
            needed[usage] = needed.get(usage, 0) + count * info.vcpus
            current, limit = usages.get(usage, (0, None))
            if limit is not None and current + needed[usage] > limit:
                what = {
                    "cores": "total regional vCPUs",
                    "lowPriorityCores": "Spot (low-priority) vCPUs",
                }.get(usage, f"{usage} vCPUs")
                raise ConfigError(
                    f"{field}: {count} x {size} need {count * info.vcpus} vCPUs of the {what} quota in "
                    f"{azure.location} ({needed[usage]} for the cluster's new nodes), {max(limit - current, 0)} of "
                    f"{limit} left; {QUOTA_HINT}"
                )
