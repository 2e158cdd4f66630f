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
AllocationFailed, ZonalAllocationFailed or SkuNotAvailable), `quota` (location ->
usage name -> limit) and `strict` (STRICT: the twin's strict behaviours, each on unless a test turns
it off to see the lenient one).
"""

from __future__ import annotations

import copy
import threading
import time
import uuid

from clusterbake.twins.azure import skus
from clusterbake.twins.azure.compute import ComputeMixin
from clusterbake.twins.azure.gallery import GalleryMixin
from clusterbake.twins.azure.keyvault import KeyVaultMixin
from clusterbake.twins.azure.lustre import AmlfsMixin
from clusterbake.twins.azure.network import NetworkMixin
from clusterbake.twins.azure.rbac import RbacMixin
from clusterbake.twins.azure.replication import Replication
from clusterbake.twins.azure.resource import (  # noqa: F401
    CANONICAL_TYPES,
    CONTAINER_NAME,
    CREATED_WITH_200,
    DEFAULT_FAMILY_LIMIT,
    DEFAULT_LIMITS,
    DEFAULT_SUBSCRIPTION,
    DEFAULT_TENANT,
    LRO_PUT,
    NAMESPACE,
    PLACEMENTS,
    RESERVED_ADMIN_NAMES,
    RESOURCE_NAME,
    RG_NAME,
    SHARE_NAME,
    STORAGE_ACCOUNT_NAME,
    STORAGE_KINDS,
    SYNC_DELETE,
    TAG_FORBIDDEN,
    VAULT_NAME,
    ArmError,
    Operation,
    ResourceId,
    _cidr,
    _now,
    _ref,
    not_found,
)
from clusterbake.twins.azure.storage import StorageMixin

# The VM property that makes it a member of a placement resource, by that resource's type.
MEMBERS_KEY = {rtype: key for key, rtype in PLACEMENTS}
# Where the twin is as strict as Azure, each a switch (on unless a test turns it off: PUT /_twin/strict).
STRICT = {
    "keyvault_secret_size": True,  # a secret's value over 25 KB: 400 BadParameter (SecretTooLarge)
    "amlfs_nsg": True,  # Azure Managed Lustre's servers reach only the clients whose NSGs admit them (lustre.py)
}


class ArmState(NetworkMixin, ComputeMixin, GalleryMixin, StorageMixin, KeyVaultMixin, AmlfsMixin, RbacMixin):
    def __init__(
        self,
        subscription: str = DEFAULT_SUBSCRIPTION,
        tenant: str = DEFAULT_TENANT,
        operation_seconds: float = 0.2,
        rbac_spread: float | None = None,
        identity_spread: float | None = None,
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
        self.strict: dict[str, bool] = dict(STRICT)
        self.role_definitions: dict[str, dict] = {}  # custom roles by GUID (lower case)
        self.role_assignments: dict[str, dict] = {}  # assignment id (lower case) -> assignment
        # When RBAC writes and new identities take effect (None: the environment's setting, else 3 s).
        self.replication = Replication(rbac=rbac_spread, identity=identity_spread)
        # Who sends the request being handled (arm.py sets it): (client id, createdByType) for systemData.
        self.actor: tuple[str, str] = ("clusterbake-twin", "Application")
        # The api-version of the request being served (a VM's defaults depend on it: compute.security_profile).
        self.api_version = ""

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
                    "strict": self.strict,
                    "role_definitions": self.role_definitions,
                    "role_assignments": self.role_assignments,
                    "replication": self.replication.written,
                }
            )

    def restore(self, data: dict) -> None:
        with self.lock:
            for key in ("subscription", "tenant", "counter", "groups", "resources", "deleted_vaults"):
                setattr(self, key, data[key])
            self.secrets = data.get("secrets", {})
            self.capacity = data.get("capacity", {})
            self.quota = data.get("quota", {})
            self.strict = dict(STRICT) | data.get("strict", {})
            self.role_definitions = data.get("role_definitions", {})
            self.role_assignments = data.get("role_assignments", {})
            self.replication.restore(data.get("replication"))
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

    def set_strict(self, switches: dict) -> dict[str, bool]:
        """`PUT /_twin/strict`: turn named strict behaviours on (true) or off (false)."""
        unknown = sorted(set(switches) - set(STRICT))
        if unknown or not all(isinstance(v, bool) for v in switches.values()):
            raise ArmError(400, "InvalidRequestContent", f"strict switches are {', '.join(STRICT)}, true or false")
        self.strict |= switches
        return dict(self.strict)

    def warnings(self) -> list[dict]:
        """What Azure accepts but the twin notes as a likely mistake (`GET /_twin/state`'s `warnings`)."""
        return self.amlfs_warnings()

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
        elif rtype in MEMBERS_KEY:
            key = MEMBERS_KEY[rtype]
            members = [
                {"id": vm["id"]}
                for vm in self._of_type("Microsoft.Compute/virtualMachines")
                if (_ref(vm["properties"].get(key)) or "").lower() == resource["id"].lower()
            ]
            if rtype != "Microsoft.Compute/virtualMachineScaleSets":
                out["properties"]["virtualMachines"] = members
        return out

    def _of_type(self, rtype: str) -> list[dict]:
        return [r for r in self.resources.values() if r["type"] == rtype]

    def _link(self, resource: dict, props: dict, key: str, rtype: str, target: str) -> None:
        """The resource's property `key`: {"id"} of the existing `rtype` that props[key] refers to, if any."""
        if props.get(key):
            resource["properties"][key] = {"id": self._require(_ref(props[key]), rtype, target)["id"]}

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

    def _in_scope(self, subscription: str, group: str | None):
        """(key, id, resource) of every resource of the subscription (of `group`, when given), by key."""
        self.check_subscription(subscription)
        if group is not None:
            self.group(group)
        for key in sorted(self.resources):
            rid = ResourceId.parse(key)
            if group is None or rid.group.lower() == group.lower():
                yield key, rid, self.resources[key]

    def list(self, subscription: str, group: str | None, type_key: str, parent: str | None = None) -> list[dict]:
        return [
            self.view(resource)
            for key, _, resource in self._in_scope(subscription, group)
            if resource["type"].lower() == type_key and (parent is None or key.startswith(parent.lower() + "/"))
        ]

    def generic_list(self, subscription: str, group: str | None, tag: tuple[str, str | None] | None, rtype: str | None):
        """GET /subscriptions/{s}[/resourceGroups/{g}]/resources: top-level resources (not subnets)."""
        found = []
        for _, rid, resource in self._in_scope(subscription, group):
            if len(rid.types) != 1:
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
        created = 201 if rid.type_key not in CREATED_WITH_200 else 200
        return (200 if existing else created), self.view(resource), op

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
            "Microsoft.Compute/availabilitySets": ("OperationNotAllowed", "availabilitySet"),
            "Microsoft.Network/natGateways": ("InUseNatGatewayCannotBeDeleted", "natGateway"),
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
