"""The image section, and the clouds' image build settings (clusterbake.images.aws, .azure)."""

from __future__ import annotations

from typing import Annotated, Literal

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import (
    AfterValidator,
    Field,
    model_validator,
)

from clusterbake.config.base import GUID_PATTERN, RESOURCE_GROUP_PATTERN, Strict

# The image base when the config names none. AWS: Ubuntu 24.04 (Slurm 23.11, which has the
# cgroup/v2 plugin that Ubuntu's cgroup-v2-only boot needs; see SLURM_PLUGIN_DEFAULTS).
DEFAULT_IMAGE_BASE = {"local": "debian-12", "aws": "ubuntu-24.04", "azure": "ubuntu-24.04"}


# --- Image build settings of the clouds (clusterbake.images.aws, clusterbake.images.azure) ---------
# The build VM, where it runs and what it starts from: every default of a cloud image
# build is here. Empty (None) values fall back to the cluster's own cloud section.

# Feature groups of the cloud GPU images, before the node groups' own features (the
# builder joins all: each switches a role of ansible/image.yml on). pyxis: Enroot and Pyxis
# (srun --container-image, NGC images), as ParallelCluster's and azhpc-images' images have them.
AWS_IMAGE_FEATURES = ("aws", "cuda", "nvswitch", "efa", "dcgm", "lustre", "s3", "pyxis")
AZURE_IMAGE_FEATURES = ("azure", "cuda", "nvswitch", "dcgm", "doca_ofed", "amlfs", "blobfuse2", "pyxis")
# Canonical's Gen2 marketplace images (publisher:offer:sku:version) per image base.
AZURE_SOURCE_IMAGES = {
    "ubuntu-24.04": "Canonical:ubuntu-24_04-lts:server:latest",
    "ubuntu-22.04": "Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest",
}


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

    subscription_id: str | None = Field(None, pattern=GUID_PATTERN, description="Default: azure.subscription_id.")
    location: str | None = Field(
        None, pattern=r"^[a-z][a-z0-9]+$", description="Region of the build VM and the image; default: azure.location."
    )
    resource_group: str | None = Field(
        None,
        pattern=RESOURCE_GROUP_PATTERN,
        description="Existing resource group the managed image is stored in; default: azure.resource_group.",
    )
    build_resource_group: str | None = Field(
        None,
        pattern=RESOURCE_GROUP_PATTERN,
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
        None, pattern=RESOURCE_GROUP_PATTERN, description="Resource group of gallery_name; default: resource_group."
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
        None, pattern=GUID_PATTERN, description="Service principal (app id) of auth service_principal."
    )
    tenant_id: str | None = Field(
        None, pattern=GUID_PATTERN, description="Tenant of client_id; default: the subscription's."
    )
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


def _plain_requirement(value: str) -> str:
    """A pip requirement line from the index: a name, extras, a version, markers; no URL or pip option."""
    try:
        requirement = Requirement(value)
    except InvalidRequirement as exc:
        raise ValueError(f"{value!r} is not a pip requirement ({exc})") from None
    if requirement.url:
        raise ValueError(f"{value!r}: a name and a version from the index only (no URL, no pip option)")
    return value


class TrainingConfig(Strict):
    """The training environment every `train` node has (torch, DeepSpeed), and what a team adds to it."""

    extra_requirements: list[Annotated[str, AfterValidator(_plain_requirement)]] = Field(
        default_factory=list,
        description="pip requirement lines baked into the training environment with torch and DeepSpeed, resolved "
        "together (e.g. `transformers==4.57.1`, `datasets>=3`): names and versions from PyPI only (no URL, no pip "
        "option). A change builds a new image. One user's own packages: docs/users.md.",
    )
