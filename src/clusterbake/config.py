"""The cluster config file: a typed schema with every default in this one place.

A config is loaded once, validated completely, and only then does anything get
created. Errors name the file, the field path and what to do about it.
"""

from __future__ import annotations

import ipaddress
import re
from glob import glob
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from clusterbake.errors import ConfigError

DEFAULT_CONFIG = "clusterbake.yaml"

# Names end up in hostnames, Slurm node names and network device names.
NAME_PATTERN = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=24)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# The image base when the config names none. AWS: Ubuntu 24.04 (Slurm 23.11, which has the
# cgroup/v2 plugin that Ubuntu's cgroup-v2-only boot needs; see SLURM_PLUGIN_DEFAULTS).
DEFAULT_IMAGE_BASE = {"local": "debian-12", "aws": "ubuntu-24.04", "azure": "ubuntu-24.04"}


# --- Image build settings of the clouds (clusterbake.images.aws, clusterbake.images.azure) ---------
# The build VM, where it runs and what it starts from: every default of a cloud image
# build is here. Empty (None) values fall back to the cluster's own cloud section.

# Feature groups of the cloud GPU images, before the node groups' own features (the
# builder joins all: each switches a role of ansible/image.yml on).
AWS_IMAGE_FEATURES = ("aws", "cuda", "nvswitch", "efa", "dcgm", "lustre", "s3")
AZURE_IMAGE_FEATURES = ("azure", "cuda", "nvswitch", "dcgm", "doca_ofed", "amlfs", "blobfuse2")
# Canonical's Gen2 marketplace images (publisher:offer:sku:version) per image base.
AZURE_SOURCE_IMAGES = {
    "ubuntu-24.04": "Canonical:ubuntu-24_04-lts:server:latest",
    "ubuntu-22.04": "Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest",
}
_GUID = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_RESOURCE_GROUP = r"^[-\w.()]{0,89}[-\w()]$"


def build_vm_field(default: str, pattern: str, noun: str, kind: str):
    """image.<cloud>'s machine type of the build VM (`noun`: "Instance type"; `kind`: "type")."""
    return Field(
        default,
        pattern=pattern,
        description=f"{noun} of the build VM; a GPU {kind} (driver, DCGM and NCCL are checked on it) unless "
        "validate_gpu is false.",
    )


def build_features_field(defaults: tuple[str, ...]):
    """image.<cloud>.features, by default `defaults`."""
    return Field(
        default_factory=lambda: list(defaults),
        description="Feature groups of the build VM (roles of ansible/image.yml), besides the node groups' features.",
    )


class AwsImageBuild(Strict):
    """image.aws: how `clusterbake image build` bakes the AMI (Packer amazon-ebs)."""

    region: str | None = Field(
        None, pattern=r"^[a-z]{2}(-[a-z]+)+-\d+$", description="Region of the build and the AMI; default: aws.region."
    )
    builder_instance_type: str = build_vm_field("g5.xlarge", r"^[a-z0-9-]+\.[a-z0-9-]+$", "Instance type", "type")
    subnet_id: str | None = Field(
        None, pattern=r"^subnet-[0-9a-f]{8,17}$", description="Subnet of the build VM; default: aws.subnet_id."
    )
    ssh_interface: Literal["public_ip", "private_ip", "public_dns", "private_dns"] = Field(
        "public_ip", description="How Packer and Ansible reach the build VM (private_ip inside a VPN)."
    )
    volume_size_gb: int = Field(100, ge=20, le=16384, description="Root volume (and AMI snapshot) size in GiB.")
    volume_encrypted: bool = Field(True, description="Encrypt the root volume, hence the AMI's snapshot.")
    kms_key_id: str = Field("", description="KMS key of the encrypted volume; empty: the account's EBS key.")
    features: list[str] = build_features_field(AWS_IMAGE_FEATURES)
    validate_gpu: bool = Field(True, description="Check the GPU stack on the build VM (it has an NVIDIA GPU).")
    validate_efa: bool = Field(False, description="Check EFA on the build VM (an EFA type launched with one).")


class AzureImageBuild(Strict):
    """image.azure: how `clusterbake image build` bakes the managed image (Packer azure-arm)."""

    subscription_id: str | None = Field(None, pattern=_GUID, description="Default: azure.subscription_id.")
    location: str | None = Field(
        None, pattern=r"^[a-z][a-z0-9]+$", description="Region of the build VM and the image; default: azure.location."
    )
    resource_group: str | None = Field(
        None,
        pattern=_RESOURCE_GROUP,
        description="Existing resource group the managed image is stored in; default: azure.resource_group.",
    )
    build_resource_group: str | None = Field(
        None,
        pattern=_RESOURCE_GROUP,
        description="Existing resource group for the build VM; default: Packer creates a temporary one.",
    )
    vm_size: str = build_vm_field("Standard_NC4as_T4_v3", r"^(Standard|Basic)_[A-Za-z0-9_]+$", "VM size", "size")
    source_image: str | None = Field(
        None,
        pattern=r"^[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+$",
        description="Marketplace image publisher:offer:sku:version the build starts from; default by image.base: "
        + ", ".join(f"{base} {urn}" for base, urn in AZURE_SOURCE_IMAGES.items())
        + ".",
    )
    os_disk_size_gb: int = Field(100, ge=30, le=4095, description="OS disk (and image) size in GiB.")
    subnet_id: str | None = Field(
        None,
        pattern=r"^/subscriptions/[0-9a-fA-F-]{36}/resourceGroups/[-\w.()]+/providers/Microsoft\.Network/"
        r"virtualNetworks/[A-Za-z0-9_.-]+/subnets/[A-Za-z0-9_.-]+$",
        description="Existing subnet of the build VM (reached on its private IP); default: a temporary network, "
        "the build VM reached on a public IP.",
    )
    gallery_name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.]{0,78}[A-Za-z0-9]$",
        description="Azure Compute Gallery to publish a version of the image to as well (nodes then boot that "
        "version); default: the managed image only.",
    )
    gallery_resource_group: str | None = Field(
        None, pattern=_RESOURCE_GROUP, description="Resource group of gallery_name; default: resource_group."
    )
    gallery_image_name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,78}[A-Za-z0-9]$",
        description="Existing image definition (Linux, generalized, Gen2) in gallery_name; default: "
        "clusterbake-<image.base>.",
    )
    gallery_replication_regions: list[str] = Field(
        default_factory=list, description="Regions the gallery version is replicated to besides location."
    )
    auth: Literal["cli", "service_principal", "managed_identity"] = Field(
        "cli",
        description="How Packer signs in: cli (the `az login` user), service_principal (client_id, and the secret "
        "in $AZURE_CLIENT_SECRET, never in this file) or managed_identity (of the machine running clusterbake).",
    )
    client_id: str | None = Field(
        None, pattern=_GUID, description="Service principal (app id) of auth service_principal."
    )
    tenant_id: str | None = Field(None, pattern=_GUID, description="Tenant of client_id; default: the subscription's.")
    features: list[str] = build_features_field(AZURE_IMAGE_FEATURES)
    validate_gpu: bool = Field(True, description="Check the GPU stack on the build VM (it has an NVIDIA GPU).")
    validate_ib: bool = Field(
        False, description="Require InfiniBand ports up on the build VM (an RDMA size, e.g. Standard_ND96isr_H100_v5)."
    )

    @model_validator(mode="after")
    def _auth(self) -> AzureImageBuild:
        if self.auth == "service_principal" and not self.client_id:
            raise ValueError("client_id: required with auth service_principal (its secret: $AZURE_CLIENT_SECRET)")
        if self.auth != "service_principal" and (self.client_id or self.tenant_id):
            raise ValueError(f"client_id: only with auth service_principal (auth is {self.auth}); remove it")
        return self


# --- end of the image build settings ----------------------------------------------------------------


