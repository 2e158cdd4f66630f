"""Finding a cluster's VMs on Azure: by their tags in the cluster's resource groups, each with its
address (its NIC's) and, when asked, its power state.

A fixed number of paged list calls whatever the cluster's size, never one call per VM: Azure
Compute throttles a subscription's reads (429 with Retry-After, Microsoft's "Troubleshooting API
throttling errors"), and an instance view per VM on every inventory load meets that at hundreds
of VMs. The VMs of each group (`virtual_machines.list`), the NICs of each group that holds one
of theirs (`network_interfaces.list`), and, for power states, one `list_all(status_only="true")`:
the documented way to read every VM's run time status at once (`list(group, expand="instanceView")`
is refused without a scale set `$filter`). Its items carry little besides the instance view (no
tags), so they are matched to the cluster's VMs by id; with rights on some resource groups only,
ARM lists the VMs the caller may read, which the cluster's are."""

from __future__ import annotations

from clusterbake.providers.azure import tags
from clusterbake.providers.azure.api import Clients, listed
from clusterbake.providers.cloud import Machine, NodeState, RecordFields


def cluster_vms(clients: Clients, cluster: str, groups: list[str], power: bool = False) -> dict[str, dict]:
    """The cluster's VMs by node name (tag clusterbake-name), paged listings of `groups` (`group`: the
    VM's); with `power` each one's power state from the subscription's status listing."""
    found: dict[str, dict] = {}
    for rg in groups:
        for vm in clients.compute.virtual_machines.list(rg):
            vm_tags = vm.tags or {}
            if vm_tags.get(tags.CLUSTER) != cluster or not vm_tags.get(tags.NAME):
                continue
            found[vm_tags[tags.NAME]] = vm_record(vm, rg)
    addresses = nic_addresses(clients, [vm["nic"] for vm in found.values()])
    for vm in found.values():
        vm["address"] = addresses.get(vm["nic"].lower())
    if power and found:
        states = power_states(clients)
        for vm in found.values():
            vm["power"] = states.get(vm["id"].lower(), "unknown")
    return found


def nic_addresses(clients: Clients, nic_ids: list[str]) -> dict[str, str]:
    """The primary private address of each NIC (lower-case id -> address): one listing per resource group."""
    wanted = {nic_id.lower() for nic_id in nic_ids}
    groups = sorted({nic_id.split("/")[4] for nic_id in nic_ids}, key=str.lower)
    addresses = {}
    for rg in groups:
        for nic in listed(clients.network.network_interfaces.list, rg):
            configs = nic.ip_configurations or []
            if nic.id.lower() in wanted and configs and configs[0].private_ip_address:
                addresses[nic.id.lower()] = configs[0].private_ip_address
    return addresses


def power_states(clients: Clients) -> dict[str, str]:
    """Every readable VM's power state (lower-case id -> running, deallocated, ...), from its instance view."""
    states = {}
    for vm in clients.compute.virtual_machines.list_all(status_only="true"):
        codes = [s.code or "" for s in (vm.instance_view.statuses if vm.instance_view else None) or []]
        states[vm.id.lower()] = next((c.split("/", 1)[1] for c in codes if c.startswith("PowerState/")), "unknown")
    return states


def vm_record(vm, rg: str) -> dict:
    return {
        "group": rg,
        "id": vm.id,
        "name": vm.name,
        "size": vm.hardware_profile.vm_size,
        "priority": vm.priority,
        "zone": (vm.zones or [None])[0],
        "state": vm.provisioning_state,
        "placement_group": vm.proximity_placement_group.id if vm.proximity_placement_group else None,
        "availability_set": vm.availability_set.id if vm.availability_set else None,
        "nic": vm.network_profile.network_interfaces[0].id,
    }


# Azure's power states (PowerState/<code> of the instance view); a VM read without them is unknown.
POWER_STATES = {
    "starting": NodeState.PENDING,
    "running": NodeState.RUNNING,
    "stopping": NodeState.STOPPING,
    "deallocating": NodeState.STOPPING,
    "stopped": NodeState.STOPPED,
    "deallocated": NodeState.STOPPED,
}


# Where a VM record (cluster_vms) keeps what a Machine holds; its power state is read only when asked.
VM_FIELDS = RecordFields(
    id="id", label="name", address="address", size="size", state=lambda vm: str(vm.get("power")), states=POWER_STATES
)


def machines_of(vms: dict[str, dict]) -> dict[str, Machine]:
    """VM records (AzureProvider.cluster_vms) as the cloud providers' machine records."""
    return VM_FIELDS.machines(vms)
