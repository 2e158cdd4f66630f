"""Finding a cluster's VMs on Azure: by their tags in the cluster's resource groups, each with its
address (its NIC's) and, when asked, its power state (its instance view: one call per VM)."""

from __future__ import annotations

from clusterbake.providers.azure import tags
from clusterbake.providers.azure.api import Clients, get_or_none
from clusterbake.providers.cloud import Machine, NodeState, RecordFields


def cluster_vms(clients: Clients, cluster: str, groups: list[str], power: bool = False) -> dict[str, dict]:
    """The cluster's VMs by node name (tag clusterbake-name), paged listings of `groups` (`group`: the
    VM's); with `power` each one's power state from its instance view."""
    found: dict[str, dict] = {}
    for rg in groups:
        for vm in clients.compute.virtual_machines.list(rg):
            vm_tags = vm.tags or {}
            if vm_tags.get(tags.CLUSTER) != cluster or not vm_tags.get(tags.NAME):
                continue
            found[vm_tags[tags.NAME]] = vm_record(vm, rg)
    for vm in found.values():
        nic = get_or_none(clients.network.network_interfaces.get, vm["group"], vm["nic"].rsplit("/", 1)[-1])
        vm["address"] = nic.ip_configurations[0].private_ip_address if nic else None
        if power:
            view = clients.compute.virtual_machines.instance_view(vm["group"], vm["name"])
            codes = [s.code for s in view.statuses or []]
            vm["power"] = next((c.split("/", 1)[1] for c in codes if c.startswith("PowerState/")), "unknown")
    return found


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