class ImageConfig(Strict):
    base: Literal["debian-12", "ubuntu-22.04", "ubuntu-24.04"] = Field(
        DEFAULT_IMAGE_BASE["local"],
        description="Base distribution; default per provider: local debian-12 (the only one it builds), aws "
        "ubuntu-24.04 (Slurm 23.11, cgroup v2). ubuntu-22.04's Slurm 21.08 has no cgroup v2 support: its clusters "
        "run Slurm without cgroup plugins (no cgroup enforcement of cores, memory or GPUs).",
    )
    extra_ca_certificates: list[str] = Field(
        default_factory=list,
        description="PEM files or globs on the build host that the image trusts (corporate TLS proxies).",
    )
    package_pins: dict[str, str] = Field(
        default_factory=dict,
        description="Debian package name -> version glob, written as apt pins before anything is installed.",
    )
    mirror: str = Field("http://deb.debian.org/debian", description="Debian mirror for debootstrap and apt.")
    security_mirror: str = Field("http://deb.debian.org/debian-security", description="Debian security mirror.")
    aws: AwsImageBuild = Field(
        default_factory=AwsImageBuild, description="AWS image build (provider aws): the build VM and the AMI."
    )
    azure: AzureImageBuild = Field(
        default_factory=AzureImageBuild, description="Azure image build (provider azure): the build VM and the image."
    )


AWS_INSTANCE_TYPE_PATTERN = r"^[a-z0-9-]+\.[a-z0-9-]+$"
# Azure VM sizes: Standard_ND96isr_H100_v5, Standard_D4s_v5, ... (case-insensitive in Azure).
AZURE_VM_SIZE_PATTERN = r"^(Standard|Basic)_[A-Za-z0-9_]+$"
INSTANCE_TYPE_PATTERN = f"({AWS_INSTANCE_TYPE_PATTERN})|({AZURE_VM_SIZE_PATTERN})"
# Sizing keys that only the local provider reads: on AWS the instance type decides them.
LOCAL_SIZING_KEYS = ("cpus", "memory_mb", "sockets", "threads_per_core", "gpus", "gpu_type")
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


