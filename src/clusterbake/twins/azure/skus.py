"""The twin's resource SKU catalogue (Microsoft.Compute/skus), per location, with real sizes.

Figures are Microsoft's published sizes (learn.microsoft.com, "Sizes for virtual machines
in Azure"): vCPUs, memory in GiB, GPUs, RdmaEnabled (InfiniBand), vCPUsPerCore (1: no SMT),
LowPriorityCapable (spot). Capability names and value strings are those of the Resource
SKUs API (`az vm list-skus`): every value is a string, booleans "True"/"False".

- Standard_D2s_v5, Standard_D4s_v5, Standard_D8s_v5: general purpose (2 / 4 / 8 vCPUs, 8 / 16 / 32 GiB).
- Standard_D2as_v5, Standard_D4as_v5: the same with AMD EPYC (2 / 4 vCPUs, 8 / 16 GiB; family DASv5).
- Standard_D4_v5: Dv5 without premium storage (PremiumIO False: Standard HDD/SSD disks only).
- Standard_A2_v2: entry level (2 vCPUs, 4 GiB): no premium storage, no accelerated networking, Gen1
  only (Microsoft's Av2-series page: "Premium Storage: Not Supported", "VM Generation Support:
  Generation 1", "Accelerated Networking: Not Supported").
- Standard_HB120rs_v3: 120 AMD cores without SMT, 448 GiB, 200 Gb/s HDR InfiniBand.
- Standard_NC24ads_A100_v4: 24 vCPUs, 220 GiB, 1 x A100 80 GB, no InfiniBand.
- Standard_ND96isr_H100_v5: 96 physical Sapphire Rapids cores, 1,900 GiB, 8 x H100 80 GB,
  8 x 400 Gb/s NDR InfiniBand (one per GPU), NVSwitch. Not sold as spot.
- Standard_ND96isr_H200_v5: 96 cores, 1,850 GiB, 8 x H200 141 GB, 8 x 400 Gb/s NDR.

- Standard_NDisr_twin: the twin's own ND-class size, not Azure's: RdmaEnabled with one 400 Gb/s
  InfiniBand port, vCPUs as this host has (a node that reports fewer CPUs than its size is
  drained), 4 GiB per vCPU (at most this host's memory), no GPU (a twin node has none to
  give: the local provider's placeholder GPUs show GPU scheduling), not sold as spot.

InfiniBand ports (INFINIBAND_PORTS: HCAs per VM, Gb/s each) are Microsoft's published links
(each series' page, "InfiniBand"); the twin's nodes show them through an `ibstat` stand-in
(twins/azure/infiniband.py).

Zones and restrictions are the twin's own (capacity differs per subscription in real
Azure): `eastus` offers everything in zones 1-3 except the H200 size, which it restricts
for this subscription in zone 3 (a `Zone` restriction, NotAvailableForSubscription);
`westeurope` offers no ND H100/H200 sizes (absent, as the API omits sizes a region lacks).
"""

from __future__ import annotations

import os

TWIN_ND_SIZE = "Standard_NDisr_twin"


