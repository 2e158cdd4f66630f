"""What the Azure twin's ARM state and its mixins share: ARM's error, resource ids, long-running
operations, the name rules and constants."""

from __future__ import annotations

import ipaddress
import re
import time
import uuid
from dataclasses import dataclass, field

NAMESPACE = uuid.UUID("6d1c1f0e-4c1b-4d59-9f5e-6b7a2d0c1a77")
DEFAULT_SUBSCRIPTION = "00000000-0000-4000-8000-00000000c1b0"
DEFAULT_TENANT = "00000000-0000-4000-8000-0000000000a1"

CANONICAL_TYPES = {
    t.lower(): t
    for t in (
        "Microsoft.Network/virtualNetworks",
        "Microsoft.Network/virtualNetworks/subnets",
        "Microsoft.Network/networkSecurityGroups",
        "Microsoft.Network/applicationSecurityGroups",
        "Microsoft.Network/networkInterfaces",
        "Microsoft.Network/natGateways",
        "Microsoft.Compute/proximityPlacementGroups",
        "Microsoft.Compute/virtualMachineScaleSets",
        "Microsoft.Compute/virtualMachines",
        "Microsoft.Compute/disks",
        "Microsoft.Compute/images",
        "Microsoft.Compute/availabilitySets",
        "Microsoft.Compute/snapshots",
        "Microsoft.Compute/galleries",
        "Microsoft.Compute/galleries/images",
        "Microsoft.Compute/galleries/images/versions",
        "Microsoft.ManagedIdentity/userAssignedIdentities",
        "Microsoft.KeyVault/vaults",
        "Microsoft.Storage/storageAccounts",
        "Microsoft.Storage/storageAccounts/fileServices/shares",
        "Microsoft.Storage/storageAccounts/blobServices/containers",
        "Microsoft.StorageCache/amlFilesystems",
    )
}
# Long-running PUTs (201 + Azure-AsyncOperation); the others answer at once.
LRO_PUT = {
    "microsoft.network/virtualnetworks",
    "microsoft.network/virtualnetworks/subnets",
    "microsoft.network/networksecuritygroups",
    "microsoft.network/applicationsecuritygroups",
    "microsoft.network/networkinterfaces",
    "microsoft.compute/virtualmachinescalesets",
    "microsoft.compute/virtualmachines",
    "microsoft.keyvault/vaults",
    "microsoft.storage/storageaccounts",
    "microsoft.storagecache/amlfilesystems",
}
# Types whose create answers 200, not 201 (their REST reference lists 200 only; the SDK accepts nothing else).
CREATED_WITH_200 = {"microsoft.compute/availabilitysets"}
# What a VM can be placed in: (its property, the resource type it names).
PLACEMENTS = (
    ("proximityPlacementGroup", "Microsoft.Compute/proximityPlacementGroups"),
    ("virtualMachineScaleSet", "Microsoft.Compute/virtualMachineScaleSets"),
    ("availabilitySet", "Microsoft.Compute/availabilitySets"),
)
SYNC_DELETE = {
    "microsoft.network/natgateways",
    "microsoft.compute/proximityplacementgroups",
    "microsoft.compute/availabilitysets",
    "microsoft.compute/galleries",
    "microsoft.compute/galleries/images",
    "microsoft.compute/galleries/images/versions",
    "microsoft.managedidentity/userassignedidentities",
    "microsoft.keyvault/vaults",
    "microsoft.compute/images",
    "microsoft.storage/storageaccounts",
    "microsoft.storage/storageaccounts/fileservices/shares",
    "microsoft.storage/storageaccounts/blobservices/containers",
}
RESERVED_ADMIN_NAMES = {
    "administrator",
    "admin",
    "user",
    "user1",
    "test",
    "user2",
    "test1",
    "user3",
    "admin1",
    "1",
    "123",
    "a",
    "actuser",
    "adm",
    "admin2",
    "aspnet",
    "backup",
    "console",
    "david",
    "guest",
    "john",
    "owner",
    "root",
    "server",
    "sql",
    "support",
    "support_388945a0",
    "sys",
    "test2",
    "test3",
    "user4",
    "user5",
}
TAG_FORBIDDEN = re.compile(r"[<>%&\\?/]")
STORAGE_ACCOUNT_NAME = re.compile(r"^[a-z0-9]{3,24}$")
SHARE_NAME = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]$")
CONTAINER_NAME = SHARE_NAME  # the same rules: 3-63 lowercase letters, digits, single hyphens
STORAGE_KINDS = {"StorageV2", "Storage", "BlobStorage", "BlockBlobStorage", "FileStorage"}
VAULT_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9-]{1,22}[a-zA-Z0-9]$")
RG_NAME = re.compile(r"^[-\w.()]{0,89}[-\w()]$")
RESOURCE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,78}[A-Za-z0-9_])?$")
DEFAULT_LIMITS = {"cores": 2000, "lowPriorityCores": 1000, "virtualMachines": 25000}
DEFAULT_FAMILY_LIMIT = 1000