class HeadConfig(NodeSize):
    pass


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
        description="azure: the group's VMs share one InfiniBand fabric (one VM scale set, Flexible orchestration, "
        "per group); the size must be RDMA-capable (RdmaEnabled: Standard_ND96isr_H100_v5, Standard_HB120rs_v3, "
        "...). Default: true on RDMA sizes.",
    )
    capacity_reservation_id: str | None = Field(
        None, pattern=r"^cr-[0-9a-f]{8,17}$", description="aws: launch into this capacity reservation (cr-...)."
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
SUBNET_ID_PATTERN = (
    r"^/subscriptions/[0-9a-fA-F-]{36}/resourceGroups/[-\w.()]+/providers/Microsoft\.Network/"
    r"virtualNetworks/[A-Za-z0-9_.-]+/subnets/[A-Za-z0-9_.-]+$"
)


class StorageBase(Strict):
    name: Name = Field(description="Names the host directory (local) or the file system (clouds, in its tags).")
    mount_point: str = Field(description="Absolute path on every node (/home included on clouds).")

    @field_validator("mount_point")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or value == "/" or value.endswith("/") or "//" in value:
            raise ValueError("must be an absolute path other than /, e.g. /shared")
        if not re.fullmatch(r"/[A-Za-z0-9._/-]+", value) or "/../" in f"{value}/" or "/./" in f"{value}/":
            raise ValueError("use letters, digits, '.', '_', '-' and '/' only (it goes into units and exports)")
        return value


class HostDirStorage(StorageBase):
    type: Literal["hostdir"] = Field("hostdir", description="local: a host directory bind-mounted on every node.")


class NfsStorage(StorageBase):
    type: Literal["nfs"] = Field(description="aws, azure: exported by the head node from its own disk over NFS.")


FILE_SYSTEM_ID_PATTERN = r"^fs-[0-9a-f]{8,17}$"


class EfsStorage(StorageBase):
    type: Literal["efs"] = Field(description="aws: an Amazon EFS file system (NFS 4.1), a mount target in the subnet.")
    file_system_id: str | None = Field(
        None,
        pattern=FILE_SYSTEM_ID_PATTERN,
        description="Use this existing file system (never created or deleted by clusterbake); default: create one.",
    )
    performance_mode: Literal["generalPurpose", "maxIO"] = Field("generalPurpose", description="EFS PerformanceMode.")
    throughput_mode: Literal["elastic", "bursting"] = Field("elastic", description="EFS ThroughputMode.")
    retain: bool = Field(False, description="Keep the file system (and its data) on `cluster down`.")


FSX_SCRATCH_CAPACITIES = "1200, 2400 or a multiple of 2400"


class FsxLustreStorage(StorageBase):
    type: Literal["fsx_lustre"] = Field(description="aws: an FSx for Lustre file system, optionally linked to S3.")
    file_system_id: str | None = Field(
        None,
        pattern=FILE_SYSTEM_ID_PATTERN,
        description="Use this existing file system (never created or deleted by clusterbake); default: create one.",
    )
    deployment_type: Literal["SCRATCH_2", "PERSISTENT_2"] = Field(
        "SCRATCH_2", description="SCRATCH_2 (no replication, cheapest) or PERSISTENT_2 (replicated, long-lived)."
    )
    storage_capacity_gib: int = Field(1200, ge=1200, description=f"GiB: {FSX_SCRATCH_CAPACITIES}.")
    throughput_per_tib: Literal[125, 250, 500, 1000] | None = Field(
        None, description="PERSISTENT_2 only (required there): MB/s per TiB of storage."
    )
    s3_path: str | None = Field(
        None,
        pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$",
        description="s3://bucket[/prefix] linked as a data repository: imported on creation, changes exported.",
    )
    retain: bool = Field(False, description="Keep the file system (and its data) on `cluster down`.")

    @model_validator(mode="after")
    def _capacity_and_throughput(self) -> FsxLustreStorage:
        capacity = self.storage_capacity_gib
        if capacity not in (1200, 2400) and capacity % 2400:
            raise ValueError(f"storage_capacity_gib: {capacity} is not {FSX_SCRATCH_CAPACITIES}")
        if self.deployment_type == "PERSISTENT_2" and self.throughput_per_tib is None:
            raise ValueError("throughput_per_tib: required with deployment_type PERSISTENT_2 (125, 250, 500, 1000)")
        if self.deployment_type == "SCRATCH_2" and self.throughput_per_tib is not None:
            raise ValueError("throughput_per_tib: only for deployment_type PERSISTENT_2; remove it")
        return self


class AzureFilesStorage(StorageBase):
    type: Literal["azure_files"] = Field(
        description="azure: an NFS 4.1 Azure file share (premium FileStorage account, reached through the subnet's "
        "Microsoft.Storage service endpoint)."
    )
    storage_account: str | None = Field(
        None,
        pattern=r"^[a-z0-9]{3,24}$",
        description="Put the share in this existing FileStorage account (the account is never created or deleted by "
        "clusterbake, nor its shares); default: one account per cluster, created and deleted with it.",
    )
    quota_gib: int = Field(
        100, ge=100, le=102400, description="Provisioned size of the share in GiB (premium shares: 100 to 102400)."
    )
    retain: bool = Field(False, description="Keep the storage account (and the share's data) on `cluster down`.")


def zone_as_text(data):
    """`zone: 1` in YAML is an int: Azure's zones are strings ("1")."""
    if isinstance(data, dict) and isinstance(data.get("zone"), int) and not isinstance(data["zone"], bool):
        return {**data, "zone": str(data["zone"])}
    return data


# Azure Managed Lustre SKUs: the smallest file system and the step of its size, in TiB (Microsoft's
# "Create an Azure Managed Lustre file system using Azure Resource Manager templates", SKU table).
AMLFS_SKUS = {
    "AMLFS-Durable-Premium-40": 48,
    "AMLFS-Durable-Premium-125": 16,
    "AMLFS-Durable-Premium-250": 8,
    "AMLFS-Durable-Premium-500": 4,
}
AMLFS_CREATE_KEYS = ("sku", "storage_capacity_tib", "subnet_id", "zone", "maintenance_day", "maintenance_time_utc")
WEEKDAYS = Literal["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


class AmlfsStorage(StorageBase):
    type: Literal["amlfs"] = Field(
        description="azure: an Azure Managed Lustre file system (LNet over TCP), created by clusterbake or existing "
        "(mgs_address)."
    )
    mgs_address: str | None = Field(
        None,
        pattern=r"^(25[0-5]|2[0-4]\d|1?\d?\d)(\.(25[0-5]|2[0-4]\d|1?\d?\d)){3}$",
        description='Use this existing file system: its MGS address (the portal\'s "Client connection"; never '
        "created or deleted by clusterbake); default: create one.",
    )
    fs_name: str = Field(
        "lustrefs", pattern=r"^[A-Za-z0-9_]{1,8}$", description="Lustre file system name (AMLFS's is lustrefs)."
    )
    sku: Literal[tuple(AMLFS_SKUS)] = Field(  # type: ignore[valid-type]
        "AMLFS-Durable-Premium-500", description="A created file system's SKU (throughput per TiB: 40 to 500 MB/s)."
    )
    storage_capacity_tib: int = Field(
        4,
        ge=4,
        description="A created file system's size in TiB: the SKU's minimum or a multiple of it (500: 4, "
        "250: 8, 125: 16, 40: 48).",
    )
    subnet_id: str | None = Field(
        None,
        pattern=SUBNET_ID_PATTERN,
        description="Subnet of a created file system (Microsoft recommends one of its own, sized for the file "
        "system); default: the cluster's subnet.",
    )
    zone: Literal["1", "2", "3"] | None = Field(
        None, description="Availability zone of a created file system (AMLFS needs one); default: azure.zone."
    )
    maintenance_day: WEEKDAYS = Field("Sunday", description="Day of the weekly 30-minute maintenance window.")
    maintenance_time_utc: str = Field(
        "22:00", pattern=r"^([01]\d|2[0-3]):[0-5]\d$", description="Start of the maintenance window, HH:MM UTC."
    )
    retain: bool = Field(False, description="Keep a created file system (and its data) on `cluster down`.")

    @model_validator(mode="before")
    @classmethod
    def _zone_as_text(cls, data):
        return zone_as_text(data)

    @model_validator(mode="after")
    def _existing_or_created(self) -> AmlfsStorage:
        if self.mgs_address is not None:
            given = [k for k in (*AMLFS_CREATE_KEYS, "retain") if k in self.model_fields_set]
            if given:
                raise ValueError(
                    f"{given[0]}: only for a file system clusterbake creates; remove it (mgs_address names an "
                    "existing one)"
                )
            return self
        step = AMLFS_SKUS[self.sku]
        if self.storage_capacity_tib < step or self.storage_capacity_tib % step:
            raise ValueError(
                f"storage_capacity_tib: {self.sku} is sold in steps of {step} TiB from {step} TiB, not "
                f"{self.storage_capacity_tib}"
            )
        return self


# Container names: 3-63 lowercase letters, digits and hyphens, no hyphen first, last or twice in a row.
BLOB_CONTAINER_PATTERN = r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$"


def is_container_name(value: str) -> bool:
    return bool(re.fullmatch(BLOB_CONTAINER_PATTERN, value)) and "--" not in value


class AzureBlobStorage(StorageBase):
    type: Literal["azure_blob"] = Field(
        description="azure: a Blob Storage container mounted with blobfuse2 on every node, read with the nodes' "
        "managed identity (granted a Storage Blob Data role on the container)."
    )
    container: str | None = Field(
        None,
        pattern=BLOB_CONTAINER_PATTERN,
        description="Container name (3-63 lowercase letters, digits, single hyphens); default: the entry's name.",
    )
    storage_account: str | None = Field(
        None,
        pattern=r"^[a-z0-9]{3,24}$",
        description="Use this existing storage account, in azure.resource_group, and its existing container "
        "(neither is created, changed or deleted by clusterbake); default: one StorageV2 account per cluster, "
        "created and deleted with it.",
    )
    read_only: bool = Field(
        False, description="Mount read-only; the nodes get Storage Blob Data Reader instead of Contributor."
    )
    cache_size_mb: int = Field(10240, ge=1, description="blobfuse2's file cache per node, on the local disk.")
    retain: bool = Field(
        False, description="Keep the cluster's own account (and the container's data) on `cluster down`."
    )

    @property
    def container_name(self) -> str:
        return self.container or self.name

    @model_validator(mode="after")
    def _container(self) -> AzureBlobStorage:
        if not is_container_name(self.container_name):
            raise ValueError(
                f"container: '{self.container_name}' is not a container name (3-63 lowercase letters, digits and "
                "single hyphens); give container"
            )
        if self.storage_account and self.retain:
            raise ValueError("retain: only for the cluster's own account; an existing one is never deleted")
        return self


def _storage_type(value) -> str:
    if isinstance(value, dict):
        return value.get("type", "hostdir")
    return getattr(value, "type", "hostdir")


StorageMount = Annotated[
    Annotated[HostDirStorage, Tag("hostdir")]
    | Annotated[NfsStorage, Tag("nfs")]
    | Annotated[EfsStorage, Tag("efs")]
    | Annotated[FsxLustreStorage, Tag("fsx_lustre")]
    | Annotated[AzureFilesStorage, Tag("azure_files")]
    | Annotated[AmlfsStorage, Tag("amlfs")]
    | Annotated[AzureBlobStorage, Tag("azure_blob")],
    Discriminator(_storage_type),
]
STORAGE_TAGS = ("hostdir", "nfs", "efs", "fsx_lustre", "azure_files", "amlfs", "azure_blob")
STORAGE_TYPES = {
    "local": ("hostdir",),
    "aws": ("nfs", "efs", "fsx_lustre"),
    "azure": ("nfs", "azure_files", "amlfs", "azure_blob"),
}
# Where shared storage lands when the config says nothing (defaults in one place).
DEFAULT_STORAGE_TYPE = {"local": "hostdir", "aws": "nfs", "azure": "nfs"}


# Accounts of the images and their daemons: a cluster user of that name would be adopted by the
# join (and removed with it); the clouds' login users are refused by ClusterConfig.
RESERVED_USER_NAMES = frozenset(
    [
        "root",
        "daemon",
        "bin",
        "sys",
        "sync",
        "games",
        "man",
        "lp",
        "mail",
        "news",
        "uucp",
        "proxy",
        "www-data",
        "backup",
        "list",
        "irc",
        "gnats",
        "nobody",
        "_apt",
        "messagebus",
        "sshd",
        "systemd-network",
        "systemd-resolve",
        "systemd-timesync",
        "systemd-journal-remote",
        "polkitd",
        "syslog",
        "uuidd",
        "tcpdump",
        "tss",
        "landscape",
        "pollinate",
        "fwupd-refresh",
        "lxd",
        "usbmux",
        "dnsmasq",
        "statd",
        "_rpc",
        "slurm",
        "munge",
        "mysql",
        "prometheus",
        "nvidia-persistenced",
        "ubuntu",
        "azureuser",
        "admin",
        "debian",
    ]
)
# Cluster users' uids start here: below are the images' own accounts (the clouds' login user is 1000).
FIRST_USER_UID = 2000
# A line of a file the nodes get (passwd, authorized_keys, a .mount unit): no control character.
NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"


class User(Strict):
    name: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]{0,31}$", description="Login name.")]
    uid: int = Field(ge=FIRST_USER_UID, le=60000, description="Same UID on every node (shared /home); 2000 and up.")
    gid: int | None = Field(None, ge=FIRST_USER_UID, le=60000, description="Defaults to the uid.")
    shell: str = Field("/bin/bash", pattern=r"^/[A-Za-z0-9._/+-]+$", description="Login shell.")
    sudo: bool = Field(
        False, description="Passwordless sudo on every node: a cluster administrator (and on local, host root)."
    )
    ssh_authorized_keys: list[Annotated[str, Field(pattern=NO_CONTROL, min_length=1)]] = Field(
        default_factory=list, description="Public keys for SSH to the head (one line each)."
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value in RESERVED_USER_NAMES:
            raise ValueError(f"{value!r} is an account of the images or their daemons; choose another name")
        return value

    account: str | None = Field(
        None,
        description="Slurm account of the user's jobs (accounting.accounts); default: the first account.",
    )


# Slurm's database keeps names in lower case (sacctmgr(1)): account names are lower case already.
ACCOUNT_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"
# The account users belong to when accounting.accounts lists none.
DEFAULT_ACCOUNT = "general"
# slurmdbd.conf(5): "The '#' character is not permitted in a password"; no blanks or quotes either,
# so that the password is one plain token in slurmdbd.conf and SQL.
DB_PASSWORD_PATTERN = r"^[^\s#'\"\\]{8,128}$"


class Account(Strict):
    """A Slurm account (sacctmgr add account): a bank the users' jobs are charged to."""

    name: str = Field(pattern=ACCOUNT_NAME_PATTERN, description="Account name (lower case).")
    description: str = Field("", max_length=100, description="What the account is for.")
    fairshare: int = Field(
        1, ge=1, le=1000000, description="Its share of the cluster against the other accounts (sacctmgr Fairshare)."
    )
    # Limits of the account's association (Slurm enforces them: AccountingStorageEnforce has limits). Unset: none.
    grp_tres: str | None = Field(
        None,
        pattern=r"^[a-z]+(/[a-z0-9_:.-]+)?=\d+(,[a-z]+(/[a-z0-9_:.-]+)?=\d+)*$",
        description="GrpTRES: what the account's running jobs may hold at once, e.g. node=4,gres/gpu=32 (an "
        "elastic cluster's spend ceiling).",
    )
    max_jobs: int | None = Field(None, ge=0, description="MaxJobs: running jobs per user of the account.")
    max_submit_jobs: int | None = Field(
        None, ge=0, description="MaxSubmitJobs: jobs per user of the account running or waiting."
    )
    max_wall: str | None = Field(
        None, pattern=SLURM_TIME_PATTERN, description="MaxWall: the longest time limit a job of the account may have."
    )


class AccountingDatabase(Strict):
    """accounting.database: an existing MySQL or MariaDB server (Amazon RDS, Azure Database for MySQL) instead
    of MariaDB on the head. slurmdbd still runs on the head; clusterbake never creates or deletes this server."""

    host: str = Field(
        pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$",
        description="Endpoint of the server, e.g. mydb.abc123.us-east-1.rds.amazonaws.com or "
        "mydb.mysql.database.azure.com; the head must reach it.",
    )
    port: int = Field(3306, ge=1, le=65535, description="Its port.")
    name: str = Field(
        "slurm_acct_db", pattern=r"^[A-Za-z0-9_]{1,64}$", description="Database slurmdbd uses (StorageLoc)."
    )
    user: str = Field(
        "slurm",
        pattern=r"^[A-Za-z0-9_.@-]{1,80}$",
        description="Database user (StorageUser), allowed to create the database or all privileges on it.",
    )
    password_file: str = Field(
        description="File on this machine with the user's password (one line, no '#', blanks or quotes; keep it "
        "0600): never the password itself in this file."
    )
    ca_file: str | None = Field(
        None,
        description="PEM CA bundle on this machine to verify the server's TLS certificate (RDS: the region's bundle, "
        "Azure: DigiCert Global Root G2); default: no TLS.",
    )


class AccountingConfig(Strict):
    """Slurm accounting: slurmdbd on the head, every job in its database (sacct), users and accounts from this
    file (sacctmgr), fair-share scheduling."""

    enabled: bool = Field(
        True,
        description="slurmdbd on the head with MariaDB (or `database`), jobs recorded with their GPUs "
        "(AccountingStorageTRES=gres/gpu), fair-share priorities (what it costs at bring-up: "
        "`bench/bringup.py --without accounting`).",
    )
    database: AccountingDatabase | None = Field(
        None, description="An external MySQL/MariaDB server; default: MariaDB on the head (its disk keeps the data)."
    )
    accounts: list[Account] = Field(
        default_factory=list,
        description=f"Slurm accounts; default: one, {DEFAULT_ACCOUNT}. Accounts and users are added, never removed "
        "(their history stays).",
    )
    enforce_associations: bool = Field(
        True,
        description="AccountingStorageEnforce=associations,limits,qos,safe: only users in `users` (and root) can "
        "run jobs, every job counts against its account's fair share, and the accounts' limits (grp_tres, max_jobs, "
        "max_submit_jobs, max_wall) hold.",
    )
    fairshare_weight: int = Field(
        10000, ge=0, description="PriorityWeightFairshare: how much fair share weighs in a job's priority."
    )
    age_weight: int = Field(1000, ge=0, description="PriorityWeightAge: how much waiting time weighs.")
    decay_half_life: str = Field(
        "7-0",
        pattern=r"^(\d+-)?\d+(:\d{2}){0,2}$",
        description="PriorityDecayHalfLife: after this long past usage counts half (days-hours, or minutes).",
    )
    innodb_buffer_pool_mb: int | None = Field(
        None,
        ge=16,
        description="MariaDB on the head: innodb_buffer_pool_size in MiB. Default: 10% of the head's memory, from "
        "128 to 4096 (SchedMD: 5 to 50 percent of the memory).",
    )

    def effective_accounts(self) -> list[Account]:
        return list(self.accounts) or [Account(name=DEFAULT_ACCOUNT, description="every user by default")]


# Plugin choices that work in each environment, by provider ("cloud": every cloud provider)
# and, where an image base needs other ones, by image base. Slurm's cgroup plugins need a
# cgroup plugin for the host's cgroup version: the local provider's nspawn nodes on a cgroup
# v1 hybrid host cannot use them (PLATFORM.md); Ubuntu 24.04 boots cgroup v2 only and its
# Slurm 23.11 has cgroup/v2; Ubuntu 22.04 boots cgroup v2 only too, but its Slurm 21.08 has
# cgroup/v1 only (cgroup/v2 came with Slurm 22.05), so slurmd would not start with them.
_WITHOUT_CGROUP = {
    "proctrack_type": "proctrack/linuxproc",
    "task_plugin": "task/affinity",
    "jobacct_gather_type": "jobacct_gather/linux",
}
SLURM_PLUGIN_DEFAULTS = {
    "local": _WITHOUT_CGROUP,
    "cloud": {
        "proctrack_type": "proctrack/cgroup",
        "task_plugin": "task/cgroup,task/affinity",
        "jobacct_gather_type": "jobacct_gather/cgroup",
    },
    "ubuntu-22.04": _WITHOUT_CGROUP,
}
# Image bases whose Slurm cannot run the cgroup plugins at all, and why.
SLURM_WITHOUT_CGROUP_V2 = {
    "ubuntu-22.04": "Ubuntu 22.04 boots cgroup v2 only and its Slurm 21.08 has no cgroup/v2 plugin (Slurm 22.05 "
    "added it)",
}


def _plugin_default_text(key: str) -> str:
    cloud, without = SLURM_PLUGIN_DEFAULTS["cloud"][key], SLURM_PLUGIN_DEFAULTS["local"][key]
    return f"Default: aws {cloud} (ubuntu-24.04); {without} on local and on aws ubuntu-22.04."


class SlurmConfig(Strict):
    proctrack_type: str | None = Field(None, description=_plugin_default_text("proctrack_type"))
    task_plugin: str | None = Field(None, description=_plugin_default_text("task_plugin"))
    jobacct_gather_type: str | None = Field(None, description=_plugin_default_text("jobacct_gather_type"))


# ResumeTimeout defaults (power.resume_timeout): a GPU, EFA or InfiniBand node's boot takes minutes
# (hardware review item 14: 600 s killed slow p5 and ND v5 boots after billing them).
RESUME_TIMEOUT_DEFAULT = 600
RESUME_TIMEOUT_ACCELERATED = 1800


class PowerConfig(Strict):
    """Power saving of elastic node groups (Slurm's ResumeProgram/SuspendProgram and the reconcile loop)."""

    resume_timeout: int | None = Field(
        None,
        ge=30,
        description="Seconds a resumed node has to boot and register before Slurm marks it DOWN (and its jobs "
        f"are requeued). Default: {RESUME_TIMEOUT_ACCELERATED} when an elastic node has GPUs, EFA or InfiniBand "
        "(driver, fabric manager and HCA start-up take minutes; ParallelCluster and CycleCloud use 1800), else "
        f"{RESUME_TIMEOUT_DEFAULT}.",
    )

    def effective_resume_timeout(self, accelerated: bool) -> int:
        """resume_timeout, or its default for elastic nodes with (accelerated) or without GPUs and fabrics."""
        if self.resume_timeout is not None:
            return self.resume_timeout
        return RESUME_TIMEOUT_ACCELERATED if accelerated else RESUME_TIMEOUT_DEFAULT

    suspend_timeout: int = Field(120, ge=10, description="Seconds a node has to power down (SuspendTimeout).")
    failed_node_cooldown: int = Field(
        300, ge=0, description="Seconds a node stays DOWN after a failed resume before it returns to service."
    )
    capacity_cooldown: int = Field(
        600, ge=0, description="Seconds an instance type is skipped after a capacity error (clouds)."
    )
    orphan_grace: int = Field(
        120, ge=0, description="Seconds an instance may run behind a powered-down node before it is terminated."
    )


# NVIDIA Xid codes after which a GPU needs a reset or service (NVIDIA's Xid catalog,
# docs.nvidia.com/deploy/xid-errors, "Resolution Bucket" RESET_GPU / RESTART_BM / CONTACT_SUPPORT):
# GPU stopped processing (46: CRITICAL in NVIDIA's health validation Xid checks), double-bit ECC
# (48), row remapping and page retirement (63, 64), NVLink (74), fallen off the bus (79), high
# single-bit ECC rate (92), contained and uncontained ECC (94, 95), GSP timeouts (119, 120), reset
# required (154). After a GPU reset, `clusterbake-health --xids-cleared` on the node forgets them.
DEFAULT_FATAL_XIDS = (46, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154)


# `dcgmi diag -r 2` runs "approximately two minutes" (NVIDIA's dcgmi diag reference): its timeout at least.
DCGM_LEVEL2_MIN_TIMEOUT = 180


class HealthConfig(Strict):
    """Health checks of the compute nodes (role node_health): a failing check drains the node."""

    interval: int = Field(
        300,
        ge=0,
        le=86400,
        description="Seconds between checks of every compute node (Slurm's HealthCheckInterval; the node's own "
        "timer runs them too, since Slurm cannot reach a node whose munge is down); they also run when slurmd "
        "starts, before the node registers. 0: no health checks.",
    )
    disk_paths: list[str] = Field(
        default_factory=lambda: ["/", "/tmp"], description="File systems whose free space is checked."
    )
    disk_min_free_mb: int = Field(1024, ge=0, description="MiB each of disk_paths must have free.")
    memory_min_available_mb: int = Field(512, ge=0, description="MiB of MemAvailable a node must have.")
    max_restarts: int = Field(
        3, ge=1, description="munge or slurmd restarted by systemd this many times within restart_window: drained."
    )
    restart_window: int = Field(600, ge=60, description="Seconds over which daemon restarts are counted.")
    fatal_xids: list[int] = Field(
        default_factory=lambda: list(DEFAULT_FATAL_XIDS),
        description="GPU nodes: NVIDIA Xid codes in the kernel log since boot (or since `clusterbake-health "
        "--xids-cleared` after a GPU reset) that drain the node; NVSwitch nodes also drain on a fatal SXid.",
    )
    dcgm_diag_level: int = Field(
        1,
        ge=0,
        le=2,
        description="GPU jobs' prolog on nodes with DCGM: `dcgmi diag -r LEVEL` on the job's GPUs before the job; "
        "0: none. 1 takes seconds, 2 about two minutes (needs dcgm_diag_timeout >= "
        f"{DCGM_LEVEL2_MIN_TIMEOUT}); 3 (about 15 minutes, NVIDIA's dcgmi diag reference) is no prolog's.",
    )
    dcgm_diag_timeout: int = Field(
        90, ge=10, le=600, description="Seconds the prolog's DCGM diagnostic may take before it counts as failed."
    )

    @model_validator(mode="after")
    def _diagnostic_fits_its_timeout(self):
        # A level that cannot finish in time drains every GPU node at its first job, for a person to
        # resume (hardware review item 10).
        if self.dcgm_diag_level == 2 and self.dcgm_diag_timeout < DCGM_LEVEL2_MIN_TIMEOUT:
            raise ValueError(
                f"health.dcgm_diag_level 2 runs about two minutes (NVIDIA's dcgmi diag reference): set "
                f"health.dcgm_diag_timeout to at least {DCGM_LEVEL2_MIN_TIMEOUT}, or use level 1"
            )
        return self

    @field_validator("disk_paths")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/"):
                raise ValueError(f"'{path}' is not an absolute path")
        return value


class RecoveryConfig(Strict):
    """What happens after a node is lost (a dead machine, a reclaimed spot instance)."""

    requeue_delay: int = Field(
        120,
        ge=30,
        le=1200,
        description="Seconds a requeued job waits before it can start again (Slurm's AuthInfo cred_expire; it "
        "must also cover a job step's launch, prolog included).",
    )
    replace_lost_nodes: bool = Field(
        True,
        description="A static node whose machine is gone is set DOWN at once (its jobs requeued) and started "
        "again (clouds: replaced) by the head's reconcile loop.",
    )
    reconcile_interval: int = Field(30, ge=5, le=600, description="Seconds between the reconcile loop's passes.")


class CheckpointsConfig(Strict):
    """Durable copies of the job templates' checkpoints (scripts/jobs/checkpoint-copy)."""

    copy_to: str | None = Field(
        None,
        pattern=r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?|/[^\s]*)$",
        description="Where each checkpoint is copied after it is written, and restored from when the checkpoint "
        "directory has none (shared storage lost): s3://bucket/prefix (aws: the node role may read and write "
        "there; the bucket must exist), or a directory on the nodes where a bucket or container is mounted "
        "(Mountpoint for S3, blobfuse2). Each job's copies go under <copy_to>/<job name>.",
    )


# Where the monitoring daemons listen (one place: the inventory hands them to the roles, and
# `clusterbake report` reaches Prometheus there through the head's SSH connection).
MONITORING_PORTS = {"prometheus": 9090, "node_exporter": 9100, "slurm_exporter": 9341, "dcgm_exporter": 9400}


class MonitoringConfig(Strict):
    """Prometheus on the head, node exporter on every node, a Slurm exporter on the head and dcgm-exporter on
    GPU nodes; `clusterbake report` plots what they recorded."""

    enabled: bool = Field(
        True,
        description="Prometheus and the Slurm exporter on the head, node exporter on every node (what it costs at "
        "bring-up: `bench/bringup.py --without monitoring`).",
    )
    node_exporter: bool = Field(
        True, description="Node exporter on every node (CPU, memory, disks, network of each machine)."
    )
    dcgm_exporter: bool = Field(
        True, description="dcgm-exporter on GPU nodes with DCGM (the dcgm feature group; not placeholder GPUs)."
    )
    scrape_interval: int = Field(15, ge=5, le=300, description="Seconds between two scrapes of every target.")
    retention: str = Field(
        "15d",
        pattern=r"^\d+[smhdwy]$",
        description="How long Prometheus keeps its data on the head's disk (--storage.tsdb.retention.time).",
    )


class LocalConfig(Strict):
    subnet: str = Field("10.77.0.0/24", description="Project bridge subnet; the host takes the first address.")
    state_dir: str = Field("/var/lib/clusterbake", description="Images, caches and cluster state.")
    boot_timeout: int = Field(
        60,
        ge=5,
        le=3600,
        description="Seconds a started node has to answer SSH before `cluster up` fails (a first up is rolled back; "
        "the failed nodes' console logs and journals are kept under the cluster's logs).",
    )

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, value: str) -> str:
        network = ipaddress.ip_network(value, strict=True)
        if network.version != 4 or not network.is_private or network.prefixlen > 28:
            raise ValueError("must be a private IPv4 network of /28 or larger, e.g. 10.77.0.0/24")
        return value


