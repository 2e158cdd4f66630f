"""From a config to the list of nodes every provider creates: names, roles, Slurm specs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from clusterbake.config import ClusterConfig

HEAD_NAME = "head"
# The feature group of nodes whose GPUs are placeholder devices (config gpus: N).
PLACEHOLDER_GPUS = "placeholder-gpus"  # inventory group placeholder_gpus


@dataclass(frozen=True)
class SlurmNodeSpec:
    cpus: int
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    real_memory: int
    gres: list[str] = field(default_factory=list)
    features: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    role: str  # "head" or "compute"
    nodegroup: str
    slurm: SlurmNodeSpec
    features: tuple[str, ...] = ()


def plan_nodes(config: ClusterConfig) -> list[NodeSpec]:
    """The head first, then each node group's nodes named <group>-<n> (n from 1)."""
    head = config.head
    nodes = [
        NodeSpec(
            name=HEAD_NAME,
            role="head",
            nodegroup="head",
            slurm=SlurmNodeSpec(head.cpus, 1, head.cpus, 1, head.memory_mb),
        )
    ]
    for group in config.node_groups:
        switches = list(group.features)
        gres = list(group.gres)
        if group.gpus:
            # Placeholder GPUs (local provider): scheduled like real ones; the `gpu` group
            # as on clouds, `placeholder_gpus` so that no NVIDIA service is started for them.
            switches = list(dict.fromkeys([*switches, "gpu", PLACEHOLDER_GPUS]))
            gres = gres or [f"gpu:{group.gpu_type}:{group.gpus}"]
        spec = SlurmNodeSpec(
            cpus=group.cpus,
            sockets=group.sockets,
            cores_per_socket=group.cpus // (group.sockets * group.threads_per_core),
            threads_per_core=group.threads_per_core,
            real_memory=group.memory_mb,
            gres=gres,
            features=[group.name, *switches],
        )
        nodes += [
            NodeSpec(f"{group.name}-{i}", "compute", group.name, spec, tuple(switches))
            for i in range(1, group.count + 1)
        ]
    return nodes
