"""What Azure says a VM size is (Resource SKUs, one listing per location) and its Slurm node spec.

Slurm spec of a size (a `plan.InstanceShape`, so that plan.instance_slurm_spec applies):
- CPUs = capability `vCPUs`; ThreadsPerCore = `vCPUsPerCore` (1 on the HPC and ND sizes,
  which expose physical cores); CoresPerSocket = vCPUs / ThreadsPerCore, one socket (the API
  gives no socket count; Standard_ND96isr_H100_v5 has two Sapphire Rapids sockets).
- RealMemory = `MemoryGB` x 1024 MiB less 5%, and at least 1 GiB less (the Azure agent, the
  kernel and the hypervisor keep some; slurmd drains a node with less than RealMemory):
  azure_plan() applies the 1 GiB floor to plan.instance_slurm_spec's 95%.
- Gres = gpu:<model>:<count>: `GPUs` is a count only; the model comes from the size's name
  (GPU_MODELS, Microsoft's size names carry it: _H100_, _A100_, ...), "gpu" where unknown.
- InfiniBand: `RdmaEnabled`. Spot: `LowPriorityCapable`. NVSwitch: clusterbake.gpu_systems.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from clusterbake.config import ClusterConfig
from clusterbake.gpu_systems import has_nvswitch
from clusterbake.plan import MEMORY_FRACTION, InstanceShape, NodeSpec, plan_nodes

MEMORY_FLOOR_MIB = 1024
# Size name -> GPU model (Gres type). Microsoft's sizes name the GPU; ND A100 v4 (ND96asr_v4) does not.
GPU_MODELS = (
    (re.compile(r"_H100_", re.I), "h100"),
    (re.compile(r"_H200_", re.I), "h200"),
    (re.compile(r"_A100_|^Standard_ND96asr_v4$", re.I), "a100"),
    (re.compile(r"_A10_", re.I), "a10"),
    (re.compile(r"_T4_", re.I), "t4"),
    (re.compile(r"^Standard_NC\d+s_v3$", re.I), "v100"),
    (re.compile(r"_MI300X_", re.I), "mi300x"),
)
IB_FEATURE = "ib"


def gpu_model(size: str) -> str:
    return next((model for pattern, model in GPU_MODELS if pattern.search(size)), "gpu")


@dataclass(frozen=True)
class SkuInfo(InstanceShape):
    family: str
    rdma: bool
    low_priority: bool
    zones: tuple[str, ...]
    restricted_zones: tuple[str, ...]
    location_restriction: str | None  # reasonCode of a Location restriction
    efa_supported: bool = False  # plan.InstanceShape: an AWS notion
    accelerated_networking: bool = True  # AcceleratedNetworkingEnabled
    premium_io: bool = True  # PremiumIO: premium SSD disks
    generations: tuple[str, ...] = ("V1", "V2")  # HyperVGenerations: the images it boots

    @classmethod
    def from_api(cls, sku) -> SkuInfo:
        caps = {c.name: c.value for c in sku.capabilities or []}
        vcpus = int(caps.get("vCPUs", "0"))
        per_core = int(caps.get("vCPUsPerCore", "1") or 1)
        gpus = int(caps.get("GPUs", "0") or 0)
        zones: tuple[str, ...] = ()
        for info in sku.location_info or []:
            zones += tuple(info.zones or ())
        restricted: tuple[str, ...] = ()
        location_restriction = None
        for restriction in sku.restrictions or []:
            if restriction.type == "Zone":
                restricted += tuple(
                    (restriction.restriction_info.zones if restriction.restriction_info else None) or ()
                )
            elif restriction.type == "Location":
                location_restriction = restriction.reason_code or "restricted"
        return cls(
            name=sku.name,
            vcpus=vcpus,
            cores=vcpus // per_core,
            threads_per_core=per_core,
            memory_mib=int(float(caps.get("MemoryGB", "0")) * 1024),
            gpus=((gpu_model(sku.name), gpus),) if gpus else (),
            family=sku.family or "",
            rdma=caps.get("RdmaEnabled") == "True",
            low_priority=caps.get("LowPriorityCapable") == "True",
            zones=tuple(sorted(set(zones))),
            restricted_zones=tuple(sorted(set(restricted))),
            location_restriction=location_restriction,
            accelerated_networking=caps.get("AcceleratedNetworkingEnabled") == "True",
            premium_io=caps.get("PremiumIO") == "True",
            generations=tuple(g.strip() for g in caps.get("HyperVGenerations", "V1").split(",") if g.strip()),
        )

    @property
    def nvswitch(self) -> bool:
        return has_nvswitch("azure", self.name)

    def offered_in_zone(self, zone: str) -> bool:
        return zone in self.zones and zone not in self.restricted_zones


class Catalogue:
    """ResourceSkus of one location (virtual machine sizes), listed once per process."""

    def __init__(self, compute, location: str, known: list[SkuInfo] | None = None):
        self._compute = compute
        self.location = location
        self._sizes: dict[str, SkuInfo] | None = {s.name.lower(): s for s in known} if known is not None else None

    @property
    def sizes(self) -> dict[str, SkuInfo]:
        if self._sizes is None:
            self._sizes = {}
            for sku in self._compute.resource_skus.list(filter=f"location eq '{self.location}'"):
                if sku.resource_type == "virtualMachines":
                    self._sizes[sku.name.lower()] = SkuInfo.from_api(sku)
        return self._sizes

    def get(self, name: str) -> SkuInfo | None:
        return self.sizes.get(name.lower())

    def shapes(self, names) -> dict[str, SkuInfo]:
        return {name: self.sizes[name.lower()] for name in names if name.lower() in self.sizes}


def real_memory(memory_mib: int) -> int:
    """95% of the memory, and at least 1 GiB less than all of it."""
    return min(int(memory_mib * MEMORY_FRACTION), memory_mib - MEMORY_FLOOR_MIB)


def uses_infiniband(group, info: SkuInfo | None) -> bool:
    """A group's VMs share one InfiniBand fabric: infiniband: true, or unset on an RDMA size."""
    if info is None or not info.rdma:
        return False
    return group.infiniband is not False