# --- the fields every cloud section (aws, azure) has ----------------------------------------------


def ssh_cidrs_field(outside: str):
    """CIDRs allowed to SSH in; `outside`: where nothing else enters from."""
    return Field(
        default_factory=list,
        description=f"CIDRs allowed to reach SSH (port 22) on the nodes; nothing else enters from {outside}.",
    )


def login_user_field(default: str, description: str):
    return Field(default, pattern=r"^[a-z_][a-z0-9_-]{0,31}$", description=description)


def bastion_field():
    return Field(
        None,
        pattern=r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+(:\d+)?$",
        description="SSH jump host user@host[:port] (ProxyJump) when the nodes' private IPs are not reachable.",
    )


def network_interface_field(description: str):
    return Field("auto", pattern=r"^[a-z][a-z0-9]{1,14}$", description=description)


def check_cidrs(values: list[str]) -> list[str]:
    """ssh_cidrs' validator: each a CIDR block."""
    for value in values:
        try:
            ipaddress.ip_network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"'{value}' is not a CIDR block ({exc})") from None
    return values


class AwsConfig(Strict):
    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d+$", description="AWS region, e.g. us-east-1.")
    vpc_id: str = Field(pattern=r"^vpc-[0-9a-f]{8,17}$", description="Existing VPC the cluster runs in.")
    subnet_id: str = Field(
        pattern=r"^subnet-[0-9a-f]{8,17}$",
        description="Existing subnet of that VPC; its Availability Zone is where every node runs.",
    )
    ssh_cidrs: list[str] = ssh_cidrs_field("outside")
    key_name: str | None = Field(None, description="EC2 key pair also installed for ssh_user (optional).")
    ami_id: str | None = Field(
        None,
        pattern=r"^ami-[0-9a-f]{8,17}$",
        description="Node image; default: the AMI of the last `make image PROVIDER=aws` "
        "(<state_dir>/images/aws-latest.json).",
    )
    bastion: str | None = bastion_field()
    ssh_user: str = login_user_field("ubuntu", "Login user of the AMI (sudo to root).")
    kms_key_id: str | None = Field(
        None,
        pattern=r"^(arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)/[A-Za-z0-9/_-]+|alias/[A-Za-z0-9/_-]+|"
        r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$",
        description="KMS key (id, ARN or alias) that encrypts the join-bundle secrets; default: the AWS managed "
        "key aws/secretsmanager.",
    )
    network_interface: str = network_interface_field(
        "Interface NCCL and gloo bootstrap on (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME). auto: found on "
        "each node (the one with its route to the head; names differ by type and OS: ens5, enp71s0 on p5); "
        "an interface name overrides it."
    )

    @field_validator("ssh_cidrs")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        return check_cidrs(values)


GUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
RESOURCE_GROUP_PATTERN = r"^[-\w.()]{0,89}[-\w()]$"
AZURE_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,78}[A-Za-z0-9_])?$"
# Azure refuses these as a VM's admin user name (its documented list, case-insensitive).
AZURE_RESERVED_USERS = frozenset(
    {
        "administrator", "admin", "user", "user1", "test", "user2", "test1", "user3", "admin1", "1", "123", "a",
        "actuser", "adm", "admin2", "aspnet", "backup", "console", "david", "guest", "john", "owner", "root",
        "server", "sql", "support", "support_388945a0", "sys", "test2", "test3", "user4", "user5",
    }
)  # fmt: skip


class AzureConfig(Strict):
    subscription_id: str = Field(pattern=GUID_PATTERN, description="Azure subscription (a GUID) the cluster runs in.")
    location: str = Field(pattern=r"^[a-z][a-z0-9]+$", description="Azure region, e.g. eastus, westeurope.")
    zone: Literal["1", "2", "3"] | None = Field(
        None, description="Availability zone of every node; default: none (regional, Azure picks)."
    )
    resource_group: str = Field(
        pattern=RESOURCE_GROUP_PATTERN,
        description="Resource group of the cluster's resources; created (tagged clusterbake-cluster) when missing, "
        "and deleted by `cluster down` only if clusterbake created it.",
    )
    nodes_resource_group: str | None = Field(
        None,
        pattern=RESOURCE_GROUP_PATTERN,
        description="Resource group of the compute nodes' VMs, NICs and placement groups, the only group the "
        "head's power identity may write in (never the head's own VM); created and deleted with the cluster; "
        "default: <resource_group>-<cluster>-nodes.",
    )
    subnet_id: str | None = Field(
        None,
        pattern=SUBNET_ID_PATTERN,
        description="Existing subnet, by resource id (/subscriptions/.../virtualNetworks/V/subnets/S); "
        "or give vnet_name and subnet_name.",
    )
    vnet_name: str | None = Field(None, pattern=AZURE_NAME_PATTERN, description="Existing virtual network, by name.")
    subnet_name: str | None = Field(None, pattern=AZURE_NAME_PATTERN, description="Existing subnet of vnet_name.")
    vnet_resource_group: str | None = Field(
        None, pattern=RESOURCE_GROUP_PATTERN, description="Resource group of vnet_name; default: resource_group."
    )
    ssh_cidrs: list[str] = ssh_cidrs_field("outside the cluster")
    admin_user: str = login_user_field("azureuser", "Login user of the VMs (SSH key only, sudo to root).")
    image: str | None = Field(
        None,
        pattern=r"^(/subscriptions/[^\s]+|[^:\s]+:[^:\s]+:[^:\s]+:[^:\s]+)$",
        description="Node image: a resource id (managed image or gallery image version) or a marketplace URN "
        "publisher:offer:sku:version; default: the image of the last `make image PROVIDER=azure` "
        "(<state_dir>/images/azure-latest.json).",
    )
    key_vault_name: str | None = Field(
        None,
        pattern=r"^[a-zA-Z][a-zA-Z0-9-]{1,22}[a-zA-Z0-9]$",
        description="Key Vault that holds the join bundles (names are global in Azure); default: cb-<cluster>-<hash "
        "of subscription and resource group>.",
    )
    bastion: str | None = bastion_field()
    network_interface: str = network_interface_field(
        "Interface NCCL and gloo bootstrap on; auto: found on each node (eth0 on Azure's images)."
    )

    @model_validator(mode="before")
    @classmethod
    def _zone_as_text(cls, data):
        return zone_as_text(data)

    @field_validator("ssh_cidrs")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        return check_cidrs(values)

    @field_validator("admin_user")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value.lower() in AZURE_RESERVED_USERS:
            raise ValueError(f"Azure does not allow '{value}' as a VM's admin user; choose another (azureuser)")
        return value

    @property
    def subnet_parts(self) -> tuple[str, str, str]:
        """(resource group, virtual network, subnet) of the existing subnet."""
        if self.subnet_id:
            parts = self.subnet_id.split("/")
            return parts[4], parts[8], parts[10]
        return self.vnet_resource_group or self.resource_group, self.vnet_name, self.subnet_name

    @model_validator(mode="after")
    def _nodes_group_of_their_own(self):
        if self.nodes_resource_group and self.nodes_resource_group.lower() == self.resource_group.lower():
            raise ValueError(
                "azure.nodes_resource_group must differ from azure.resource_group: the head's power identity "
                "may write every VM there, and the head's must not be one of them (leave it unset for the default)"
            )
        return self

    @property
    def subnet_field(self) -> str:
        return "azure.subnet_id" if self.subnet_id else "azure.subnet_name"


