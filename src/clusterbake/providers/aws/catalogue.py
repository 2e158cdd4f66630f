"""What EC2 says an instance type is (DescribeInstanceTypes, cached) and its Slurm node spec.

Slurm spec of a type:
- CPUs = VCpuInfo.DefaultVCpus, ThreadsPerCore = VCpuInfo.DefaultThreadsPerCore.
- Sockets = 1 and CoresPerSocket = VCpuInfo.DefaultCores. The API has no socket
  count (p5.48xlarge has two AMD EPYC sockets, 2 x 48 cores, but EC2 reports only
  96 cores); ValidCores lists the core counts one may pick at launch, not sockets.
  One socket keeps Sockets x CoresPerSocket x ThreadsPerCore = CPUs exact. slurmd
  on the real machine sees 2 sockets and notes the difference ("Node reconfigured
  socket/core boundaries", PLATFORM.md); that was not tried on a real p5 here.
  Where per-socket binding matters, take the layout from `slurmd -C` on a booted
  node (a later step) instead of the API.
- RealMemory = 95% of MemoryInfo.SizeInMiB (rounded down): the kernel and the
  hypervisor keep some, and slurmd drains a node that has less than RealMemory.
- Gres = gpu:<model>:<count> per GpuInfo entry, the model lower-case with runs of
  other characters than a-z0-9 as `_` (H100 -> h100, "Radeon Pro V520" -> radeon_pro_v520).

Network cards: NetworkInfo.NetworkCards[].InterfaceTypes says which interface types
each card takes (`interface`, `efa`, `efa-only`); resources.network_interfaces lays
the EFA interfaces out from it. NVSwitch (fabric manager) is not in the API: see
clusterbake.gpu_systems.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from clusterbake.gpu_systems import has_nvswitch
from clusterbake.plan import InstanceShape, SlurmNodeSpec, instance_slurm_spec
from clusterbake.providers.aws.api import paginate

BATCH = 100  # DescribeInstanceTypes takes at most 100 names per call
# A card of an EFA type whose entry lacks InterfaceTypes (older API answers): every
# EFA type of today takes all three on its EFA cards.
EFA_CARD_TYPES = ("interface", "efa", "efa-only")


@dataclass(frozen=True)
class InstanceTypeInfo(InstanceShape):
    efa_supported: bool
    max_efa_interfaces: int
    network_cards: int
    usage_classes: tuple[str, ...]
    architectures: tuple[str, ...]
    placement_strategies: tuple[str, ...]
    # Per network card, by NetworkCardIndex: the interface types it takes.
    card_interface_types: tuple[tuple[str, ...], ...] = ()

    @classmethod
    def from_api(cls, data: dict) -> InstanceTypeInfo:
        vcpu = data["VCpuInfo"]
        network = data.get("NetworkInfo", {})
        gpus: dict[str, int] = {}
        for gpu in data.get("GpuInfo", {}).get("Gpus", []):
            model = re.sub(r"[^a-z0-9]+", "_", gpu["Name"].lower()).strip("_")
            gpus[model] = gpus.get(model, 0) + gpu["Count"]
        threads = vcpu.get("DefaultThreadsPerCore", 1)
        efa = bool(network.get("EfaSupported"))
        cards = {c["NetworkCardIndex"]: c for c in network.get("NetworkCards", [])}
        card_types = tuple(
            tuple(cards.get(index, {}).get("InterfaceTypes") or (EFA_CARD_TYPES if efa else ("interface",)))
            for index in range(network.get("MaximumNetworkCards", 1))
        )
        return cls(
            name=data["InstanceType"],
            vcpus=vcpu["DefaultVCpus"],
            cores=vcpu.get("DefaultCores", vcpu["DefaultVCpus"] // threads),
            threads_per_core=threads,
            memory_mib=data["MemoryInfo"]["SizeInMiB"],
            gpus=tuple(gpus.items()),
            efa_supported=efa,
            max_efa_interfaces=network.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0),
            network_cards=network.get("MaximumNetworkCards", 1),
            usage_classes=tuple(data.get("SupportedUsageClasses", [])),
            architectures=tuple(data.get("ProcessorInfo", {}).get("SupportedArchitectures", [])),
            placement_strategies=tuple(data.get("PlacementGroupInfo", {}).get("SupportedStrategies", [])),
            card_interface_types=card_types,
        )

    @property
    def efa_cards(self) -> list[int]:
        """The network cards that get an EFA-only interface: those that take one, in index
        order, as many as MaximumEfaInterfaces (p5.48xlarge: cards 0-31, p4d.24xlarge: 0-3)."""
        if not self.efa_supported:
            return []
        types = self.card_interface_types or ((EFA_CARD_TYPES,) * self.network_cards)
        cards = [index for index, kinds in enumerate(types) if "efa-only" in kinds]
        return cards[: self.max_efa_interfaces or len(cards)]

    @property
    def efa_interfaces(self) -> int:
        """How many EFA interfaces the launch template gives an EFA node (p5.48xlarge: 32)."""
        return len(self.efa_cards)

    @property
    def nvswitch(self) -> bool:
        """An NVSwitch system: the fabric manager must run (clusterbake.gpu_systems)."""
        return has_nvswitch("aws", self.name)

    @property
    def gres(self) -> list[str]:
        return [f"gpu:{model}:{count}" for model, count in self.gpus]

    def slurm_spec(self, gres: list[str] | None = None, features: Iterable[str] = ()) -> SlurmNodeSpec:
        return instance_slurm_spec(self, gres, features)


class Catalogue:
    """DescribeInstanceTypes, asked once per type and process."""

    def __init__(self, client=None, known: Iterable[dict] = ()):
        self._client = client
        self._types: dict[str, InstanceTypeInfo] = {}
        for data in known:
            self._types[data["InstanceType"]] = InstanceTypeInfo.from_api(data)

    @classmethod
    def from_response(cls, response: dict) -> Catalogue:
        """Offline: from a saved DescribeInstanceTypes response."""
        return cls(None, response["InstanceTypes"])

    def get(self, names: Iterable[str]) -> dict[str, InstanceTypeInfo]:
        wanted = sorted(set(names))
        missing = [n for n in wanted if n not in self._types]
        if missing and self._client is None:
            raise KeyError(f"instance types not in the saved catalogue: {', '.join(missing)}")
        for start in range(0, len(missing), BATCH):
            for data in paginate(
                self._client, "describe_instance_types", "InstanceTypes", InstanceTypes=missing[start : start + BATCH]
            ):
                self._types[data["InstanceType"]] = InstanceTypeInfo.from_api(data)
        return {name: self._types[name] for name in wanted if name in self._types}

    def __getitem__(self, name: str) -> InstanceTypeInfo:
        return self.get([name])[name]