def azure_plan(config: ClusterConfig, shapes: dict[str, SkuInfo]) -> list[NodeSpec]:
    """plan.plan_nodes with the sizes' shapes, the Azure memory floor, and the `ib` feature group
    (nodes of a group on one InfiniBand fabric)."""
    groups = {g.name: g for g in config.node_groups}
    nodes = []
    for node in plan_nodes(config, shapes=shapes):
        size = config.node_size(node.role, node.nodegroup).instance_type
        info = shapes.get(size)
        if info is None:
            nodes.append(node)
            continue
        slurm = dataclasses.replace(node.slurm, real_memory=real_memory(info.memory_mib))
        features = node.features
        if node.role == "compute" and uses_infiniband(groups[node.nodegroup], info):
            features = tuple(dict.fromkeys([*features, IB_FEATURE]))
            if IB_FEATURE not in slurm.features:  # before the size's own name, as aws puts efa
                slurm = dataclasses.replace(slurm, features=[*slurm.features[:-1], IB_FEATURE, *slurm.features[-1:]])
        nodes.append(dataclasses.replace(node, slurm=slurm, features=features))
    return nodes


def node_hardware(infos: dict[str, SkuInfo], sizes: list[str]) -> dict[str, bool]:
    """What a NIC and an OS disk serving any of `sizes` (a group's, fallbacks included) may use: accelerated
    networking and premium storage only where every size has them (ARM refuses a VM otherwise)."""
    shapes = [infos[size] for size in sizes if size in infos]
    return {
        "accelerated_networking": all(s.accelerated_networking for s in shapes),
        "premium_disk": all(s.premium_io for s in shapes),
    }