class ClusterConfig(Strict):
    cluster_name: Name = Field(description="Names the cluster's nodes, network devices, state and cloud tags.")
    provider: Literal["local", "aws", "azure"] = Field(
        "local", description="local (nspawn nodes on this host), aws or azure."
    )
    image: ImageConfig = Field(default_factory=ImageConfig, description="What goes into the node image.")
    head: HeadConfig = Field(default_factory=HeadConfig, description="The head node (slurmctld, login).")
    node_groups: list[NodeGroup] = Field(min_length=1, description="Compute nodes, named <group>-<n>.")
    partitions: list[Partition] = Field(
        default_factory=list, description="Slurm partitions; default: one per node group, the first the default."
    )
    storage: list[StorageMount] | None = Field(
        None,
        description="Shared file systems on every node; default: /shared (local: a host directory, aws: NFS "
        "from the head). /home is always shared: local a host directory, aws NFS from the head unless listed here.",
    )
    users: list[User] = Field(default_factory=list, description="Cluster users, same UID/GID on every node.")
    slurm: SlurmConfig = Field(default_factory=SlurmConfig, description="Per-environment Slurm plugin choices.")
    power: PowerConfig = Field(default_factory=PowerConfig, description="Power saving of elastic node groups.")
    health: HealthConfig = Field(default_factory=HealthConfig, description="Health checks of the compute nodes.")
    recovery: RecoveryConfig = Field(
        default_factory=RecoveryConfig, description="Lost nodes and requeued jobs (the reconcile loop)."
    )
    checkpoints: CheckpointsConfig = Field(
        default_factory=CheckpointsConfig, description="Durable copies of the jobs' checkpoints."
    )
    accounting: AccountingConfig = Field(
        default_factory=AccountingConfig, description="Slurm accounting (slurmdbd, sacct, fair share)."
    )
    monitoring: MonitoringConfig = Field(
        default_factory=MonitoringConfig, description="Prometheus and its exporters; `clusterbake report`."
    )
    local: LocalConfig = Field(default_factory=LocalConfig, description="Settings of the local provider.")
    aws: AwsConfig | None = Field(None, description="Settings of the aws provider (required with provider aws).")
    azure: AzureConfig | None = Field(
        None, description="Settings of the azure provider (required with provider azure)."
    )

    @model_validator(mode="before")
    @classmethod
    def _default_image_base(cls, data):
        """image.base defaults per provider (DEFAULT_IMAGE_BASE)."""
        if not isinstance(data, dict) or not isinstance(provider := data.get("provider"), str):
            return data
        image = data.get("image", {})
        if provider in DEFAULT_IMAGE_BASE and isinstance(image, dict) and "base" not in image:
            data = {**data, "image": {**image, "base": DEFAULT_IMAGE_BASE[provider]}}
        return data

    @model_validator(mode="after")
    def _cross_references(self) -> ClusterConfig:
        _unique("node_groups", [g.name for g in self.node_groups])
        _unique("partitions", [p.name for p in self.partitions])
        _unique("storage", [s.mount_point for s in self.storage or []], what="mount_point")
        _unique("storage", [s.name for s in self.storage or []])
        _unique("users", [u.name for u in self.users])
        _unique("users", [u.uid for u in self.users], what="uid")
        login = self.aws.ssh_user if self.aws else self.azure.admin_user if self.azure else None
        for index, user in enumerate(self.users):
            if user.name == login:
                raise ValueError(
                    f"users.{index}.name: {login!r} is the cloud's login user (the controller's); choose another name"
                )
        groups = {g.name for g in self.node_groups}
        if "head" in groups:
            raise ValueError("node_groups: 'head' is reserved for the head node; rename the group")
        for index, partition in enumerate(self.partitions):
            for name in partition.node_groups:
                if name not in groups:
                    raise ValueError(
                        f"partitions.{index}.node_groups: '{name}' is not a node group "
                        f"(defined: {', '.join(sorted(groups))})"
                    )
        if sum(p.default for p in self.partitions) > 1:
            raise ValueError("partitions: more than one partition has default: true")
        for index, group in enumerate(self.node_groups):
            if group.spot and group.capacity_reservation_id:
                raise ValueError(
                    f"node_groups.{index}.capacity_reservation_id: capacity reservations are for on-demand "
                    "instances; remove it or set spot: false"
                )
        self._check_storage()
        copy_to = self.checkpoints.copy_to or ""
        if copy_to.startswith("s3://") and self.provider != "aws":
            raise ValueError(
                f"checkpoints.copy_to: s3:// needs provider aws (its node role); on {self.provider} give a directory "
                "where a bucket or container is mounted"
            )
        self._check_accounting()
        if self.provider == "aws":
            self._check_aws()
        elif self.provider == "azure":
            self._check_azure()
        elif self.image.base != "debian-12":
            raise ValueError(
                f"image.base: the local provider builds debian-12 images only (no Ubuntu mirror is reachable "
                f"from here), not {self.image.base}; remove image.base"
            )
        return self

    def _check_aws(self) -> None:
        if self.aws is None:
            raise ValueError("aws: required with provider aws (region, vpc_id, subnet_id, ssh_cidrs, ...)")
        for _ in self._cloud_sections(
            "aws",
            AWS_INSTANCE_TYPE_PATTERN,
            ("e.g. m7i.2xlarge", ", or instance_types: [...] in order of preference"),
            ("an EC2 instance type (e.g. m7i.2xlarge)", "instance type"),
            foreign={"infiniband": "only for provider azure (on aws: efa); remove it"},
        ):
            pass  # the checks run as the sections are read; aws has no others

    def _check_azure(self) -> None:
        if self.azure is None:
            raise ValueError(
                "azure: required with provider azure (subscription_id, location, resource_group, "
                "subnet_id or vnet_name + subnet_name, ssh_cidrs, ...)"
            )
        if self.aws is not None:
            raise ValueError("aws: only for provider aws; remove it (this cluster is provider azure)")
        azure = self.azure
        if azure.subnet_id and (azure.vnet_name or azure.subnet_name or azure.vnet_resource_group):
            raise ValueError("azure.subnet_id: give subnet_id or vnet_name + subnet_name, not both")
        if not azure.subnet_id and not (azure.vnet_name and azure.subnet_name):
            missing = "subnet_name" if azure.vnet_name else "vnet_name"
            raise ValueError(
                f"azure.{missing}: required (the existing subnet: subnet_id, or vnet_name and subnet_name)"
            )
        for field, section in self._cloud_sections(
            "azure",
            AZURE_VM_SIZE_PATTERN,
            ("a VM size, e.g. Standard_D4s_v5", ""),
            ("an Azure VM size (Standard_<name>, e.g. Standard_ND96isr_H100_v5)", "VM size"),
        ):
            if not isinstance(section, NodeGroup):
                continue
            for key, what in (
                ("efa", "aws's EFA; Azure's fabric is InfiniBand: use infiniband"),
                ("capacity_reservation_id", "aws capacity reservations"),
            ):
                if key in section.model_fields_set:
                    raise ValueError(f"{field}.{key}: {what}; remove it")
            if section.existing_placement_group:
                raise ValueError(
                    f"{field}.placement_group: on azure true or false (the group's own proximity placement group), "
                    "not the name of an existing one"
                )
        for index, entry in enumerate(self.storage or []):
            if isinstance(entry, AmlfsStorage) and entry.mgs_address is None and not (entry.zone or azure.zone):
                raise ValueError(
                    f"storage.{index}.zone: Azure Managed Lustre file systems live in one availability zone; set "
                    "zone (or azure.zone) to 1, 2 or 3"
                )

    def _cloud_sections(
        self,
        provider: str,
        pattern: str,
        required: tuple[str, str],
        kind: tuple[str, str],
        foreign: dict[str, str] | None = None,
    ):
        """The checks every cloud provider makes: an Ubuntu image.base, the Slurm plugins, and each
        section's (head, node_groups.N) instance_type (`pattern`) and no local sizing keys; yields
        (field, section) after each section's checks, for the provider's own.

        required: the hint when instance_type is missing, and what node groups may give instead;
        kind: what instance_type must be (for the message), and what the sizes come from;
        foreign: keys of other providers, refused with their message (before the sizing keys).
        """
        if not self.image.base.startswith("ubuntu-"):
            label = {"aws": "AWS", "azure": "Azure"}[provider]
            raise ValueError(
                f"image.base: {label} images are Ubuntu; remove image.base "
                f"(default {DEFAULT_IMAGE_BASE[provider]}) or set ubuntu-24.04 or ubuntu-22.04"
            )
        self._check_slurm_plugins()
        hint, alternative = required
        what, source = kind
        sections = [("head", self.head)] + [(f"node_groups.{i}", g) for i, g in enumerate(self.node_groups)]
        for field, section in sections:
            if not section.instance_type:
                instead = "" if field == "head" else alternative
                raise ValueError(f"{field}.instance_type: required with provider {provider} ({hint}){instead}")
            if not re.fullmatch(pattern, section.instance_type):
                raise ValueError(f"{field}.instance_type: {section.instance_type} is not {what}")
            for key, message in (foreign or {}).items():
                if key in section.model_fields_set:
                    raise ValueError(f"{field}.{key}: {message}")
            for index, value in enumerate(getattr(section, "instance_types", None) or []):
                if not re.fullmatch(pattern, value):
                    raise ValueError(f"{field}.instance_types.{index}: {value} is not {what}")
            for key in LOCAL_SIZING_KEYS:
                if key in section.model_fields_set:
                    raise ValueError(
                        f"{field}.{key}: only for provider local; on {provider} CPUs, sockets and memory come "
                        f"from the {source} ({section.instance_type}); remove it"
                    )
            yield field, section

    def _check_slurm_plugins(self) -> None:
        """No cgroup plugin where the image's Slurm cannot run one (SLURM_WITHOUT_CGROUP_V2)."""
        reason = SLURM_WITHOUT_CGROUP_V2.get(self.image.base)
        if reason is None:
            return
        defaults = SLURM_PLUGIN_DEFAULTS.get(self.image.base, SLURM_PLUGIN_DEFAULTS["cloud"])
        for key, value in self.slurm.model_dump().items():
            if value and any(plugin.strip().endswith("/cgroup") for plugin in value.split(",")):
                raise ValueError(
                    f"slurm.{key}: {value} needs Slurm's cgroup plugins, which cannot run on image.base "
                    f"{self.image.base}: {reason}; remove slurm.{key} (default there: {defaults[key]}) "
                    f"or set image.base: {DEFAULT_IMAGE_BASE['aws']}"
                )

    def _check_accounting(self) -> None:
        _unique("accounting.accounts", [a.name for a in self.accounting.accounts])
        accounts = [a.name for a in self.accounting.effective_accounts()]
        for index, user in enumerate(self.users):
            if user.account is not None and user.account not in accounts:
                raise ValueError(
                    f"users.{index}.account: '{user.account}' is not an account (accounting.accounts: "
                    f"{', '.join(accounts)}); add it there or remove users.{index}.account"
                )

    def _check_storage(self) -> None:
        allowed = STORAGE_TYPES[self.provider]
        for index, mount in enumerate(self.storage or []):
            if mount.type not in allowed:
                raise ValueError(
                    f"storage.{index}.type: {mount.type} is not for provider {self.provider}; "
                    f"use {' or '.join(allowed)}"
                )
            if self.provider == "local" and mount.mount_point == "/home":
                raise ValueError(
                    f"storage.{index}.mount_point: /home is always a shared host directory on the local "
                    "provider; remove this entry"
                )

    def effective_storage(self) -> list[StorageMount]:
        """Shared file systems of every node, /home first (a cloud cluster always shares it)."""
        kind = DEFAULT_STORAGE_TYPE[self.provider]
        by_type = {"hostdir": HostDirStorage, "nfs": NfsStorage}
        mounts = (
            list(self.storage)
            if self.storage is not None
            else [by_type[kind](name="shared", mount_point="/shared", type=kind)]
        )
        if self.provider != "local" and not any(m.mount_point == "/home" for m in mounts):
            mounts.insert(0, by_type[kind](name="home", mount_point="/home", type=kind))
        return sorted(mounts, key=lambda m: m.mount_point != "/home")

    def effective_partitions(self) -> list[Partition]:
        """Partitions as configured, or one default partition per node group."""
        if self.partitions:
            parts = list(self.partitions)
            if not any(p.default for p in parts):
                parts[0] = parts[0].model_copy(update={"default": True})
            return parts
        return [Partition(name=g.name, node_groups=[g.name], default=i == 0) for i, g in enumerate(self.node_groups)]

    def slurm_plugins(self) -> dict[str, str]:
        """The configured plugin types, else the defaults of the provider and image base."""
        if self.provider == "local":
            defaults = SLURM_PLUGIN_DEFAULTS["local"]
        else:
            defaults = SLURM_PLUGIN_DEFAULTS.get(self.image.base, SLURM_PLUGIN_DEFAULTS["cloud"])
        chosen = self.slurm.model_dump()
        return {key: chosen[key] or value for key, value in defaults.items()}


