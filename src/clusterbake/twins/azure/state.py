"""What the Azure twin's subscription holds and the rules Azure applies to it (arm.py serves it over HTTPS).

One subscription of one tenant. Resources are kept by their ARM id (case-insensitive, as
ARM treats ids); every write is validated the way Azure validates it, and refused with
Azure's error codes (`{"error": {"code", "message", "target"}}`):

- resource groups (Microsoft.Resources): create, get, list, delete (a long-running
  operation that deletes everything in the group);
- virtual networks and subnets (address prefixes inside the network, no overlap; a subnet
  with network interfaces cannot be deleted), network security groups (rule priorities
  100-4096, unique per direction; Azure's default rules), application security groups,
  network interfaces (private IP Static, inside the subnet, not reserved, not taken; or
  Dynamic, the lowest free one; a NIC attached to a VM cannot be deleted);
- proximity placement groups, VM scale sets with Flexible orchestration (Uniform is not
  emulated), virtual machines (size offered in the location and zone, quota, NICs free,
  image reference, spot with an eviction policy on LowPriorityCapable sizes, user-assigned
  identities, an OS disk that outlives the VM unless its deleteOption is Delete), power
  actions (deallocate, start, powerOff, restart, simulateEviction) and the instance view;
- user-assigned managed identities (principal and client ids), Key Vault vaults (globally
  unique names, soft delete: a deleted vault is kept under deletedVaults until purged) and
  their secrets (data plane, access policies decide who may get/set/list/delete);
- ResourceSkus (skus.py), compute usages per location (quota: family vCPUs, total regional
  vCPUs, low-priority vCPUs) computed from the VMs that exist.

Long-running operations (PUT of networks, NICs, scale sets, VMs and vaults, deletes,
power actions) finish `operation_seconds` after they start; until then the resource says
provisioningState Creating/Updating/Deleting and the operation InProgress. Test switches:
`capacity` (size -> how many VMs of it can be allocated, and the error past that:
AllocationFailed, ZonalAllocationFailed or SkuNotAvailable) and `quota` (location ->
usage name -> limit).
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import re
import threading
import time
import uuid
from dataclasses import dataclass, field

from clusterbake.twins.azure import skus
from clusterbake.twins.azure.lustre import AmlfsMixin
from clusterbake.twins.azure.rbac import RbacMixin

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
        "Microsoft.Compute/proximityPlacementGroups",
        "Microsoft.Compute/virtualMachineScaleSets",
        "Microsoft.Compute/virtualMachines",
        "Microsoft.Compute/disks",
        "Microsoft.Compute/images",
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
SYNC_DELETE = {
    "microsoft.compute/proximityplacementgroups",
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

    def body(self) -> dict:
        if self.custom_body is not None:
            return self.custom_body
        error = {"code": self.code, "message": self.message}
        if self.target:
            error["target"] = self.target
        return {"error": error}


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


class ArmState(AmlfsMixin, RbacMixin):
    def __init__(
        self,
        subscription: str = DEFAULT_SUBSCRIPTION,
        tenant: str = DEFAULT_TENANT,
        operation_seconds: float = 0.2,
    ):
        self.lock = threading.RLock()
        self.subscription = subscription
        self.tenant = tenant
        self.operation_seconds = operation_seconds
        self.counter = 0
        self.groups: dict[str, dict] = {}
        self.resources: dict[str, dict] = {}
        self.deleted_vaults: dict[str, dict] = {}
        self.secrets: dict[str, dict[str, list[dict]]] = {}  # vault name -> secret name -> versions
        self.operations: dict[str, Operation] = {}
        self.capacity: dict[str, dict] = {}  # size (lower) -> {"limit": n, "code": ...}
        self.quota: dict[str, dict[str, int]] = {}  # location -> usage name -> limit
        self.role_definitions: dict[str, dict] = {}  # custom roles by GUID (lower case)
        self.role_assignments: dict[str, dict] = {}  # assignment id (lower case) -> assignment
        # Who sends the request being handled (arm.py sets it): (client id, createdByType) for systemData.
        self.actor: tuple[str, str] = ("clusterbake-twin", "Application")

    # --- persistence ------------------------------------------------------------------

    def snapshot(self) -> dict:
        with self.lock:
            return copy.deepcopy(
                {
                    "subscription": self.subscription,
                    "tenant": self.tenant,
                    "counter": self.counter,
                    "groups": self.groups,
                    "resources": self.resources,
                    "deleted_vaults": self.deleted_vaults,
                    "secrets": self.secrets,
                    "capacity": self.capacity,
                    "quota": self.quota,
                    "role_definitions": self.role_definitions,
                    "role_assignments": self.role_assignments,
                }
            )

    def restore(self, data: dict) -> None:
        with self.lock:
            for key in ("subscription", "tenant", "counter", "groups", "resources", "deleted_vaults"):
                setattr(self, key, data[key])
            self.secrets = data.get("secrets", {})
            self.capacity = data.get("capacity", {})
            self.quota = data.get("quota", {})
            self.role_definitions = data.get("role_definitions", {})
            self.role_assignments = data.get("role_assignments", {})
            # Operations are not kept across a restart: what was in flight finishes now.
            for key, resource in list(self.resources.items()):
                state = resource.get("properties", {}).get("provisioningState")
                if state == "Deleting":
                    self._remove(key)
                elif state in ("Creating", "Updating"):
                    resource["properties"]["provisioningState"] = "Succeeded"
                    if resource["type"] == "Microsoft.Compute/virtualMachines":
                        resource["_power"] = "running"
                if resource.get("_power") in ("starting", "stopping", "deallocating"):
                    resource["_power"] = {"starting": "running", "stopping": "stopped"}.get(
                        resource["_power"], "deallocated"
                    )
            for name, group in list(self.groups.items()):
                if group["properties"]["provisioningState"] == "Deleting":
                    self._delete_group_now(name)

    # --- ids ----------------------------------------------------------------------------

    def guid(self, purpose: str) -> str:
        """Deterministic: the same sequence of requests gives the same ids."""
        self.counter += 1
        return str(uuid.uuid5(NAMESPACE, f"{self.subscription}:{purpose}:{self.counter}"))

    def check_subscription(self, subscription: str) -> None:
        if subscription.lower() != self.subscription.lower():
            raise ArmError(404, "SubscriptionNotFound", f"The subscription '{subscription}' could not be found.")

    # --- operations ---------------------------------------------------------------------

    def start(self, kind: str, target: str, location: str, namespace: str, **params) -> Operation:
        op = Operation(
            id=self.guid("operation"),
            location=location,
            namespace=namespace,
            kind=kind,
            target=target,
            due=time.monotonic() + self.operation_seconds,
            params=params,
        )
        self.operations[op.id] = op
        return op

    def advance(self) -> None:
        """Finish the operations whose time has come (every request calls this first)."""
        now = time.monotonic()
        for op in sorted(self.operations.values(), key=lambda o: o.due):
            if op.status == "InProgress" and op.due <= now:
                self._finish(op)

    def _finish(self, op: Operation) -> None:
        resource = self.resources.get(op.target.lower())
        op.status = "Succeeded"
        if op.kind == "provision" and resource is not None:
            resource["properties"]["provisioningState"] = "Succeeded"
            if resource["type"] == "Microsoft.Compute/virtualMachines":
                resource["_power"] = "running"
        elif op.kind == "fail" and resource is not None:
            resource["properties"]["provisioningState"] = "Failed"
            resource["_power"] = "stopped" if resource.get("_power") == "starting" else None
            resource["_error"] = op.params["error"]
            op.status, op.error = "Failed", op.params["error"]
        elif op.kind == "delete":
            self._remove(op.target)
        elif op.kind == "power" and resource is not None:
            resource["_power"] = op.params["state"]
        elif op.kind == "delete-group":
            self._delete_group_now(op.target)
        elif op.kind == "purge":
            self.deleted_vaults.pop(op.target.lower(), None)
            self.secrets.pop(op.target.lower(), None)

    def operation(self, op_id: str) -> Operation:
        op = self.operations.get(op_id)
        if op is None:
            raise ArmError(404, "OperationNotFound", f"The operation '{op_id}' was not found.")
        return op

    # --- resource groups ----------------------------------------------------------------

    def _location(self, value, target: str = "location") -> str:
        if not value:
            raise ArmError(400, "LocationRequired", "The location property is required for this definition.")
        location = str(value).replace(" ", "").lower()
        if location not in skus.LOCATIONS:
            raise ArmError(
                400,
                "LocationNotAvailableForResourceType",
                f"The provided location '{value}' is not available for resource type. "
                f"List of available regions is '{','.join(skus.LOCATIONS)}'.",
                target,
            )
        return location

    @staticmethod
    def _tags(value) -> dict:
        tags = value or {}
        if not isinstance(tags, dict):
            raise ArmError(400, "InvalidTag", "The tags must be an object of names and string values.", "tags")
        if len(tags) > 50:
            raise ArmError(400, "InvalidTemplate", "A resource can have at most 50 tags.", "tags")
        for name, val in tags.items():
            if TAG_FORBIDDEN.search(name) or len(name) > 512 or len(str(val)) > 256:
                raise ArmError(400, "InvalidTagNameCharacters", f"The tag name '{name}' has invalid characters.")
        return dict(tags)

    def group(self, name: str) -> dict:
        found = self.groups.get(name.lower())
        if found is None:
            raise ArmError(404, "ResourceGroupNotFound", f"Resource group '{name}' could not be found.")
        return found

    def put_group(self, name: str, body: dict) -> tuple[int, dict]:
        if not RG_NAME.match(name):
            raise ArmError(400, "InvalidResourceGroup", f"The resource group name '{name}' is invalid.")
        location = self._location(body.get("location"))
        existing = self.groups.get(name.lower())
        if existing and existing["location"] != location:
            raise ArmError(
                409,
                "InvalidResourceGroupLocation",
                f"Invalid resource group location '{location}'. The Resource group already exists in location "
                f"'{existing['location']}'.",
            )
        if existing and existing["properties"]["provisioningState"] == "Deleting":
            raise ArmError(409, "ResourceGroupBeingDeleted", f"The resource group '{name}' is in deprovisioning state.")
        group = {
            "id": f"/subscriptions/{self.subscription}/resourceGroups/{existing['name'] if existing else name}",
            "name": existing["name"] if existing else name,
            "type": "Microsoft.Resources/resourceGroups",
            "location": location,
            "tags": self._tags(body.get("tags")),
            "properties": {"provisioningState": "Succeeded"},
        }
        self.groups[name.lower()] = group
        return (200 if existing else 201), group

    def delete_group(self, name: str) -> Operation | None:
        group = self.groups.get(name.lower())
        if group is None:
            return None
        group["properties"]["provisioningState"] = "Deleting"
        return self.start("delete-group", name, group["location"], "Microsoft.Resources")

    def _delete_group_now(self, name: str) -> None:
        prefix = f"/subscriptions/{self.subscription}/resourcegroups/{name.lower()}/"
        order = [
            "microsoft.compute/virtualmachines",
            "microsoft.compute/virtualmachinescalesets",
            "microsoft.network/networkinterfaces",
        ]
        keys = [k for k in self.resources if k.startswith(prefix)]
        keys.sort(key=lambda k: order.index(self._type_of(k)) if self._type_of(k) in order else len(order))
        for key in keys:
            if key in self.resources:
                resource = self.resources[key]
                if resource["type"] == "Microsoft.KeyVault/vaults":
                    self._soft_delete_vault(resource)
                self._remove(key)
        self.drop_assignments_below(f"/subscriptions/{self.subscription}/resourceGroups/{name}")
        self.groups.pop(name.lower(), None)

    def _type_of(self, key: str) -> str:
        return ResourceId.parse(key).type_key

    # --- generic resources --------------------------------------------------------------

    def get(self, rid: ResourceId) -> dict:
        self.check_subscription(rid.subscription)
        self.group(rid.group)
        resource = self.resources.get(rid.key)
        if resource is None:
            raise not_found(str(rid), rid.type_name)
        return self.view(resource)

    def view(self, resource: dict, expand_instance_view: bool = False) -> dict:
        """A resource as ARM returns it (computed parts filled in, private keys dropped)."""
        out = {k: copy.deepcopy(v) for k, v in resource.items() if not k.startswith("_")}
        rtype = resource["type"]
        if rtype == "Microsoft.Network/virtualNetworks":
            out["properties"]["subnets"] = [
                self.view(self.resources[k])
                for k in sorted(self.resources)
                if k.startswith(resource["id"].lower() + "/subnets/")
            ]
        elif rtype == "Microsoft.Network/virtualNetworks/subnets":
            out["properties"]["ipConfigurations"] = [
                {"id": f"{nic['id']}/ipConfigurations/{c['name']}"}
                for nic in self._of_type("Microsoft.Network/networkInterfaces")
                for c in nic["properties"]["ipConfigurations"]
                if _ref(c["properties"].get("subnet", {})).lower() == resource["id"].lower()
            ]
        elif rtype == "Microsoft.Compute/virtualMachines" and expand_instance_view:
            out["properties"]["instanceView"] = self.instance_view(resource)
        elif rtype in ("Microsoft.Compute/proximityPlacementGroups", "Microsoft.Compute/virtualMachineScaleSets"):
            key = "proximityPlacementGroup" if "proximity" in rtype else "virtualMachineScaleSet"
            members = [
                {"id": vm["id"]}
                for vm in self._of_type("Microsoft.Compute/virtualMachines")
                if (_ref(vm["properties"].get(key)) or "").lower() == resource["id"].lower()
            ]
            if "proximity" in rtype:
                out["properties"]["virtualMachines"] = members
        return out

    def _of_type(self, rtype: str) -> list[dict]:
        return [r for r in self.resources.values() if r["type"] == rtype]

    def _require(self, rid: str | None, rtype: str, target: str) -> dict:
        if not rid:
            raise ArmError(400, "InvalidParameter", f"Required parameter '{target}' is missing (null).", target)
        found = self.resources.get(rid.lower())
        if found is None or found["type"] != rtype:
            raise ArmError(
                400 if rtype != "Microsoft.Network/virtualNetworks/subnets" else 404,
                "InvalidResourceReference" if rtype != "Microsoft.Network/virtualNetworks/subnets" else "NotFound",
                f"Resource {rid} referenced by resource {target} was not found. Please make sure that the "
                "referenced resource exists, and that both resources are in the same region.",
                target,
            )
        return found

    def list(self, subscription: str, group: str | None, type_key: str, parent: str | None = None) -> list[dict]:
        self.check_subscription(subscription)
        if group is not None:
            self.group(group)
        found = []
        for key in sorted(self.resources):
            resource = self.resources[key]
            if resource["type"].lower() != type_key:
                continue
            rid = ResourceId.parse(key)
            if group is not None and rid.group.lower() != group.lower():
                continue
            if parent is not None and not key.startswith(parent.lower() + "/"):
                continue
            found.append(self.view(resource))
        return found

    def generic_list(self, subscription: str, group: str | None, tag: tuple[str, str | None] | None, rtype: str | None):
        """GET /subscriptions/{s}[/resourceGroups/{g}]/resources: top-level resources (not subnets)."""
        self.check_subscription(subscription)
        if group is not None:
            self.group(group)
        found = []
        for key in sorted(self.resources):
            resource = self.resources[key]
            rid = ResourceId.parse(key)
            if len(rid.types) != 1:
                continue
            if group is not None and rid.group.lower() != group.lower():
                continue
            if rtype and resource["type"].lower() != rtype.lower():
                continue
            if tag is not None:
                tags = {k.lower(): v for k, v in (resource.get("tags") or {}).items()}
                if tag[0].lower() not in tags or (tag[1] is not None and tags[tag[0].lower()] != tag[1]):
                    continue
            found.append(
                {k: resource[k] for k in ("id", "name", "type", "location", "tags") if k in resource}
                | ({"zones": resource["zones"]} if resource.get("zones") else {})
            )
        return found

    def put(self, rid: ResourceId, body: dict) -> tuple[int, dict, Operation | None]:
        self.check_subscription(rid.subscription)
        group = self.group(rid.group)
        if group["properties"]["provisioningState"] == "Deleting":
            raise ArmError(409, "ResourceGroupBeingDeleted", f"The resource group '{rid.group}' is being deleted.")
        handler = getattr(self, "_put_" + rid.type_key.replace("microsoft.", "").replace("/", "_"), None)
        if handler is None:
            raise ArmError(
                400,
                "NoRegisteredProviderFound",
                f"No registered resource provider found for type '{rid.type_name}' (not emulated by this twin).",
            )
        if not RESOURCE_NAME.match(rid.name) and rid.type_key != "microsoft.keyvault/vaults":
            raise ArmError(400, "InvalidResourceName", f"Resource name {rid.name} is invalid.")
        existing = self.resources.get(rid.key)
        if existing is not None and existing["properties"].get("provisioningState") in ("Deleting",):
            raise ArmError(409, "Conflict", f"The resource {rid} is being deleted.")
        if not isinstance(body, dict):
            raise ArmError(
                400, "InvalidRequestContent", "The request content was invalid and could not be deserialized."
            )
        resource = handler(rid, body, existing)
        resource.setdefault("id", str(rid))
        resource.setdefault("name", rid.name)
        resource.setdefault("type", rid.type_name)
        op = None
        if rid.type_key in LRO_PUT and resource.get("_lro", True):
            op = resource.pop("_op", None) or self.start(
                "provision", str(rid), resource.get("location", group["location"]), rid.namespace
            )
            if op.kind == "provision":
                resource["properties"]["provisioningState"] = "Updating" if existing else "Creating"
        resource.pop("_lro", None)
        resource["systemData"] = self._system_data(existing)
        self.resources[rid.key] = resource
        return (200 if existing else 201), self.view(resource), op

    def _system_data(self, existing: dict | None) -> dict:
        """ARM's systemData: who created and last changed a resource (`actor`: the request's principal)."""
        who, kind = self.actor
        now = _now()
        data = dict((existing or {}).get("systemData") or {"createdBy": who, "createdByType": kind, "createdAt": now})
        return data | {"lastModifiedBy": who, "lastModifiedByType": kind, "lastModifiedAt": now}

    def delete(self, rid: ResourceId) -> tuple[int, Operation | None]:
        self.check_subscription(rid.subscription)
        self.group(rid.group)
        resource = self.resources.get(rid.key)
        if resource is None:
            return 204, None
        self._check_delete(rid, resource)
        if rid.type_key == "microsoft.keyvault/vaults":
            self._soft_delete_vault(resource)
        if rid.type_key in SYNC_DELETE:
            self._remove(rid.key)
            return 200, None
        resource["properties"]["provisioningState"] = "Deleting"
        return 202, self.start("delete", str(rid), resource.get("location", ""), rid.namespace)

    def _check_delete(self, rid: ResourceId, resource: dict) -> None:
        rtype = resource["type"]
        rid_lower = resource["id"].lower()
        if rtype == "Microsoft.Network/virtualNetworks/subnets" and (
            self.view(resource)["properties"]["ipConfigurations"] or self.amlfs_addresses(resource["id"])
        ):
            raise ArmError(
                400,
                "InUseSubnetCannotBeDeleted",
                f"Subnet {rid.name} is in use by network interfaces and cannot be deleted.",
            )
        if rtype == "Microsoft.Network/virtualNetworks":
            for key in self.resources:
                if key.startswith(rid_lower + "/subnets/"):
                    self._check_delete(ResourceId.parse(key), self.resources[key])
        if rtype == "Microsoft.Network/networkInterfaces" and resource["properties"].get("virtualMachine"):
            raise ArmError(
                400,
                "NicInUse",
                f"Network Interface {resource['id']} is used by existing resource "
                f"{resource['properties']['virtualMachine']['id']}. In order to delete the network interface, "
                "it must be dissociated from the resource.",
            )
        refs = {
            "Microsoft.Network/networkSecurityGroups": (
                "InUseNetworkSecurityGroupCannotBeDeleted",
                "networkSecurityGroup",
            ),
            "Microsoft.Network/applicationSecurityGroups": ("InUseApplicationSecurityGroupCannotBeDeleted", "asg"),
            "Microsoft.Compute/proximityPlacementGroups": ("OperationNotAllowed", "proximityPlacementGroup"),
            "Microsoft.Compute/virtualMachineScaleSets": ("OperationNotAllowed", "virtualMachineScaleSet"),
        }
        if rtype in refs:
            code, key = refs[rtype]
            users = [r["id"] for r in self.resources.values() if self._references(r, key, rid_lower)]
            if users:
                raise ArmError(
                    400 if code.startswith("InUse") else 409,
                    code,
                    f"{rtype.split('/')[-1]} {rid.name} is in use by {', '.join(users[:5])} and cannot be deleted.",
                )

    def _references(self, resource: dict, key: str, target: str) -> bool:
        props = resource.get("properties", {})
        if key == "asg":
            groups = [
                g
                for c in props.get("ipConfigurations", [])
                for g in c["properties"].get("applicationSecurityGroups", [])
            ]
            groups += [
                g
                for rule in props.get("securityRules", [])
                for side in ("sourceApplicationSecurityGroups", "destinationApplicationSecurityGroups")
                for g in rule["properties"].get(side, [])
            ]
            return any((_ref(g) or "").lower() == target for g in groups)
        return (_ref(props.get(key)) or "").lower() == target

    def _remove(self, key: str) -> None:
        resource = self.resources.pop(key.lower(), None)
        if resource is None:
            return
        for child in [k for k in self.resources if k.startswith(key.lower() + "/")]:
            self.resources.pop(child)
        self.drop_assignments_below(resource["id"])
        if resource["type"] == "Microsoft.Compute/virtualMachines":
            for ref in resource["properties"]["networkProfile"].get("networkInterfaces", []):
                nic = self.resources.get(ref["id"].lower())
                if nic is None:
                    continue
                nic["properties"].pop("virtualMachine", None)
                if (ref.get("properties") or {}).get("deleteOption") == "Delete":
                    self.resources.pop(ref["id"].lower(), None)
            disk = resource["properties"]["storageProfile"]["osDisk"]
            if disk.get("deleteOption") == "Delete":
                self.resources.pop(disk["managedDisk"]["id"].lower(), None)
            elif disk["managedDisk"]["id"].lower() in self.resources:
                self.resources[disk["managedDisk"]["id"].lower()]["properties"]["diskState"] = "Unattached"
                self.resources[disk["managedDisk"]["id"].lower()].pop("managedBy", None)

    # --- network ------------------------------------------------------------------------

    def _base(self, rid: ResourceId, body: dict, existing: dict | None, location: bool = True) -> dict:
        base = {"id": str(rid) if not existing else existing["id"], "name": existing["name"] if existing else rid.name}
        base["type"] = rid.type_name
        if location:
            base["location"] = self._location(body.get("location"))
            if existing and existing.get("location") and existing["location"] != base["location"]:
                raise ArmError(
                    400,
                    "InvalidResourceLocation",
                    f"The resource '{rid.name}' already exists in location '{existing['location']}'. A resource "
                    "with the same name cannot be created in location '{base['location']}'.",
                )
            base["tags"] = self._tags(body.get("tags"))
        base["etag"] = f'W/"{self.guid("etag")}"'
        return base

    def _put_network_virtualnetworks(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        props = body.get("properties") or {}
        prefixes = (props.get("addressSpace") or {}).get("addressPrefixes") or []
        if not prefixes:
            raise ArmError(
                400,
                "InvalidRequestFormat",
                "The virtual network needs at least one address prefix.",
                "properties.addressSpace.addressPrefixes",
            )
        networks = [_cidr(p, "properties.addressSpace.addressPrefixes") for p in prefixes]
        resource["properties"] = {
            "addressSpace": {"addressPrefixes": [str(n) for n in networks]},
            "resourceGuid": existing["properties"]["resourceGuid"] if existing else self.guid("vnet"),
            "provisioningState": "Succeeded",
        }
        self.resources[rid.key] = resource  # subnets below find their network
        if "subnets" in props:
            wanted = {s["name"].lower(): s for s in props["subnets"] or []}
            for key in [k for k in self.resources if k.startswith(rid.key + "/subnets/")]:
                if key.rsplit("/", 1)[-1] not in wanted:
                    self._check_delete(ResourceId.parse(key), self.resources[key])
                    self._remove(key)
            for subnet in wanted.values():
                child = ResourceId(
                    rid.subscription, rid.group, rid.namespace, [*rid.types, "subnets"], [*rid.names, subnet["name"]]
                )
                self.resources[child.key] = self._put_network_virtualnetworks_subnets(
                    child, subnet, self.resources.get(child.key)
                ) | {"id": str(child), "name": subnet["name"], "type": child.type_name}
                self.resources[child.key]["properties"]["provisioningState"] = "Succeeded"
        return resource

    def _put_network_virtualnetworks_subnets(self, rid, body, existing):
        vnet = self.resources.get(rid.parent().key)
        if vnet is None:
            raise not_found(str(rid.parent()), "Microsoft.Network/virtualNetworks")
        props = body.get("properties") or {}
        prefix = _cidr(props.get("addressPrefix"), "properties.addressPrefix")
        if not any(
            prefix.subnet_of(ipaddress.ip_network(p)) for p in vnet["properties"]["addressSpace"]["addressPrefixes"]
        ):
            raise ArmError(
                400,
                "NetcfgSubnetRangeOutsideVnet",
                f"Subnet '{rid.name}' is not valid because its IP address range is outside the IP address range "
                "of virtual network.",
            )
        for key, other in self.resources.items():
            sibling = key.startswith(rid.parent().key + "/subnets/") and key != rid.key
            if sibling and prefix.overlaps(ipaddress.ip_network(other["properties"]["addressPrefix"])):
                raise ArmError(
                    400,
                    "NetcfgSubnetRangesOverlap",
                    f"Subnet '{rid.name}' is not valid because its IP address range overlaps with that of "
                    f"an existing subnet in virtual network '{vnet['name']}'.",
                )
        resource = self._base(rid, body, existing, location=False)
        resource["properties"] = {"addressPrefix": str(prefix), "provisioningState": "Succeeded"}
        endpoints = props.get("serviceEndpoints") or []
        if endpoints:
            location = vnet["location"]
            resource["properties"]["serviceEndpoints"] = [
                {
                    "service": e.get("service"),
                    "locations": e.get("locations") or [location],
                    "provisioningState": "Succeeded",
                }
                for e in endpoints
            ]
        if props.get("networkSecurityGroup"):
            nsg = self._require(
                _ref(props["networkSecurityGroup"]), "Microsoft.Network/networkSecurityGroups", "networkSecurityGroup"
            )
            resource["properties"]["networkSecurityGroup"] = {"id": nsg["id"]}
        return resource

    def _put_network_applicationsecuritygroups(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        resource["properties"] = {
            "resourceGuid": existing["properties"]["resourceGuid"] if existing else self.guid("asg"),
            "provisioningState": "Succeeded",
        }
        return resource

    DEFAULT_RULES = (
        ("AllowVnetInBound", 65000, "Inbound", "Allow", "VirtualNetwork", "VirtualNetwork"),
        ("AllowAzureLoadBalancerInBound", 65001, "Inbound", "Allow", "AzureLoadBalancer", "*"),
        ("DenyAllInBound", 65500, "Inbound", "Deny", "*", "*"),
        ("AllowVnetOutBound", 65000, "Outbound", "Allow", "VirtualNetwork", "VirtualNetwork"),
        ("AllowInternetOutBound", 65001, "Outbound", "Allow", "*", "Internet"),
        ("DenyAllOutBound", 65500, "Outbound", "Deny", "*", "*"),
    )

    def _put_network_networksecuritygroups(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        rules = []
        seen: dict[tuple[str, int], str] = {}
        for index, rule in enumerate((body.get("properties") or {}).get("securityRules") or []):
            target = f"properties.securityRules[{index}]"
            p = rule.get("properties") or {}
            name = rule.get("name")
            if not name:
                raise ArmError(400, "InvalidRequestFormat", "A security rule needs a name.", target)
            priority = p.get("priority")
            if not isinstance(priority, int) or not 100 <= priority <= 4096:
                raise ArmError(
                    400,
                    "SecurityRuleInvalidPriority",
                    f"Security rule {name} has invalid Priority. Value provided: {priority}. Allowed range 100-4096.",
                )
            direction = p.get("direction")
            if direction not in ("Inbound", "Outbound"):
                raise ArmError(
                    400, "InvalidRequestFormat", f"Security rule {name}: direction Inbound or Outbound.", target
                )
            if (direction, priority) in seen:
                raise ArmError(
                    400,
                    "SecurityRuleConflict",
                    f"Security rule {name} conflicts with rule {seen[(direction, priority)]}. Rules cannot have the "
                    "same Priority and Direction.",
                )
            seen[(direction, priority)] = name
            if p.get("access") not in ("Allow", "Deny"):
                raise ArmError(400, "InvalidRequestFormat", f"Security rule {name}: access Allow or Deny.", target)
            if p.get("protocol") not in ("Tcp", "Udp", "Icmp", "Esp", "Ah", "*"):
                raise ArmError(
                    400,
                    "SecurityRuleInvalidProtocol",
                    f"Security rule {name} has invalid protocol {p.get('protocol')}.",
                )
            for side in ("source", "destination"):
                groups = p.get(f"{side}ApplicationSecurityGroups") or []
                for group in groups:
                    self._require(_ref(group), "Microsoft.Network/applicationSecurityGroups", f"{target}.{side}")
                prefixes = [p.get(f"{side}AddressPrefix")] if p.get(f"{side}AddressPrefix") else []
                prefixes += p.get(f"{side}AddressPrefixes") or []
                if bool(groups) == bool(prefixes):
                    raise ArmError(
                        400,
                        "SecurityRuleParameterContainsUnsupportedValue" if groups else "InvalidRequestFormat",
                        f"Security rule {name}: give {side} address prefixes or {side} application security groups.",
                    )
                for prefix in prefixes:
                    if prefix not in ("*", "VirtualNetwork", "Internet", "AzureLoadBalancer"):
                        _cidr(prefix, f"{target}.{side}AddressPrefix")
            rules.append(
                {
                    "name": name,
                    "id": f"{rid}/securityRules/{name}",
                    "type": "Microsoft.Network/networkSecurityGroups/securityRules",
                    "properties": {**p, "provisioningState": "Succeeded"},
                }
            )
        resource["properties"] = {
            "securityRules": rules,
            "defaultSecurityRules": [
                {
                    "name": name,
                    "id": f"{rid}/defaultSecurityRules/{name}",
                    "properties": {
                        "priority": priority,
                        "direction": direction,
                        "access": access,
                        "protocol": "*",
                        "sourceAddressPrefix": source,
                        "destinationAddressPrefix": dest,
                        "sourcePortRange": "*",
                        "destinationPortRange": "*",
                        "provisioningState": "Succeeded",
                    },
                }
                for name, priority, direction, access, source, dest in self.DEFAULT_RULES
            ],
            "resourceGuid": existing["properties"]["resourceGuid"] if existing else self.guid("nsg"),
            "provisioningState": "Succeeded",
        }
        return resource

    def _addresses_in_use(self, subnet_id: str, except_nic: str | None = None) -> set[str]:
        """Private addresses of the subnet's NICs and of the file systems (AMLFS) in it."""
        return {
            c["properties"].get("privateIPAddress")
            for nic in self._of_type("Microsoft.Network/networkInterfaces")
            if nic["id"].lower() != (except_nic or "").lower()
            for c in nic["properties"]["ipConfigurations"]
            if (_ref(c["properties"].get("subnet")) or "").lower() == subnet_id.lower()
        } | self.amlfs_addresses(subnet_id)

    def _put_network_networkinterfaces(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        props = body.get("properties") or {}
        configs = props.get("ipConfigurations") or []
        if not configs:
            raise ArmError(
                400,
                "InvalidRequestFormat",
                "A network interface needs at least one IP configuration.",
                "properties.ipConfigurations",
            )
        out_configs = []
        for index, config in enumerate(configs):
            target = f"properties.ipConfigurations[{index}]"
            cp = config.get("properties") or {}
            subnet = self._require(
                _ref(cp.get("subnet")), "Microsoft.Network/virtualNetworks/subnets", f"{target}.subnet"
            )
            vnet = self.resources[ResourceId.parse(subnet["id"]).parent().key]
            if vnet["location"] != resource["location"]:
                raise ArmError(
                    400,
                    "InvalidResourceReference",
                    f"Subnet {subnet['id']} is in {vnet['location']}, the network interface in {resource['location']}.",
                )
            network = ipaddress.ip_network(subnet["properties"]["addressPrefix"])
            hosts = list(network.hosts())
            reserved = {str(a) for a in hosts[:3]} | {str(network.broadcast_address)}
            in_use = self._addresses_in_use(subnet["id"], except_nic=str(rid))
            method = cp.get("privateIPAllocationMethod") or ("Static" if cp.get("privateIPAddress") else "Dynamic")
            if method == "Static":
                address = cp.get("privateIPAddress")
                try:
                    ip = ipaddress.ip_address(address)
                except ValueError:
                    raise ArmError(400, "InvalidPrivateIPAddressFormat", f"{address} is not an IP address.") from None
                if ip not in network:
                    raise ArmError(
                        400,
                        "PrivateIPAddressNotInSubnet",
                        f"IP configuration {config.get('name')} is referencing private IP address {address} which "
                        f"is not in subnet {subnet['id']} ({network}).",
                    )
                if str(ip) in reserved:
                    raise ArmError(
                        400,
                        "PrivateIPAddressIsReserved",
                        f"Private static IP address {address} is reserved: Azure keeps the first four addresses "
                        "and the last of every subnet.",
                    )
                if str(ip) in in_use:
                    raise ArmError(
                        400,
                        "PrivateIPAddressInUse",
                        f"IP configuration {config.get('name')} is using the private IP address {address} which is "
                        f"already allocated to resource {self._owner_of(subnet['id'], str(ip))}.",
                    )
            elif method == "Dynamic":
                previous = None
                if existing:
                    previous = next(
                        (
                            c["properties"]["privateIPAddress"]
                            for c in existing["properties"]["ipConfigurations"]
                            if c["name"] == config.get("name")
                        ),
                        None,
                    )
                address = previous or next(
                    (str(a) for a in hosts if str(a) not in reserved and str(a) not in in_use), None
                )
                if address is None:
                    raise ArmError(
                        400,
                        "SubnetIsFull",
                        f"Subnet {subnet['name']} with address prefix {network} does not have "
                        "enough capacity for 1 IP addresses.",
                    )
            else:
                raise ArmError(400, "InvalidRequestFormat", f"privateIPAllocationMethod {method}.", target)
            groups = []
            for group in cp.get("applicationSecurityGroups") or []:
                groups.append(
                    {
                        "id": self._require(
                            _ref(group),
                            "Microsoft.Network/applicationSecurityGroups",
                            f"{target}.applicationSecurityGroups",
                        )["id"]
                    }
                )
            out_configs.append(
                {
                    "name": config.get("name") or "ipconfig1",
                    "id": f"{rid}/ipConfigurations/{config.get('name') or 'ipconfig1'}",
                    "properties": {
                        "privateIPAddress": address,
                        "privateIPAllocationMethod": method,
                        "privateIPAddressVersion": "IPv4",
                        "subnet": {"id": subnet["id"]},
                        "primary": index == 0,
                        "applicationSecurityGroups": groups,
                        "provisioningState": "Succeeded",
                    },
                }
            )
        resource["properties"] = {
            "ipConfigurations": out_configs,
            "enableAcceleratedNetworking": bool(props.get("enableAcceleratedNetworking")),
            "macAddress": existing["properties"]["macAddress"]
            if existing
            else "00-0D-3A-" + "-".join(self.guid("mac")[i : i + 2].upper() for i in (0, 2, 4)),
            "resourceGuid": existing["properties"]["resourceGuid"] if existing else self.guid("nic"),
            "provisioningState": "Succeeded",
        }
        if props.get("networkSecurityGroup"):
            nsg = self._require(
                _ref(props["networkSecurityGroup"]),
                "Microsoft.Network/networkSecurityGroups",
                "properties.networkSecurityGroup",
            )
            resource["properties"]["networkSecurityGroup"] = {"id": nsg["id"]}
        if existing and existing["properties"].get("virtualMachine"):
            resource["properties"]["virtualMachine"] = existing["properties"]["virtualMachine"]
        return resource

    def _owner_of(self, subnet_id: str, address: str) -> str:
        for nic in self._of_type("Microsoft.Network/networkInterfaces"):
            for c in nic["properties"]["ipConfigurations"]:
                if (
                    c["properties"]["privateIPAddress"] == address
                    and _ref(c["properties"]["subnet"]).lower() == subnet_id.lower()
                ):
                    return c["id"]
        for fs in self._of_type("Microsoft.StorageCache/amlFilesystems"):
            if fs["properties"]["clientInfo"]["mgsAddress"] == address:
                return fs["id"]
        return "?"

    # --- compute ------------------------------------------------------------------------

    def _put_compute_images(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        resource["properties"] = {**(body.get("properties") or {}), "provisioningState": "Succeeded"}
        return resource

    def _put_compute_proximityplacementgroups(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        props = body.get("properties") or {}
        kind = props.get("proximityPlacementGroupType", "Standard")
        if kind not in ("Standard", "Ultra"):
            raise ArmError(
                400, "InvalidParameter", f"proximityPlacementGroupType {kind}.", "proximityPlacementGroupType"
            )
        resource["properties"] = {"proximityPlacementGroupType": kind, "provisioningState": "Succeeded"}
        if props.get("intent"):
            resource["properties"]["intent"] = props["intent"]
        if body.get("zones"):
            resource["zones"] = list(body["zones"])
        return resource

    def _put_compute_virtualmachinescalesets(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        props = body.get("properties") or {}
        if props.get("orchestrationMode") != "Flexible":
            raise ArmError(
                400,
                "InvalidParameter",
                "This twin emulates scale sets with orchestrationMode Flexible only (VMs created on their own "
                "and added to the set by their virtualMachineScaleSet reference).",
                "properties.orchestrationMode",
            )
        if props.get("virtualMachineProfile"):
            raise ArmError(
                400,
                "InvalidParameter",
                "virtualMachineProfile is not emulated by this twin; create VMs that reference the scale set.",
                "properties.virtualMachineProfile",
            )
        faults = props.get("platformFaultDomainCount")
        if faults not in (1, 2, 3, 5):
            raise ArmError(
                400,
                "InvalidParameter",
                "Required parameter 'platformFaultDomainCount' is missing or invalid (1, 2, 3 or 5).",
                "properties.platformFaultDomainCount",
            )
        resource["properties"] = {
            "orchestrationMode": "Flexible",
            "platformFaultDomainCount": faults,
            "singlePlacementGroup": bool(props.get("singlePlacementGroup", False)),
            "uniqueId": existing["properties"]["uniqueId"] if existing else self.guid("vmss"),
            "provisioningState": "Succeeded",
        }
        if props.get("proximityPlacementGroup"):
            ppg = self._require(
                _ref(props["proximityPlacementGroup"]),
                "Microsoft.Compute/proximityPlacementGroups",
                "properties.proximityPlacementGroup",
            )
            resource["properties"]["proximityPlacementGroup"] = {"id": ppg["id"]}
        if body.get("zones"):
            resource["zones"] = list(body["zones"])
        return resource

    def usage(self, location: str) -> dict[str, tuple[int, int, str]]:
        """usage name -> (current, limit, localized name) for a location."""
        location = location.lower()
        limits = self.quota.get(location, {})
        current: dict[str, int] = {"cores": 0, "lowPriorityCores": 0, "virtualMachines": 0}
        for vm in self._of_type("Microsoft.Compute/virtualMachines"):
            if vm["location"] != location or vm["properties"].get("provisioningState") == "Failed":
                continue
            entry = skus.lookup(vm["properties"]["hardwareProfile"]["vmSize"], location)
            if entry is None:
                continue
            vcpus = int(skus.capability(entry, "vCPUs"))
            current["virtualMachines"] += 1
            if vm["properties"].get("priority") in ("Spot", "Low"):
                current["lowPriorityCores"] += vcpus
            else:
                current["cores"] += vcpus
                current[entry["family"]] = current.get(entry["family"], 0) + vcpus
        result = {
            "cores": (current["cores"], limits.get("cores", DEFAULT_LIMITS["cores"]), "Total Regional vCPUs"),
            "lowPriorityCores": (
                current["lowPriorityCores"],
                limits.get("lowPriorityCores", DEFAULT_LIMITS["lowPriorityCores"]),
                "Total Regional Low-priority vCPUs",
            ),
            "virtualMachines": (
                current["virtualMachines"],
                limits.get("virtualMachines", DEFAULT_LIMITS["virtualMachines"]),
                "Virtual Machines",
            ),
        }
        for family, name in skus.FAMILY_NAMES.items():
            result[family] = (current.get(family, 0), limits.get(family, DEFAULT_FAMILY_LIMIT), name)
        return result

    def _check_quota(self, location: str, entry: dict, spot: bool) -> None:
        vcpus = int(skus.capability(entry, "vCPUs"))
        usage = self.usage(location)
        names = ["lowPriorityCores"] if spot else [entry["family"], "cores"]
        for name in names:
            current, limit, localized = usage[name]
            if current + vcpus > limit:
                raise ArmError(
                    409,
                    "OperationNotAllowed",
                    f"Operation could not be completed as it results in exceeding approved {name} Cores quota. "
                    f"Additional details - Deployment Model: Resource Manager, Location: {location}, Current Limit: "
                    f"{limit}, Current Usage: {current}, Additional Required: {vcpus}, (Minimum) New Limit Required: "
                    f"{current + vcpus}. Submit a request for Quota increase ({localized}).",
                )

    def _put_compute_virtualmachines(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        location = resource["location"]
        props = body.get("properties") or {}
        size = (props.get("hardwareProfile") or {}).get("vmSize")
        if existing:
            # An update: tags (and nothing the twin would have to re-provision).
            if size and size.lower() != existing["properties"]["hardwareProfile"]["vmSize"].lower():
                raise ArmError(
                    409,
                    "OperationNotAllowed",
                    "Changing the size of a VM is not emulated by this twin; delete and create it again.",
                )
            updated = copy.deepcopy(existing)
            updated["tags"] = resource["tags"]
            if body.get("identity") and body["identity"] != existing.get("identity"):
                updated["identity"] = self._vm_identity(rid, body["identity"])
            updated["_lro"] = False
            return updated
        if not size:
            raise ArmError(
                400, "InvalidParameter", "Required parameter 'vmSize' is missing (null).", "hardwareProfile.vmSize"
            )
        entry = skus.lookup(size, location)
        zones = list(body.get("zones") or [])
        if len(zones) > 1:
            raise ArmError(400, "InvalidParameter", "A virtual machine is placed in at most one zone.", "zones")
        if entry is None or any(r["type"] == "Location" for r in entry["restrictions"]):
            raise ArmError(
                409,
                "SkuNotAvailable",
                f"The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: {size}' "
                f"is currently not available in location '{location}'. Please try another size or deploy to a "
                "different location or different zone. See https://aka.ms/azureskunotavailable for details.",
            )
        if zones:
            restricted = {
                z for r in entry["restrictions"] if r["type"] == "Zone" for z in r["restrictionInfo"]["zones"]
            }
            if zones[0] not in entry["locationInfo"][0]["zones"] or zones[0] in restricted:
                raise ArmError(
                    409,
                    "SkuNotAvailable",
                    f"The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: "
                    f"{size}' is currently not available in location '{location}' zones '{zones[0]}'. Please try "
                    "another size or deploy to a different location or different zone.",
                )
        size = entry["name"]
        priority = props.get("priority") or "Regular"
        if priority not in ("Regular", "Low", "Spot"):
            raise ArmError(400, "InvalidParameter", f"The value '{priority}' of priority is not valid.", "priority")
        spot = priority != "Regular"
        if spot:
            if skus.capability(entry, "LowPriorityCapable") != "True":
                raise ArmError(
                    409,
                    "SkuNotAvailable",
                    f"The requested VM size {size} is not available for Spot (LowPriorityCapable False) in "
                    f"'{location}'.",
                )
            if props.get("evictionPolicy") not in ("Delete", "Deallocate"):
                raise ArmError(
                    400,
                    "InvalidParameter",
                    "Required parameter 'evictionPolicy' is missing or invalid for a Spot virtual machine "
                    "(Delete or Deallocate).",
                    "evictionPolicy",
                )
        elif props.get("evictionPolicy"):
            raise ArmError(
                400, "InvalidParameter", "evictionPolicy is only for Spot virtual machines.", "evictionPolicy"
            )
        storage = props.get("storageProfile") or {}
        image = storage.get("imageReference") or {}
        if image.get("id"):
            found = self.resources.get(image["id"].lower())
            if found is None:
                raise ArmError(
                    404,
                    "NotFound",
                    f"The platform image or managed image '{image['id']}' was not found.",
                    "imageReference",
                )
        elif not all(image.get(k) for k in ("publisher", "offer", "sku", "version")):
            raise ArmError(
                400,
                "InvalidParameter",
                "The value of parameter imageReference is invalid: give id, or publisher, offer, sku and version.",
                "imageReference",
            )
        os_profile = props.get("osProfile") or {}
        admin = os_profile.get("adminUsername")
        if not admin or admin.lower() in RESERVED_ADMIN_NAMES:
            raise ArmError(
                400, "InvalidParameter", f"The Admin Username specified is not allowed: {admin!r}.", "adminUsername"
            )
        linux = os_profile.get("linuxConfiguration") or {}
        keys = ((linux.get("ssh") or {}).get("publicKeys")) or []
        if linux.get("disablePasswordAuthentication") and not keys:
            raise ArmError(
                400,
                "InvalidParameter",
                "Authentication using either SSH or by user name and password must be enabled in Linux profile.",
                "linuxConfiguration",
            )
        for key in keys:
            if key.get("path") != f"/home/{admin}/.ssh/authorized_keys":
                raise ArmError(
                    400,
                    "InvalidParameter",
                    f"Destination path for SSH public keys is currently limited to its default value "
                    f"/home/{admin}/.ssh/authorized_keys due to a known issue in Linux provisioning agent.",
                    "linuxConfiguration.ssh.publicKeys.path",
                )
        for key in ("customData",):
            if os_profile.get(key):
                try:
                    base64.b64decode(os_profile[key], validate=True)
                except ValueError:
                    raise ArmError(400, "InvalidParameter", f"{key} must be base64.", f"osProfile.{key}") from None
        if props.get("userData"):
            try:
                base64.b64decode(props["userData"], validate=True)
            except ValueError:
                raise ArmError(400, "InvalidParameter", "userData must be base64.", "userData") from None
        nics = (props.get("networkProfile") or {}).get("networkInterfaces") or []
        if not nics:
            raise ArmError(
                400, "InvalidParameter", "Required parameter 'networkProfile' is missing (null).", "networkProfile"
            )
        for index, ref in enumerate(nics):
            nic = self._require(
                _ref(ref), "Microsoft.Network/networkInterfaces", f"networkProfile.networkInterfaces[{index}]"
            )
            if nic["properties"].get("virtualMachine"):
                raise ArmError(
                    400,
                    "NicInUse",
                    f"Network Interface {nic['id']} is used by existing resource "
                    f"{nic['properties']['virtualMachine']['id']}.",
                )
            if nic["location"] != location:
                raise ArmError(400, "InvalidParameter", f"{nic['id']} is not in {location}.", "networkProfile")
        if body.get("identity"):
            resource["identity"] = self._vm_identity(rid, body["identity"])
        for key, rtype in (
            ("proximityPlacementGroup", "Microsoft.Compute/proximityPlacementGroups"),
            ("virtualMachineScaleSet", "Microsoft.Compute/virtualMachineScaleSets"),
        ):
            if props.get(key):
                found = self._require(_ref(props[key]), rtype, key)
                if found.get("zones") and zones and found["zones"] != zones:
                    raise ArmError(400, "InvalidParameter", f"The VM's zone {zones} is not the {key}'s.", "zones")
        self._check_quota(location, entry, spot)

        disk_name = f"{rid.name}_OsDisk_1_{self.guid('disk').replace('-', '')}"
        disk_id = f"{rid.parent_group_id()}/providers/Microsoft.Compute/disks/{disk_name}"
        os_disk = storage.get("osDisk") or {}
        self.resources[disk_id.lower()] = {
            "id": disk_id,
            "name": disk_name,
            "type": "Microsoft.Compute/disks",
            "location": location,
            "tags": {},
            "managedBy": str(rid),
            **({"zones": zones} if zones else {}),
            "properties": {
                "diskSizeGB": int(os_disk.get("diskSizeGB") or 30),
                "diskState": "Attached",
                "osType": "Linux",
                "provisioningState": "Succeeded",
            },
        }
        resource["properties"] = {
            "vmId": self.guid("vm"),
            "hardwareProfile": {"vmSize": size},
            "storageProfile": {
                "imageReference": image,
                "osDisk": {
                    "osType": "Linux",
                    "name": disk_name,
                    "createOption": "FromImage",
                    "caching": os_disk.get("caching", "ReadWrite"),
                    "deleteOption": os_disk.get("deleteOption", "Detach"),
                    "diskSizeGB": int(os_disk.get("diskSizeGB") or 30),
                    "managedDisk": {
                        "id": disk_id,
                        "storageAccountType": (os_disk.get("managedDisk") or {}).get(
                            "storageAccountType", "Premium_LRS"
                        ),
                    },
                },
                "dataDisks": [],
            },
            "osProfile": {
                "computerName": os_profile.get("computerName") or rid.name,
                "adminUsername": admin,
                "linuxConfiguration": linux,
                "secrets": [],
                "allowExtensionOperations": True,
            },
            "networkProfile": {
                "networkInterfaces": [
                    {"id": self.resources[_ref(ref).lower()]["id"], "properties": dict(ref.get("properties") or {})}
                    for ref in nics
                ]
            },
            "priority": priority,
            "provisioningState": "Creating",
            "timeCreated": _now(),
        }
        resource["_custom_data"] = os_profile.get("customData")
        if props.get("userData"):
            resource["_user_data"] = props["userData"]
        if spot:
            resource["properties"]["evictionPolicy"] = props["evictionPolicy"]
            resource["properties"]["billingProfile"] = {
                "maxPrice": (props.get("billingProfile") or {}).get("maxPrice", -1)
            }
        for key in ("proximityPlacementGroup", "virtualMachineScaleSet", "securityProfile", "diagnosticsProfile"):
            if props.get(key):
                resource["properties"][key] = (
                    {"id": self.resources[_ref(props[key]).lower()]["id"]}
                    if key in ("proximityPlacementGroup", "virtualMachineScaleSet")
                    else props[key]
                )
        if zones:
            resource["zones"] = zones
        for ref in nics:
            self.resources[_ref(ref).lower()]["properties"]["virtualMachine"] = {"id": str(rid)}
        resource["_power"] = "starting"
        # Capacity: the switch decides whether the allocation succeeds.
        switch = self.capacity.get(size.lower())
        if switch is not None:
            allocated = sum(
                1
                for vm in self._of_type("Microsoft.Compute/virtualMachines")
                if vm["properties"]["hardwareProfile"]["vmSize"].lower() == size.lower()
                and vm["location"] == location
                and vm["properties"].get("provisioningState") != "Failed"
            )
            if allocated >= int(switch.get("limit", 0)):
                code = switch.get("code", "AllocationFailed")
                if code == "SkuNotAvailable":
                    for ref in nics:
                        self.resources[_ref(ref).lower()]["properties"].pop("virtualMachine", None)
                    self.resources.pop(disk_id.lower(), None)
                    raise ArmError(
                        409,
                        "SkuNotAvailable",
                        f"The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: "
                        f"{size}' is currently not available in location '{location}'"
                        + (f" zones '{zones[0]}'" if zones else "")
                        + ". Please try another size or deploy to a different location or different zone.",
                    )
                messages = {
                    "AllocationFailed": "Allocation failed. We do not have sufficient capacity for the requested VM "
                    "size in this region. Read more about improving likelihood of allocation success at "
                    "http://aka.ms/allocation-guidance",
                    "ZonalAllocationFailed": "Allocation failed. We do not have sufficient capacity for the requested "
                    f"VM size in this zone ({zones[0] if zones else '-'}). Read more about improving likelihood of "
                    "allocation success at http://aka.ms/allocation-guidance",
                    "OverconstrainedAllocationRequest": "Allocation failed. VM(s) with the following constraints "
                    f"cannot be allocated, because the condition is too restrictive: VM Size: {size}, proximity "
                    "placement group or scale set, zone.",
                }
                error = {"code": code, "message": messages.get(code, f"{code}: {size} in {location}")}
                resource["_op"] = self.start("fail", str(rid), location, "Microsoft.Compute", error=error)
        return resource

    def _vm_identity(self, rid, identity: dict) -> dict:
        """A VM's `identity` as Azure keeps it: each user-assigned identity with its principal and client ids."""
        kinds = {k.strip() for k in str(identity.get("type", "")).split(",")}
        if not kinds <= {"SystemAssigned", "UserAssigned", "None"}:
            raise ArmError(400, "InvalidParameter", f"identity type {identity.get('type')}.", "identity.type")
        assigned = identity.get("userAssignedIdentities") or {}
        if ("UserAssigned" in kinds) != bool(assigned):
            raise ArmError(
                400,
                "InvalidParameter",
                "userAssignedIdentities are required with identity type UserAssigned (and only then).",
                "identity",
            )
        out = {}
        for uid in assigned:
            found = self.resources.get(uid.lower())
            if found is None or found["type"] != "Microsoft.ManagedIdentity/userAssignedIdentities":
                raise ArmError(
                    400,
                    "FailedIdentityOperation",
                    f"Identity operation for resource '{rid}' failed with error 'Resource '{uid}' was not found.'",
                )
            out[found["id"]] = {
                "principalId": found["properties"]["principalId"],
                "clientId": found["properties"]["clientId"],
            }
        return {"type": identity["type"], "userAssignedIdentities": out}

    def instance_view(self, vm: dict) -> dict:
        state = vm["properties"].get("provisioningState", "Succeeded")
        statuses = [
            {
                "code": f"ProvisioningState/{state.lower()}" + (f"/{vm['_error']['code']}" if vm.get("_error") else ""),
                "level": "Error" if state == "Failed" else "Info",
                "displayStatus": f"Provisioning {state.lower()}",
                **({"message": vm["_error"]["message"]} if vm.get("_error") else {}),
            }
        ]
        power = vm.get("_power")
        if power:
            statuses.append({"code": f"PowerState/{power}", "level": "Info", "displayStatus": f"VM {power}"})
        view = {
            "computerName": vm["properties"]["osProfile"]["computerName"],
            "osName": "ubuntu",
            "statuses": statuses,
        }
        if vm.get("zones"):
            view["zone"] = vm["zones"][0]  # not in the real view; harmless extra
        return view

    def vm_action(self, rid: ResourceId, action: str) -> Operation | None:
        vm = self.resources.get(rid.key)
        if vm is None or vm["type"] != "Microsoft.Compute/virtualMachines":
            raise not_found(str(rid), "Microsoft.Compute/virtualMachines")
        if vm["properties"]["provisioningState"] in ("Creating", "Deleting"):
            raise ArmError(
                409,
                "OperationNotAllowed",
                f"Operation '{action}' is not allowed on VM '{rid.name}' since the VM is "
                f"{vm['properties']['provisioningState'].lower()}.",
            )
        if action == "simulateEviction":
            if vm["properties"].get("priority") not in ("Spot", "Low"):
                raise ArmError(409, "OperationNotAllowed", "Eviction can be simulated only for Spot virtual machines.")
            if vm["properties"].get("evictionPolicy") == "Delete":
                self._remove(rid.key)
            else:
                vm["_power"] = "deallocated"
            return None
        transitions = {
            "deallocate": ("deallocating", "deallocated"),
            "start": ("starting", "running"),
            "poweroff": ("stopping", "stopped"),
            "restart": ("starting", "running"),
        }
        if action.lower() not in transitions:
            raise ArmError(400, "InvalidRequestFormat", f"Unknown action {action}.")
        during, after = transitions[action.lower()]
        if vm["properties"]["provisioningState"] == "Failed" and action.lower() == "start":
            raise ArmError(409, "OperationNotAllowed", f"VM '{rid.name}' failed to provision; delete it.")
        vm["_power"] = during
        return self.start("power", str(rid), vm["location"], "Microsoft.Compute", state=after)

    # --- identities ---------------------------------------------------------------------

    def _put_managedidentity_userassignedidentities(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        resource["properties"] = (
            dict(existing["properties"])
            if existing
            else {"tenantId": self.tenant, "principalId": self.guid("principal"), "clientId": self.guid("client")}
        )
        return resource

    def identity_by_client_id(self, client_id: str) -> dict | None:
        for identity in self._of_type("Microsoft.ManagedIdentity/userAssignedIdentities"):
            if identity["properties"]["clientId"] == client_id:
                return identity
        return None

    # --- storage (accounts and NFS file shares) --------------------------------------------

    def _put_storage_storageaccounts(self, rid, body, existing):
        if not STORAGE_ACCOUNT_NAME.match(rid.name):
            raise ArmError(
                400,
                "AccountNameInvalid",
                f"{rid.name} is not a valid storage account name. Storage account name must be between 3 and 24 "
                "characters in length and use numbers and lower-case letters only.",
            )
        taken = next((a for a in self._of_type("Microsoft.Storage/storageAccounts") if a["name"] == rid.name), None)
        if taken is not None and taken["id"].lower() != rid.key:
            raise ArmError(409, "StorageAccountAlreadyTaken", f"The storage account named {rid.name} is already taken.")
        kind = body.get("kind")
        if kind not in STORAGE_KINDS:
            raise ArmError(400, "InvalidRequestPropertyValue", f"The value '{kind}' is not allowed for 'kind'.")
        sku = (body.get("sku") or {}).get("name") or ""
        if kind == "FileStorage" and not sku.startswith("Premium_"):
            raise ArmError(
                400, "InvalidRequestPropertyValue", f"Sku '{sku}' is not supported for kind FileStorage (Premium only)."
            )
        props = body.get("properties") or {}
        resource = self._base(rid, body, existing)
        acls = props.get("networkAcls") or {"defaultAction": "Allow", "bypass": "AzureServices"}
        for rule in acls.get("virtualNetworkRules") or []:
            subnet = self._require(rule.get("id"), "Microsoft.Network/virtualNetworks/subnets", "virtualNetworkRules")
            services = {e["service"] for e in subnet["properties"].get("serviceEndpoints", [])}
            if not services & {"Microsoft.Storage", "Microsoft.Storage.Global"}:
                raise ArmError(
                    400,
                    "NetworkAclsValidationFailure",
                    f"Validation of network acls failure: SubnetsHaveNoServiceEndpointsConfigured:Subnets "
                    f"{subnet['name']} of virtual network {rid.subscription} do not have ServiceEndpoints for "
                    "Microsoft.Storage resources configured. Add Microsoft.Storage to subnet's ServiceEndpoints "
                    "collection before trying to ACL Microsoft.Storage resources to these subnets..",
                )
            rule.setdefault("action", "Allow")
            rule["state"] = "Succeeded"
        name = rid.name
        resource["kind"] = kind
        resource["sku"] = {"name": sku, "tier": "Premium" if sku.startswith("Premium_") else "Standard"}
        resource["properties"] = {
            "provisioningState": "Succeeded",
            "creationTime": existing["properties"]["creationTime"] if existing else _now(),
            "primaryLocation": resource["location"],
            "statusOfPrimary": "available",
            "supportsHttpsTrafficOnly": props.get("supportsHttpsTrafficOnly", True),
            "minimumTlsVersion": props.get("minimumTlsVersion", "TLS1_0"),
            "allowBlobPublicAccess": props.get("allowBlobPublicAccess", False),
            "allowSharedKeyAccess": props.get("allowSharedKeyAccess", True),
            "networkAcls": acls,
            "primaryEndpoints": {
                "file": f"https://{name}.file.core.windows.net/",
                "blob": f"https://{name}.blob.core.windows.net/",
                "queue": f"https://{name}.queue.core.windows.net/",
                "table": f"https://{name}.table.core.windows.net/",
            },
        }
        return resource

    def _put_storage_storageaccounts_fileservices_shares(self, rid, body, existing):
        if rid.names[1] != "default":
            raise ArmError(400, "InvalidResourceName", "The file service name must be 'default'.")
        account = self.resources.get(rid.parent().parent().key)
        if account is None:
            raise not_found(str(rid.parent().parent()), "Microsoft.Storage/storageAccounts")
        if not SHARE_NAME.match(rid.name):
            raise ArmError(400, "InvalidResourceName", f"The specifed resource name '{rid.name}' is invalid.")
        props = body.get("properties") or {}
        protocol = props.get("enabledProtocols", "SMB")
        if protocol == "NFS" and account["kind"] != "FileStorage":
            raise ArmError(
                400, "InvalidHeaderValue", "NFS file shares need a premium FileStorage account (kind FileStorage)."
            )
        if existing and existing["properties"]["enabledProtocols"] != protocol:
            raise ArmError(400, "InvalidHeaderValue", "enabledProtocols cannot be changed on an existing share.")
        quota = props.get("shareQuota", 102400 if account["kind"] == "FileStorage" else 5120)
        if account["kind"] == "FileStorage" and not 100 <= int(quota) <= 102400:
            raise ArmError(400, "InvalidHeaderValue", "shareQuota of a premium share must be 100 to 102400 GiB.")
        resource = self._base(rid, body, existing, location=False)
        resource["type"] = "Microsoft.Storage/storageAccounts/fileServices/shares"
        resource["properties"] = {
            "enabledProtocols": protocol,
            "rootSquash": props.get("rootSquash", "NoRootSquash") if protocol == "NFS" else None,
            "shareQuota": int(quota),
            "lastModifiedTime": _now(),
            "accessTier": "Premium" if account["kind"] == "FileStorage" else "TransactionOptimized",
        }
        return resource

    def _put_storage_storageaccounts_blobservices_containers(self, rid, body, existing):
        if rid.names[1] != "default":
            raise ArmError(400, "InvalidResourceName", "The blob service name must be 'default'.")
        account = self.resources.get(rid.parent().parent().key)
        if account is None:
            raise not_found(str(rid.parent().parent()), "Microsoft.Storage/storageAccounts")
        if account["kind"] == "FileStorage":
            raise ArmError(
                400, "FeatureNotSupportedForAccount", "Blob is not supported for the account (kind FileStorage)."
            )
        if not CONTAINER_NAME.match(rid.name):
            raise ArmError(400, "ContainerNameInvalid", f"The specified container name '{rid.name}' is invalid.")
        props = body.get("properties") or {}
        access = props.get("publicAccess", "None")
        if access not in ("None", "Container", "Blob"):
            raise ArmError(400, "InvalidRequestPropertyValue", f"publicAccess {access!r}.")
        if access != "None" and not account["properties"]["allowBlobPublicAccess"]:
            raise ArmError(409, "PublicAccessNotPermitted", "Public access is not permitted on this storage account.")
        resource = self._base(rid, body, existing, location=False)
        resource["type"] = "Microsoft.Storage/storageAccounts/blobServices/containers"
        resource["properties"] = {
            "publicAccess": access,
            "lastModifiedTime": _now(),
            "leaseStatus": "Unlocked",
            "leaseState": "Available",
            "hasImmutabilityPolicy": False,
            "hasLegalHold": False,
        }
        return resource

    def blob_containers(self) -> list[tuple[dict, dict]]:
        """(account, container) of every blob container."""
        found = []
        for container in self._of_type("Microsoft.Storage/storageAccounts/blobServices/containers"):
            account = self.resources.get(ResourceId.parse(container["id"]).parent().parent().key)
            if account is not None:
                found.append((account, container))
        return found

    def account_by_name(self, name: str) -> dict | None:
        return next((a for a in self._of_type("Microsoft.Storage/storageAccounts") if a["name"] == name), None)

    def nfs_shares(self) -> list[tuple[dict, dict]]:
        """(account, share) of every NFS share: what the twin's nodes may mount."""
        found = []
        for share in self._of_type("Microsoft.Storage/storageAccounts/fileServices/shares"):
            if share["properties"]["enabledProtocols"] != "NFS":
                continue
            account = self.resources.get(ResourceId.parse(share["id"]).parent().parent().key)
            if account is not None:
                found.append((account, share))
        return found

    # --- key vault ----------------------------------------------------------------------

    def _put_keyvault_vaults(self, rid, body, existing):
        if not VAULT_NAME.match(rid.name) or "--" in rid.name:
            raise ArmError(
                400,
                "VaultNameNotValid",
                f"The vault name '{rid.name}' is invalid. A vault's name must be between 3-24 alphanumeric "
                "characters. The name must begin with a letter, end with a letter or digit, and not contain "
                "consecutive hyphens.",
            )
        props = body.get("properties") or {}
        if not existing:
            for other in self._of_type("Microsoft.KeyVault/vaults"):
                if other["name"].lower() == rid.name.lower():
                    raise ArmError(409, "VaultAlreadyExists", f"The vault name '{rid.name}' is already in use.")
            deleted = self.deleted_vaults.get(rid.name.lower())
            if deleted and props.get("createMode") != "recover":
                raise ArmError(
                    409,
                    "ConflictError",
                    f"Exist soft deleted vault with the same name '{rid.name}'. Recover it (createMode recover) or "
                    "purge it first.",
                )
            if deleted:
                # Recovered as it was deleted: the request's properties other than createMode do not apply.
                self.deleted_vaults.pop(rid.name.lower())
                vault = deleted["_vault"]
                vault["etag"] = f'W/"{self.guid("etag")}"'
                vault["_lro"] = True
                return vault
        resource = self._base(rid, body, existing)
        if props.get("tenantId") != self.tenant:
            raise ArmError(
                400,
                "BadRequest",
                f"The tenant id '{props.get('tenantId')}' of the vault is not the subscription's tenant {self.tenant}.",
            )
        sku = props.get("sku") or {}
        if sku.get("family") != "A" or sku.get("name") not in ("standard", "premium"):
            raise ArmError(400, "BadRequest", "The vault sku must be family A, name standard or premium.", "sku")
        policies = []
        for index, policy in enumerate(props.get("accessPolicies") or []):
            if not policy.get("objectId") or policy.get("tenantId") != self.tenant:
                raise ArmError(
                    400,
                    "BadRequest",
                    f"Access policy {index}: objectId and the vault's tenantId are required.",
                )
            policies.append(policy)
        resource["properties"] = {
            "tenantId": self.tenant,
            "sku": {"family": "A", "name": sku["name"]},
            "accessPolicies": policies,
            "enableRbacAuthorization": bool(props.get("enableRbacAuthorization", False)),
            "enableSoftDelete": True,
            "softDeleteRetentionInDays": int(props.get("softDeleteRetentionInDays") or 90),
            "enablePurgeProtection": bool(props.get("enablePurgeProtection", False)) or None,
            "vaultUri": f"https://{rid.name.lower()}.vault.azure.net/",
            "provisioningState": "Succeeded",
        }
        if not resource["properties"]["enablePurgeProtection"]:
            resource["properties"].pop("enablePurgeProtection")
        return resource

    def _soft_delete_vault(self, vault: dict) -> None:
        name = vault["name"].lower()
        self.deleted_vaults[name] = {
            "_vault": copy.deepcopy(vault),
            "id": f"/subscriptions/{self.subscription}/providers/Microsoft.KeyVault/locations/{vault['location']}"
            f"/deletedVaults/{vault['name']}",
            "name": vault["name"],
            "type": "Microsoft.KeyVault/deletedVaults",
            "properties": {
                "vaultId": vault["id"],
                "location": vault["location"],
                "deletionDate": _now(),
                "scheduledPurgeDate": _now(),
                "tags": vault.get("tags", {}),
                "purgeProtectionEnabled": bool(vault["properties"].get("enablePurgeProtection")),
            },
        }

    def vault_by_name(self, name: str) -> dict | None:
        for vault in self._of_type("Microsoft.KeyVault/vaults"):
            if vault["name"].lower() == name.lower():
                return vault
        return None

    def purge_vault(self, location: str, name: str) -> Operation:
        deleted = self.deleted_vaults.get(name.lower())
        if deleted is None or deleted["properties"]["location"] != location.lower():
            raise ArmError(404, "ResourceNotFound", f"The deleted vault '{name}' was not found in {location}.")
        if deleted["properties"]["purgeProtectionEnabled"]:
            raise ArmError(409, "OperationNotAllowed", f"Vault {name} has purge protection enabled.")
        return self.start("purge", name, location, "Microsoft.KeyVault")

    def secret_access(self, vault: dict, oid: str, permission: str) -> bool:
        if vault["properties"]["enableRbacAuthorization"]:
            return False  # role assignments are not emulated: only access policies grant access
        for policy in vault["properties"]["accessPolicies"]:
            if policy["objectId"] == oid and permission in [
                p.lower() for p in (policy.get("permissions") or {}).get("secrets", [])
            ]:
                return True
        return False
