"""The cost guard of the azure provider: what runs now costs per hour, and what still bills after `down`.

`estimate`: every VM of the cluster Azure bills compute for: running or starting, and also
stopped from inside but still allocated (Azure bills a "Stopped" VM like a running one; only a
deallocated VM stops billing compute), each at its priority's price (prices.py: pay-as-you-go,
or Spot for priority Spot/Low; unknown prices stay unknown). Managed disks, Azure Files, Managed
Lustre and Blob Storage, Key Vault and data transfer are not included, and the estimate says so.

`leftovers`: read-only, after `cluster down`: everything in the cluster's two resource groups still tagged
clusterbake-cluster=<cluster> (VMs, disks, NICs, file systems, storage accounts, ...) and the
untagged OS disks named for the cluster's VMs; storage an entry keeps on purpose (`retain`,
tag clusterbake-retain) is listed as kept. A resource group that is gone holds nothing. What
cannot be checked (no permission, ...) is said, not passed over.
"""

from __future__ import annotations

from collections.abc import Callable

from clusterbake.providers.azure import tags
from clusterbake.providers.azure.api import get_or_none, message
from clusterbake.providers.base import BillingCheck, CostEstimate, Leftover, MachineCost, Price

BILLED = ("running", "starting", "stopped", "stopping")
NOT_INCLUDED = [
    "managed disks",
    "Azure Files, Managed Lustre and Blob Storage",
    "Key Vault operations",
    "data transfer",
]
# Resource types that cost nothing while they exist (no hours, no capacity).
FREE = frozenset(
    {
        "microsoft.network/networksecuritygroups",
        "microsoft.network/applicationsecuritygroups",
        "microsoft.network/networkinterfaces",
        "microsoft.compute/proximityplacementgroups",
        "microsoft.compute/virtualmachinescalesets",
        "microsoft.managedidentity/userassignedidentities",
        "microsoft.keyvault/vaults",  # billed per operation, nothing while it only exists
    }
)


def market(vm: dict) -> str:
    return "spot" if vm.get("priority") in ("Spot", "Low") else "on-demand"


def estimate(vms: dict[str, dict], price: Callable[[str, bool], Price]) -> CostEstimate:
    """The cost of the cluster's VMs (name -> provider.cluster_vms(power=True) entry) per hour;
    `price(size, spot)` gives a size's price."""
    machines, deallocated, powered_off = [], 0, 0
    for node, vm in sorted(vms.items()):
        power = vm.get("power", "unknown")
        if power not in BILLED:
            deallocated += power in ("deallocated", "deallocating")
            continue
        powered_off += power in ("stopped", "stopping")
        kind = market(vm)
        found = price(vm["size"], kind == "spot")
        machines.append(
            MachineCost(
                node=node,
                instance_id=vm["name"],
                instance_type=vm["size"],
                market=kind,
                usd_per_hour=found.usd_per_hour,
                source=found.source,
            )
        )
    notes = []
    if powered_off:
        notes.append(f"{powered_off} VM(s) stopped but still allocated: Azure bills them like running ones")
    if deallocated:
        notes.append(f"{deallocated} deallocated VM(s): no compute hours, their disks still bill")
    return CostEstimate(machines=machines, not_included=list(NOT_INCLUDED), note="; ".join(notes))


def leftovers(resources_client, compute, resource_groups: list[str], cluster: str) -> BillingCheck:
    """What of `cluster` still bills in `resource_groups` (read-only)."""
    from azure.core.exceptions import HttpResponseError

    check = BillingCheck()
    found, disks = [], []
    for resource_group in resource_groups:
        try:
            if get_or_none(resources_client.resource_groups.get, resource_group) is None:
                continue
            found += resources_client.resources.list_by_resource_group(resource_group, filter=tags.tag_filter(cluster))
            disks += [
                d
                for d in compute.disks.list_by_resource_group(resource_group)
                if d.name.startswith(f"{cluster}-") and not (d.tags or {}).get(tags.CLUSTER)
            ]
        except HttpResponseError as exc:
            check.unchecked.append(f"the resources of {resource_group} ({message(exc)})")
    for resource in sorted(found, key=lambda r: (r.type.lower(), r.name)):
        if resource.type.lower() in FREE:
            continue
        kept = tags.retained(resource)
        label = resource.type.split("/")[-1]
        what = f"{label} {resource.name}" + (" (storage entry: retain)" if kept else "")
        check.leftovers.append(Leftover(what, kept=kept))
    for disk in sorted(disks, key=lambda d: d.name):
        check.leftovers.append(Leftover(f"disk {disk.name} ({disk.disk_size_gb or '?'} GiB, {disk.disk_state})"))
    return check