def _unique(field: str, values: list, what: str = "name") -> None:
    seen = set()
    for value in values:
        if value in seen:
            raise ValueError(f"{field}: duplicate {what} '{value}'; each must be unique")
        seen.add(value)


def extra_ca_files(config: ClusterConfig) -> list[str]:
    files: list[str] = []
    for index, pattern in enumerate(config.image.extra_ca_certificates):
        matches = sorted(glob(pattern))
        if not matches:
            raise ConfigError(
                f"image.extra_ca_certificates.{index}: '{pattern}' matches no file on this machine; "
                "fix the path or remove the entry"
            )
        files += [str(Path(m).resolve()) for m in matches]
    return files


def check_accounting_files(config: ClusterConfig) -> None:
    """accounting.database's files on this machine: a password slurmdbd can use, readable by no one else, and
    the CA bundle. Read here, never printed; bad ones are input errors, found before anything is created."""
    database = config.accounting.database if config.accounting.enabled else None
    if database is None:
        return
    path = Path(database.password_file)
    field = "accounting.database.password_file"
    if not path.is_file():
        raise ConfigError(f"{field}: {path} is not a file on this machine; write the database password there (0600)")
    if path.stat().st_mode & 0o077:
        raise ConfigError(f"{field}: {path} is readable by others; chmod 600 {path}")
    lines = path.read_text().splitlines()
    if len(lines) != 1 or not re.fullmatch(DB_PASSWORD_PATTERN, lines[0]):
        raise ConfigError(
            f"{field}: {path} must hold one line, the password: 8 to 128 characters without '#' (slurmdbd.conf(5) "
            "does not allow it), blanks, quotes or backslashes; choose such a password for the database user"
        )
    if database.ca_file is not None:
        ca = Path(database.ca_file)
        if not ca.is_file() or "-----BEGIN CERTIFICATE-----" not in ca.read_text(errors="replace"):
            raise ConfigError(f"accounting.database.ca_file: {ca} is not a PEM certificate file on this machine")


def load_config(path: str | Path) -> ClusterConfig:
    """Read and validate a config file, raising ConfigError with a readable message."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file; pass CONFIG=path or create {DEFAULT_CONFIG}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with cluster_name, node_groups, ...")
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: invalid config\n" + format_validation_error(exc)) from None


def _without_union_tags(loc: tuple) -> list:
    """storage.0.efs.retain -> storage.0.retain: the tag of a storage entry is its `type`, not a key."""
    parts = list(loc)
    return [p for i, p in enumerate(parts) if not (i == 2 and parts[0] == "storage" and p in STORAGE_TAGS)]


_HINTS = {
    "extra_forbidden": "unknown key; remove it or check its spelling",
    "missing": "required; add it",
}


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        location = ".".join(str(part) for part in _without_union_tags(error["loc"])) or "(top level)"
        message = _HINTS.get(error["type"], error["msg"].removeprefix("Value error, "))
        lines.append(f"  {location}: {message}")
    return "\n".join(lines)