def _host_memory_gib() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return 8
    return max(1, kib // (1024 * 1024))


_HOST_CPUS = os.cpu_count() or 1

# name -> (family, vCPUs, MemoryGB, GPUs, RdmaEnabled, vCPUsPerCore, LowPriorityCapable, tier size)
SIZES: dict[str, tuple[str, int, float, int, bool, int, bool]] = {
    "Standard_D2s_v5": ("standardDSv5Family", 2, 8, 0, False, 2, True),
    "Standard_D4s_v5": ("standardDSv5Family", 4, 16, 0, False, 2, True),
    "Standard_D8s_v5": ("standardDSv5Family", 8, 32, 0, False, 2, True),
    "Standard_D2as_v5": ("standardDASv5Family", 2, 8, 0, False, 2, True),
    "Standard_D4as_v5": ("standardDASv5Family", 4, 16, 0, False, 2, True),
    "Standard_D4_v5": ("standardDv5Family", 4, 16, 0, False, 2, True),
    "Standard_A2_v2": ("standardAv2Family", 2, 4, 0, False, 1, True),
    "Standard_HB120rs_v3": ("standardHBrsv3Family", 120, 448, 0, True, 1, True),
    "Standard_NC24ads_A100_v4": ("standardNCADSA100v4Family", 24, 220, 1, False, 1, True),
    "Standard_ND96isr_H100_v5": ("standardNDSH100v5Family", 96, 1900, 8, True, 1, False),
    "Standard_ND96isr_H200_v5": ("standardNDSH200v5Family", 96, 1850, 8, True, 1, False),
    TWIN_ND_SIZE: ("standardNDtwinFamily", _HOST_CPUS, min(4 * _HOST_CPUS, _host_memory_gib()), 0, True, 1, False),
}

# RDMA size -> (InfiniBand HCAs per VM, Gb/s each): ND H100/H200 v5 8 x 400 (NDR), HBv3 1 x 200 (HDR).
INFINIBAND_PORTS: dict[str, tuple[int, int]] = {
    "Standard_HB120rs_v3": (1, 200),
    "Standard_ND96isr_H100_v5": (8, 400),
    "Standard_ND96isr_H200_v5": (8, 400),
    TWIN_ND_SIZE: (1, 400),
}

# Capabilities that differ from the common ones sku_entry gives (Resource SKUs' names and strings).
CAPABILITY_OVERRIDES: dict[str, dict[str, str]] = {
    "Standard_D4_v5": {"PremiumIO": "False", "MaxResourceVolumeMB": "0"},
    "Standard_A2_v2": {
        "PremiumIO": "False",
        "AcceleratedNetworkingEnabled": "False",
        "HyperVGenerations": "V1",
        "MaxResourceVolumeMB": "20480",
        "EphemeralOSDiskSupported": "False",
    },
}

LOCATIONS: dict[str, dict[str, list[str]]] = {
    # location -> size -> zones
    "eastus": {name: ["1", "2", "3"] for name in SIZES},
    "westeurope": {name: ["1", "2", "3"] for name in SIZES if not name.startswith("Standard_ND96isr")},
}
# (location, size) -> zones restricted for this subscription
ZONE_RESTRICTIONS: dict[tuple[str, str], list[str]] = {("eastus", "Standard_ND96isr_H200_v5"): ["3"]}

FAMILY_NAMES = {
    "standardDSv5Family": "Standard DSv5 Family vCPUs",
    "standardDASv5Family": "Standard DASv5 Family vCPUs",
    "standardDv5Family": "Standard Dv5 Family vCPUs",
    "standardAv2Family": "Standard Av2 Family vCPUs",
    "standardHBrsv3Family": "Standard HBrsv3 Family vCPUs",
    "standardNCADSA100v4Family": "Standard NCADS_A100_v4 Family vCPUs",
    "standardNDSH100v5Family": "Standard NDSH100v5 Family vCPUs",
    "standardNDSH200v5Family": "Standard NDSH200v5 Family vCPUs",
    "standardNDtwinFamily": "Standard NDtwin Family vCPUs (the twin's own)",
}


def _flag(value: bool) -> str:
    return "True" if value else "False"


def sku_entry(name: str, location: str) -> dict:
    family, vcpus, memory, gpus, rdma, per_core, spot = SIZES[name]
    zones = LOCATIONS[location][name]
    capabilities = [
        ("MaxResourceVolumeMB", "0" if name.endswith("s_v5") else "1048576"),
        ("OSVhdSizeMB", "1047552"),
        ("vCPUs", str(vcpus)),
        ("MemoryPreservingMaintenanceSupported", "False" if gpus else "True"),
        ("HyperVGenerations", "V2" if gpus or rdma else "V1,V2"),
        ("MemoryGB", f"{memory:g}"),
        ("MaxDataDiskCount", "32"),
        ("CpuArchitectureType", "x64"),
        ("LowPriorityCapable", _flag(spot)),
        ("PremiumIO", "True"),
        ("VMDeploymentTypes", "IaaS"),
        ("vCPUsAvailable", str(vcpus)),
        ("vCPUsPerCore", str(per_core)),
        ("EphemeralOSDiskSupported", "True"),
        ("AcceleratedNetworkingEnabled", "True"),
        ("RdmaEnabled", _flag(rdma)),
        ("MaxNetworkInterfaces", "8" if vcpus >= 8 else "2"),
    ]
    overrides = CAPABILITY_OVERRIDES.get(name, {})
    capabilities = [(key, overrides.get(key, value)) for key, value in capabilities]
    if gpus:
        capabilities.insert(5, ("GPUs", str(gpus)))
    restrictions = []
    restricted = ZONE_RESTRICTIONS.get((location, name))
    if restricted:
        restrictions.append(
            {
                "type": "Zone",
                "values": [location],
                "restrictionInfo": {"locations": [location], "zones": restricted},
                "reasonCode": "NotAvailableForSubscription",
            }
        )
    return {
        "resourceType": "virtualMachines",
        "name": name,
        "tier": "Standard",
        "size": name.removeprefix("Standard_"),
        "family": family,
        "locations": [location],
        "locationInfo": [{"location": location, "zones": list(zones), "zoneDetails": []}],
        "capabilities": [{"name": key, "value": value} for key, value in capabilities],
        "restrictions": restrictions,
    }


def catalogue(location: str | None = None) -> list[dict]:
    """Every (size, location) entry, as ResourceSkus_List returns them, optionally for one location."""
    return [
        sku_entry(name, loc)
        for loc, sizes in LOCATIONS.items()
        if location is None or loc == location.lower()
        for name in sizes
    ]


def lookup(name: str, location: str) -> dict | None:
    """A size in a location (case-insensitive, as Azure treats VM size names), or None."""
    for size in LOCATIONS.get(location.lower(), {}):
        if size.lower() == name.lower():
            return sku_entry(size, location.lower())
    return None


def capability(entry: dict, key: str) -> str | None:
    return next((c["value"] for c in entry["capabilities"] if c["name"] == key), None)
