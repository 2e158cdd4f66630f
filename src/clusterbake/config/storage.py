"""Shared storage entries, one model per type (hostdir, nfs, efs, fsx_lustre, azure_files, amlfs, azure_blob)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from clusterbake.config.base import Name, Strict

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
        description="s3://bucket[/prefix] linked as a data repository (a data repository association of /): "
        "imported on creation, new, changed and deleted files exported automatically, within minutes; `cluster "
        "down` deletes the file system, and what was not exported by then is lost.",
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
        description="Subnet of a created file system, by resource id: recommended, one of its own sized for the "
        "file system (Microsoft's NSG guidance assumes it); the nodes' NSG admits its servers (TCP 988, "
        "1019-1023) from it. Default: the cluster's subnet (a warning at `cluster up`: the NSG then admits those "
        "ports from the whole subnet).",
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
