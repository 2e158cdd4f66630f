"""GPU systems by instance type: facts a provider's API does not give.

NVSwitch systems: their GPUs reach each other through NVSwitch chips, and CUDA
cannot initialise them until NVIDIA's fabric manager (nvidia-fabricmanager) has
set the fabric up (NVIDIA Fabric Manager User Guide, "NVSwitch-Based Systems").
Neither EC2's DescribeInstanceTypes nor Azure's resource SKUs say whether a type
has NVSwitch, so this table does. The AWS inventory puts hosts of these types in
group `nvswitch`, whose join bundle runs the fabric manager (role nvidia_driver);
every other GPU type must not run it (it fails to start without NVSwitch).

Exact names, not families: p5.4xlarge (one H100) has no NVSwitch while
p5.48xlarge does. Not listed on purpose: Blackwell HGX systems (p6-b200, p6-b300,
p6e-gb200, Azure ND GB200/GB300) need NVIDIA's NVLink subnet manager besides the
fabric manager, which the image does not carry yet (roles/nvidia_driver/README.md).
"""

from __future__ import annotations

NVSWITCH_INSTANCE_TYPES: dict[str, frozenset[str]] = {
    # HGX A100 8-GPU (p4d, p4de), HGX H100 8-GPU (p5), HGX H200 8-GPU (p5e, p5en).
    "aws": frozenset({"p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"}),
    # ND A100 v4 (40 GB and 80 GB), ND H100 v5, ND H200 v5: 8 GPUs on an HGX board.
    # Azure VM size names are case-insensitive; kept lower-case here.
    "azure": frozenset(
        {
            "standard_nd96asr_v4",
            "standard_nd96amsr_a100_v4",
            "standard_nd96isr_h100_v5",
            "standard_nd96isr_h200_v5",
        }
    ),
}


def has_nvswitch(cloud: str, instance_type: str) -> bool:
    """Whether an instance type (VM size) of `cloud` is an NVSwitch system that needs the fabric manager."""
    return instance_type.lower() in NVSWITCH_INSTANCE_TYPES.get(cloud, frozenset())


# InfiniBand links of Azure's RDMA sizes (Microsoft Learn, each size series' page: "InfiniBand"):
# per VM the ports and the rate each one trains at, Gb/s (NDR 400, HDR 200). The health check
# drains a node with fewer ports, or a port below the rate (a link trained at a lower speed slows
# every collective it is in; hardware review item 17). Keys lower-case, as above.
INFINIBAND_LINKS: dict[str, tuple[int, int]] = {
    "standard_nd96isr_h100_v5": (8, 400),  # ND H100 v5: 8 x 400 Gb/s NVIDIA Quantum-2 CX7
    "standard_nd96isr_h200_v5": (8, 400),  # ND H200 v5: 8 x 400 Gb/s
    "standard_nd96asr_v4": (8, 200),  # ND A100 v4: 8 x 200 Gb/s HDR
    "standard_nd96amsr_a100_v4": (8, 200),  # NDm A100 v4: 8 x 200 Gb/s HDR
}


def infiniband_expectation(vm_size: str) -> dict | None:
    """{ports, min_rate} the health check expects of a VM size, or None when the table has no entry."""
    link = INFINIBAND_LINKS.get(vm_size.lower())
    return {"ports": link[0], "min_rate": link[1]} if link else None