class ArmError(Exception):
    def __init__(self, status: int, code: str, message: str, target: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.target = status, code, message, target
        self.custom_body: dict | None = None  # an API whose errors are not ARM's shape (checkAmlFSSubnets)
        self.extra: dict = {}  # more members of the error object: details, additionalInfo
        self.headers: dict[str, str] = {}  # of the answer: Retry-After, ...

    def body(self) -> dict:
        if self.custom_body is not None:
            return self.custom_body
        error = {"code": self.code, "message": self.message}
        if self.target:
            error["target"] = self.target
        return {"error": error | self.extra}


def not_found(rid: str, kind: str) -> ArmError:
    return ArmError(404, "ResourceNotFound", f"The Resource '{kind}/{rid.rsplit('/', 1)[-1]}' was not found.")


@dataclass
class ResourceId:
    subscription: str
    group: str
    namespace: str
    types: list[str]
    names: list[str]

    @property
    def type_key(self) -> str:
        return "/".join([self.namespace, *self.types]).lower()

    @property
    def type_name(self) -> str:
        return CANONICAL_TYPES.get(self.type_key, "/".join([self.namespace, *self.types]))

    @property
    def name(self) -> str:
        return self.names[-1]

    def __str__(self) -> str:
        canonical = self.type_name.split("/")
        parts = [f"/subscriptions/{self.subscription}/resourceGroups/{self.group}/providers/{canonical[0]}"]
        for kind, name in zip(canonical[1:], self.names, strict=True):
            parts.append(f"{kind}/{name}")
        return "/".join(parts)

    @property
    def key(self) -> str:
        return str(self).lower()

    def parent_group_id(self) -> str:
        return f"/subscriptions/{self.subscription}/resourceGroups/{self.group}"

    def parent(self) -> ResourceId:
        return ResourceId(self.subscription, self.group, self.namespace, self.types[:-1], self.names[:-1])

    @classmethod
    def parse(cls, rid: str) -> ResourceId:
        parts = rid.strip("/").split("/")
        if (
            len(parts) < 8
            or len(parts) % 2
            or parts[0].lower() != "subscriptions"
            or parts[2].lower() != "resourcegroups"
            or parts[4].lower() != "providers"
        ):
            raise ArmError(400, "InvalidResourceId", f"'{rid}' is not a valid resource id.")
        rest = parts[6:]
        return cls(parts[1], parts[3], parts[5], rest[0::2], rest[1::2])


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.0000000Z", time.gmtime())


def _cidr(value, target: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.ip_network(str(value), strict=True)
    except ValueError:
        raise ArmError(
            400, "InvalidCIDRNotation", f"The address prefix {value} has an invalid CIDR notation.", target
        ) from None


def _ref(value) -> str | None:
    return value.get("id") if isinstance(value, dict) else None


@dataclass
class Operation:
    id: str
    location: str
    namespace: str
    kind: str  # provision, fail, delete, power, delete-group, purge, evict
    target: str
    due: float
    status: str = "InProgress"
    error: dict | None = None
    params: dict = field(default_factory=dict)
    started: str = field(default_factory=_now)
