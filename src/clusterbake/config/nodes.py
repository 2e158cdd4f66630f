"""The head, the node groups and the partitions."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from clusterbake.config.base import Name, Strict, check_cidrs

AWS_INSTANCE_TYPE_PATTERN = r"^[a-z0-9-]+\.[a-z0-9-]+$"
# Azure VM sizes: Standard_ND96isr_H100_v5, Standard_D4s_v5, ... (case-insensitive in Azure).
AZURE_VM_SIZE_PATTERN = r"^(Standard|Basic)_[A-Za-z0-9_]+$"
INSTANCE_TYPE_PATTERN = f"({AWS_INSTANCE_TYPE_PATTERN})|({AZURE_VM_SIZE_PATTERN})"
# Sizing keys that only the local provider reads: on AWS the instance type decides them.
LOCAL_SIZING_KEYS = ("cpus", "memory_mb", "sockets", "threads_per_core", "gpus", "gpu_type")
# Keys of a node section (head, node_groups.N) that only some providers take, and what to say on
# another: (the providers, the message; {provider}, {source} and {instance_type} filled in). The
# local provider takes the clouds' fabric keys as feature switches.
_SIZING_MESSAGE = (
    "only for provider local; on {provider} CPUs, sockets and memory come from the {source} ({instance_type}); "
    "remove it"
)
PROVIDER_ONLY_KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "infiniband": (("azure", "local"), "only for provider azure (on aws: efa); remove it"),
    "efa": (("aws", "local"), "aws's EFA; Azure's fabric is InfiniBand: use infiniband; remove it"),
    "capacity_reservation_id": (("aws", "local"), "aws capacity reservations; remove it"),
    **{key: (("local",), _SIZING_MESSAGE) for key in LOCAL_SIZING_KEYS},
}
MAX_PLACEHOLDER_GPUS = 16
MAX_GROUP_NODES = 4096


class NodeSize(Strict):
    """How big a node is: told to Slurm on the local provider, an instance type on clouds."""

    cpus: int = Field(2, ge=1, description="Local provider: Slurm CPUs (at most the host's CPUs).")
    memory_mb: int = Field(2048, ge=256, description="Local provider: Slurm RealMemory in MiB.")
    instance_type: str | None = Field(
        None,
        pattern=INSTANCE_TYPE_PATTERN,
        description="Cloud providers: the VM size (required with provider aws, e.g. m7i.2xlarge, p5.48xlarge; "
        "and with provider azure, e.g. Standard_D4s_v5, Standard_ND96isr_H100_v5).",
    )


# Heads a cluster may have: the primary controller `head` and a backup `head-2` (Slurm's SlurmctldHost list).
MAX_HEADS = 2
HEAD_NAME = "head"


class HeadConfig(NodeSize):
    count: int = Field(
        1,
        ge=1,
        le=MAX_HEADS,
        description="Heads: 2 adds a backup controller `head-2` (a second slurmctld, StateSaveLocation on "
        "storage both heads see) that takes over when the primary `head` stops answering (SlurmctldTimeout); "
        "local provider only so far.",
    )

    controller_timeout: int = Field(
        120,
        ge=5,
        le=3600,
        description="Seconds slurmctld may stop answering before a backup controller takes control "
        "(SlurmctldTimeout; Slurm's default 120).",
    )

    def node_names(self) -> list[str]:
        """head, then head-2 (the backup controller)."""
        return [HEAD_NAME] + [f"{HEAD_NAME}-{i}" for i in range(2, self.count + 1)]


# Login nodes a cluster may have (login-1 .. login-16), and their names' stem (their group's name).
MAX_LOGIN_NODES = 16
LOGIN_GROUP = "login"


class LoginNodes(NodeSize):
    """Nodes users log in to (login-1, login-2, ...): Slurm's client commands, the training environment
    and the shared file systems, no daemon of Slurm's. With them the head is the operators' only."""

    count: int = Field(1, ge=1, le=MAX_LOGIN_NODES, description="How many login nodes (login-1, login-2, ...).")
    ssh_cidrs: list[str] = Field(
        default_factory=list,
        description="Clouds: the users' networks, allowed to reach SSH on the login nodes only (their own "
        "security group or NSG rules); the operators' aws.ssh_cidrs / azure.ssh_cidrs reach every node.",
    )

    @field_validator("ssh_cidrs")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        return check_cidrs(values)

    def node_names(self) -> list[str]:
        """login-1, login-2, ..."""
        return [f"{LOGIN_GROUP}-{i}" for i in range(1, self.count + 1)]


class NodeGroup(NodeSize):
    name: Name = Field(description="Group name; nodes are <name>-1, <name>-2, ...")
    count: int | None = Field(
        None, ge=0, description="Nodes that always run (static); or give min_count/max_count for an elastic group."
    )
    min_count: int | None = Field(None, ge=0, description="Elastic group: nodes that always run (default 0).")
    max_count: int | None = Field(
        None,
        ge=0,
        le=MAX_GROUP_NODES,
        description="Elastic group: the most nodes; those beyond min_count are powered up for queued jobs "
        "and powered down after idle_time.",
    )
    idle_time: int = Field(
        600, ge=1, description="Elastic group: seconds a node stays idle before it is powered down (SuspendTime)."
    )
    sockets: int = Field(1, ge=1, description="Local provider: Slurm Sockets; cores per socket follow from cpus.")
    threads_per_core: int = Field(1, ge=1, description="Local provider: Slurm ThreadsPerCore.")
    gpus: int = Field(
        0,
        ge=0,
        le=MAX_PLACEHOLDER_GPUS,
        description="Local provider: placeholder GPUs per node (character devices /dev/nvidia0.., GRES gpu, "
        "gres.conf), NOT real GPUs: they let scheduling, GRES and the job templates run for real.",
    )
    gpu_type: Name = Field("placeholder", description="Local provider: the GRES type of the placeholder GPUs.")
    features: list[Name] = Field(default_factory=list, description="Slurm features and inventory groups.")
    gres: list[str] = Field(
        default_factory=list,
        description="Slurm Gres entries, e.g. gpu:h100:8 (aws: default from the instance type's GPUs).",
    )
    efa: bool = Field(False, description="aws: one EFA interface per network card; the type must support EFA.")
    spot: bool = Field(
        False, description="aws: spot instances instead of on-demand; azure: Spot VMs (eviction policy Delete)."
    )
    infiniband: bool | None = Field(
        None,
        description="azure: the group's VMs share one InfiniBand fabric (one availability set per group: Flexible "
        "scale sets do not support InfiniBand); the size must be RDMA-capable (RdmaEnabled: "
        "Standard_ND96isr_H100_v5, Standard_HB120rs_v3, ...). Default: true on RDMA sizes.",
    )
    capacity_reservation_id: str | None = Field(
        None,
        pattern=r"^cr-[0-9a-f]{8,17}$",
        description="aws: launch into this capacity reservation (cr-...): an On-Demand Capacity Reservation or a "
        "Capacity Block (checked with DescribeCapacityReservations before anything is created: active, the "
        "group's instance type and the subnet's zone, room for the group; a block's nodes launch with market type "
        "capacity-block, outside any placement group of ours, in a static group, and Slurm keeps jobs off them "
        "from 30 minutes before the block ends, when EC2 starts terminating its instances).",
    )
    placement_group: bool | Annotated[str, Field(pattern=r"^[A-Za-z0-9._:/+=@-]+$", max_length=255)] | None = Field(
        None,
        description="aws: a cluster placement group for the group: true (clusterbake-<cluster>-<group>, created "
        "and deleted with the cluster), false, or the name of an existing cluster placement group, used as it is "
        "and never changed or deleted (the one an On-Demand Capacity Reservation is in: a reservation matches "
        "instances by their placement group too). Default: true when efa, false with a capacity_reservation_id "
        "(name the reservation's group to use one). azure: a proximity placement group for the group (true or "
        "false); default: true.",
    )
    instance_types: list[Annotated[str, Field(pattern=INSTANCE_TYPE_PATTERN)]] | None = Field(
        None,
        min_length=1,
        description="Clouds: instead of instance_type, instance types (aws) or VM sizes (azure) in order of "
        "preference. The first is the primary: the Slurm spec and `cluster up` use it; when the cloud has no "
        "capacity for it (or for the ones before), a node Slurm powers up is launched as the next one (elastic "
        "groups). Each other one must have the primary's vCPUs and at least its memory and GPUs.",
    )

    @model_validator(mode="before")
    @classmethod
    def _primary_instance_type(cls, data):
        """instance_types: [a, b] stands for instance_type a, with b as a fallback."""
        if not isinstance(data, dict) or not isinstance(types := data.get("instance_types"), list) or not types:
            return data
        if data.get("instance_type") is None:
            return {**data, "instance_type": types[0]}
        if data["instance_type"] != types[0]:
            raise ValueError(
                "instance_types: give instance_type or instance_types (its first is the primary), not both"
            )
        return data

    @field_validator("instance_types")
    @classmethod
    def _distinct_types(cls, values: list[str] | None) -> list[str] | None:
        if values is not None and len(set(values)) != len(values):
            raise ValueError("each instance type only once")
        return values

    @property
    def types(self) -> list[str]:
        """The instance types to launch, the primary first (clouds)."""
        if self.instance_types:
            return list(self.instance_types)
        return [self.instance_type] if self.instance_type else []

    @property
    def wants_placement_group(self) -> bool:
        """aws: the group's instances launch into a cluster placement group (its own, or an existing one)."""
        if self.placement_group is None:
            # A new group of our own cannot hold a capacity reservation made before it (EC2 user guide,
            # "Placement group rules and limitations"; hardware review item 15).
            return self.efa and not self.capacity_reservation_id
        return self.placement_group is not False

    @property
    def existing_placement_group(self) -> str | None:
        """aws: the name of an existing cluster placement group to launch into (placement_group: <name>)."""
        return self.placement_group if isinstance(self.placement_group, str) else None

    @property
    def static_count(self) -> int:
        """Nodes that always run."""
        return self.count if self.count is not None else (self.min_count or 0)

    @property
    def max_nodes(self) -> int:
        """Every node the group may have: static ones first, then elastic ones."""
        return self.count if self.count is not None else max(self.max_count or 0, self.static_count)

    @property
    def elastic(self) -> bool:
        return self.max_nodes > self.static_count

    def node_names(self) -> list[str]:
        """<name>-1 .. <name>-<max_nodes>: the static nodes, then the elastic ones."""
        return [f"{self.name}-{i}" for i in range(1, self.max_nodes + 1)]

    @model_validator(mode="after")
    def _count_or_range(self) -> NodeGroup:
        if self.count is not None and (self.min_count is not None or self.max_count is not None):
            raise ValueError("count: give count (static) or min_count/max_count (elastic), not both")
        if self.count is None and self.max_count is None:
            raise ValueError("count: required (or max_count for an elastic group); add count: N")
        if self.count is None and (self.min_count or 0) > (self.max_count or 0):
            raise ValueError(f"min_count: {self.min_count} is more than max_count {self.max_count}")
        return self

    @model_validator(mode="after")
    def _cpus_split_into_sockets(self) -> NodeGroup:
        if self.cpus % (self.sockets * self.threads_per_core):
            raise ValueError(
                f"cpus ({self.cpus}) must be a multiple of sockets x threads_per_core "
                f"({self.sockets} x {self.threads_per_core})"
            )
        return self


# A Slurm time limit (MaxTime, MaxWall): MINUTES, MM:SS, HH:MM:SS, DAYS-HH, DAYS-HH:MM or DAYS-HH:MM:SS.
SLURM_TIME_PATTERN = r"^(\d+-)?\d+(:\d{2}){0,2}$"


class Partition(Strict):
    name: Name = Field(description="Slurm PartitionName.")
    node_groups: list[Name] = Field(min_length=1, description="Node groups whose nodes the partition holds.")
    default: bool = Field(False, description="The default partition (at most one).")
    max_time: str = Field("INFINITE", description="Slurm MaxTime: INFINITE, MINUTES, HH:MM:SS or D-HH:MM:SS.")
    max_nodes: int | None = Field(
        None, ge=1, description="Slurm MaxNodes: the most nodes one job may have here; default: no limit."
    )

    @field_validator("max_time")
    @classmethod
    def _slurm_time(cls, value: str) -> str:
        if value != "INFINITE" and not re.fullmatch(SLURM_TIME_PATTERN, value):
            raise ValueError("use INFINITE, MINUTES, HH:MM:SS or DAYS-HH:MM:SS")
        return value


# An Azure subnet by resource id (azure.subnet_id, an AMLFS file system's subnet).
