"""The planned cluster: every node the config allows, with its name, group, address and Slurm spec.

One source of truth for slurm.conf, gres.conf, /etc/hosts, the inventories and the
providers. Every node a group may ever have is planned (static ones first, then
elastic ones), whether it runs or not, so nothing changes in slurm.conf or /etc/hosts
when an elastic node powers up or a spot node is lost.

Pure data and arithmetic: no cloud API, no provider import. A provider hands in what
only it knows: the instance types' shapes (clouds), its address range, and the
addresses it already gave out (each node keeps its address for good, so growing a
group never moves another node).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

from clusterbake.config import HEAD_NAME, LOGIN_GROUP, ClusterConfig, NodeGroup, NodeSize
from clusterbake.errors import ConfigError

# Feature groups a login node takes from the node groups: what users run there before a job does
# (the training environment), never a device's (GPU, fabric) or a storage feature's own mounts.
LOGIN_FEATURES = ("train",)
# The feature group of nodes whose GPUs are placeholder devices (config gpus: N).
PLACEHOLDER_GPUS = "placeholder-gpus"  # inventory group placeholder_gpus
# RealMemory of a cloud node: the kernel and the hypervisor keep some, and slurmd
# drains a node that has less than RealMemory.
MEMORY_FRACTION = 0.95


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
    role: str  # "head", "login" or "compute"
    nodegroup: str
    slurm: SlurmNodeSpec
    features: tuple[str, ...] = ()  # inventory feature groups
    elastic: bool = False  # powered up for jobs, powered down when idle (Slurm State=CLOUD)


@dataclass(frozen=True)
class InstanceShape:
    """What the plan needs of a cloud instance type: its name, CPUs, memory and GPUs (model, count),
    and, from each catalogue's subclass (providers.aws.catalogue.InstanceTypeInfo,
    providers.azure.catalogue.SkuInfo), `efa_supported: bool` and `nvswitch: bool`."""

    name: str
    vcpus: int
    cores: int
    threads_per_core: int
    memory_mib: int
    gpus: tuple[tuple[str, int], ...]


def instance_slurm_spec(shape: InstanceShape, gres: list[str] | None = None, features: Iterable[str] = ()):
    """Slurm spec of an instance type: its vCPUs, one socket of its cores (the APIs give no socket
    count), 95% of its memory, `gpu:<model>:<count>` per GPU model (unless `gres` is given)."""
    return SlurmNodeSpec(
        cpus=shape.vcpus,
        sockets=1,
        cores_per_socket=shape.cores,
        threads_per_core=shape.threads_per_core,
        real_memory=int(shape.memory_mib * MEMORY_FRACTION),
        gres=list([f"gpu:{model}:{count}" for model, count in shape.gpus] if gres is None else gres),
        features=list(dict.fromkeys(features)),
    )


def _local_group_spec(group: NodeGroup) -> tuple[SlurmNodeSpec, list[str]]:
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
    return spec, switches


def _cloud_group_spec(
    group: NodeGroup, shape: InstanceShape, image_features: Iterable[str]
) -> tuple[SlurmNodeSpec, list[str]]:
    efa = group.efa and shape.efa_supported
    switches = list(dict.fromkeys([*group.features, *(["efa"] if efa else []), *(["gpu"] if shape.gpus else [])]))
    spec = instance_slurm_spec(shape, gres=list(group.gres) or None, features=[group.name, *switches, shape.name])
    # Inventory groups only (the instance type already names them in Slurm): NVSwitch types
    # (gpu_systems.py) go in `nvswitch` (their join runs the fabric manager), GPU nodes of an
    # image baked with DCGM in `dcgm` (the host engine runs; the GPU jobs' prolog diagnoses).
    dcgm = bool(shape.gpus) and "dcgm" in image_features
    groups = list(dict.fromkeys([*switches, *(["nvswitch"] if shape.nvswitch else []), *(["dcgm"] if dcgm else [])]))
    return spec, groups


def _service_node_spec(size: NodeSize, shapes: Mapping[str, InstanceShape] | None) -> SlurmNodeSpec:
    """The head's or a login node's size (no Slurm node: for the plan's records and the status)."""
    if shapes is not None and size.instance_type in shapes:
        info = shapes[size.instance_type]
        return instance_slurm_spec(info, features=[info.name])
    return SlurmNodeSpec(size.cpus, 1, size.cpus, 1, size.memory_mb)


def plan_nodes(config: ClusterConfig, shapes: Mapping[str, InstanceShape] | None = None) -> list[NodeSpec]:
    """The heads first (head, and head-2 with a backup controller), then the login nodes `login-<n>`, then
    each node group's nodes `<group>-<n>` (n from 1): its static nodes, then its elastic ones up to
    max_count. With `shapes` (instance type -> shape, clouds) the Slurm specs come from the instance
    types, else from the config's sizing."""
    head_spec = _service_node_spec(config.head, shapes)
    nodes = [NodeSpec(name, "head", HEAD_NAME, head_spec) for name in config.head.node_names()]
    if config.login_nodes is not None:
        wanted = {f for g in config.node_groups for f in g.features}
        features = tuple(f for f in LOGIN_FEATURES if f in wanted)
        spec = _service_node_spec(config.login_nodes, shapes)
        # One group and one join bundle for all of them.
        nodes += [NodeSpec(name, "login", LOGIN_GROUP, spec, features) for name in config.login_nodes.node_names()]
    cloud_image = getattr(config.image, config.provider, None) if config.provider != "local" else None
    image_features = tuple(cloud_image.features) if cloud_image is not None else ()
    for group in config.node_groups:
        if shapes is not None and group.instance_type in shapes:
            spec, switches = _cloud_group_spec(group, shapes[group.instance_type], image_features)
        else:
            spec, switches = _local_group_spec(group)
        nodes += [
            NodeSpec(name, "compute", group.name, spec, tuple(switches), i > group.static_count)
            for i, name in enumerate(group.node_names(), start=1)
        ]
    return nodes


# --- addresses ------------------------------------------------------------------------


def address_pool(cidr: str, *, skip_first: int, from_top: bool = False) -> list[str]:
    """The usable addresses of a subnet for nodes: after the first `skip_first` hosts
    (gateway, the host, reserved ones), bottom up, or top down (`from_top`: clouds, whose
    own allocation starts at the bottom)."""
    hosts = [str(a) for a in ipaddress.ip_network(cidr).hosts()]
    usable = hosts[skip_first:]
    return list(reversed(usable)) if from_top else usable


def assign_addresses(names: list[str], pool: list[str], kept: Mapping[str, str], field: str) -> dict[str, str]:
    """Every planned name an address: the one it was given before, else the first free one of
    the pool, in plan order. Names no longer planned release theirs. `field` names the setting
    that sets the pool, for the error when it is too small."""
    assigned = {name: kept[name] for name in names if kept.get(name) in pool}
    taken = set(assigned.values())
    free = (address for address in pool if address not in taken)
    for name in names:
        if name not in assigned:
            address = next(free, None)
            if address is None:
                raise ConfigError(
                    f"{field}: room for {len(pool)} nodes, the config plans {len(names)}; "
                    "choose a larger subnet or fewer nodes"
                )
            assigned[name] = address
    return {name: assigned[name] for name in names}
