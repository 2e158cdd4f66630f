"""Azure RBAC in the twin's subscription (Microsoft.Authorization), mixed into ArmState.

- Role definitions: Azure's built-in roles the product uses, with the actions and data
  actions Microsoft publishes for them ("Azure built-in roles": Storage Blob Data Reader,
  Storage Blob Data Contributor), and custom roles a client creates (PUT
  `/subscriptions/{s}/providers/Microsoft.Authorization/roleDefinitions/{guid}` with
  `permissions` and `assignableScopes`).
- Role assignments at any scope (`{scope}/providers/Microsoft.Authorization/roleAssignments/{guid}`):
  the name must be a GUID; `roleDefinitionId` must name a known role and the scope must be
  within one of its assignable scopes; `principalId` and `principalType`; the same role for
  the same principal at the same scope twice is RoleAssignmentExists (409). Listing with
  `$filter=principalId eq '{id}'` answers the principal's assignments at, above and below
  the scope, as ARM does ("List Azure role assignments using the REST API"). Deleting a
  resource deletes the assignments scoped to it; deleting a principal leaves its
  assignments behind (Azure shows them as "Identity not found" until someone removes them).
- allowed(principal, action, scope, data): whether some assignment of the principal at the
  scope or above grants the action (wildcards as Azure matches them, NotActions and
  NotDataActions subtracted). The blob data plane asks this for data actions.
- Replication (replication.py, realcloud review B7): for the RBAC spread after a write, a new
  custom role cannot be assigned yet (400 RoleDefinitionDoesNotExist), an updated one grants
  what it granted before, a new assignment grants nothing, and a role whose assignments were
  just deleted cannot be deleted (409 RoleDefinitionHasAssignments); for the identity spread, an
  assignment naming a new identity without `principalType` is 400 PrincipalNotFound (Microsoft's
  documented cause and fix). ARM's reads (GET, lists) answer the new state at once.
"""

from __future__ import annotations

import copy
import re
import uuid

from clusterbake.twins.azure.resource import ArmError

# Microsoft's published definitions (ids, actions, data actions) of the built-in roles the twin knows.
BUILT_IN_ROLES = {
    "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1": {
        "roleName": "Storage Blob Data Reader",
        "actions": [
            "Microsoft.Storage/storageAccounts/blobServices/containers/read",
            "Microsoft.Storage/storageAccounts/blobServices/generateUserDelegationKey/action",
        ],
        "dataActions": ["Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read"],
    },
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": {
        "roleName": "Storage Blob Data Contributor",
        "actions": [
            "Microsoft.Storage/storageAccounts/blobServices/containers/delete",
            "Microsoft.Storage/storageAccounts/blobServices/containers/read",
            "Microsoft.Storage/storageAccounts/blobServices/containers/write",
            "Microsoft.Storage/storageAccounts/blobServices/generateUserDelegationKey/action",
        ],
        "dataActions": [
            "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/delete",
            "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read",
            "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write",
            "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/move/action",
            "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/add/action",
        ],
    },
    # Identity: what AKS and ARM templates give whatever attaches a user-assigned identity to a resource.
    "f1a07417-d97a-45cb-824c-7a7467783830": {
        "roleName": "Managed Identity Operator",
        "actions": [
            "Microsoft.ManagedIdentity/userAssignedIdentities/*/read",
            "Microsoft.ManagedIdentity/userAssignedIdentities/*/assign/action",
            "Microsoft.Authorization/*/read",
            "Microsoft.Insights/alertRules/*",
            "Microsoft.Resources/subscriptions/resourceGroups/read",
            "Microsoft.Resources/deployments/*",
            "Microsoft.Support/*",
        ],
        "dataActions": [],
    },
}
PRINCIPAL_TYPES = ("User", "Group", "ServicePrincipal", "ForeignGroup", "Device")


def _is_guid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _within(scope: str, outer: str) -> bool:
    """Whether `scope` is `outer` or below it (ids compared case-insensitively, by whole segments)."""
    scope, outer = scope.rstrip("/").lower(), outer.rstrip("/").lower()
    return scope == outer or scope.startswith(outer + "/")


def action_matches(pattern: str, action: str) -> bool:
    """Azure's action wildcards: `*` matches any characters, case-insensitively, and a `*` segment
    also none: Managed Identity Operator's `userAssignedIdentities/*/assign/action` is what grants
    `userAssignedIdentities/assign/action` (Microsoft documents the role for attaching identities)."""
    parts = [re.escape(part) for part in pattern.lower().split("*")]
    regex = "^" + ".*".join(parts) + "$"
    regex = regex.replace("/.*/", "/(?:.*/)?")
    return re.match(regex, action.lower()) is not None


def role_missing(definition_id: str, status: int = 400) -> ArmError:
    """ARM's answer for a role definition it does not know (yet): 404 to a GET, 400 to an assignment."""
    guid = definition_id.rstrip("/").rsplit("/", 1)[-1]
    words = f"The specified role definition with ID '{guid}' does not exist."
    return ArmError(status, "RoleDefinitionDoesNotExist", words)


class RbacMixin:
    """Role definitions and assignments on ArmState (`self.subscription`, `self.tenant`, `self.resources`,
    `self.replication`)."""

    def role_definition(self, definition_id: str) -> dict | None:
        guid = definition_id.rstrip("/").rsplit("/", 1)[-1].lower()
        if guid in self.role_definitions:
            return self.role_definitions[guid]
        built_in = BUILT_IN_ROLES.get(guid)
        if built_in is None:
            return None
        return self._definition_view(guid, built_in, "BuiltInRole", ["/"])

    def _definition_view(self, guid: str, spec: dict, kind: str, scopes: list[str]) -> dict:
        return {
            "id": f"/subscriptions/{self.subscription}/providers/Microsoft.Authorization/roleDefinitions/{guid}",
            "name": guid,
            "type": "Microsoft.Authorization/roleDefinitions",
            "properties": {
                "roleName": spec["roleName"],
                "description": spec.get("description", ""),
                "type": kind,
                "permissions": [
                    {
                        "actions": list(spec.get("actions", [])),
                        "notActions": list(spec.get("notActions", [])),
                        "dataActions": list(spec.get("dataActions", [])),
                        "notDataActions": list(spec.get("notDataActions", [])),
                    }
                ],
                "assignableScopes": scopes,
            },
        }

    def _permissions_in_effect(self, definition: dict) -> list | None:
        return self.replication.permissions(definition["name"], definition["properties"]["permissions"])

    def put_role_definition(self, guid: str, body: dict) -> dict:
        if not _is_guid(guid):
            raise ArmError(400, "InvalidRoleDefinitionId", f"The role definition ID '{guid}' is not a GUID.")
        if guid.lower() in BUILT_IN_ROLES:
            raise ArmError(400, "RoleDefinitionNameInUse", "A built-in role cannot be changed.")
        props = body.get("properties") or {}
        name = props.get("roleName")
        scopes = props.get("assignableScopes") or []
        permissions = props.get("permissions") or []
        if not name or not scopes or not permissions:
            raise ArmError(400, "InvalidRoleDefinition", "roleName, permissions and assignableScopes are required.")
        for other_guid, other in self.role_definitions.items():
            if other_guid != guid.lower() and other["properties"]["roleName"] == name:
                raise ArmError(409, "RoleDefinitionWithSameNameExists", f"A role named {name} exists.")
        spec = {
            "roleName": name,
            "description": props.get("description", ""),
        }
        for key in ("actions", "notActions", "dataActions", "notDataActions"):
            spec[key] = [action for p in permissions for action in p.get(key) or []]
        existing = self.role_definitions.get(guid.lower())
        self.replication.definition_written(guid, self._permissions_in_effect(existing) if existing else None)
        self.role_definitions[guid.lower()] = self._definition_view(guid.lower(), spec, "CustomRole", list(scopes))
        return self.role_definitions[guid.lower()]

    def delete_role_definition(self, guid: str) -> dict | None:
        ids = [a["properties"]["roleDefinitionId"].lower() for a in self.role_assignments.values()]
        if any(i.endswith(guid.lower()) for i in ids) or self.replication.recently_unassigned(guid):
            raise ArmError(409, "RoleDefinitionHasAssignments", "There are existing role assignments referencing role")
        self.replication.definition_deleted(guid)
        return self.role_definitions.pop(guid.lower(), None)

    def put_role_assignment(self, scope: str, name: str, body: dict) -> tuple[int, dict]:
        if not _is_guid(name):
            raise ArmError(400, "InvalidRoleAssignmentId", f"The role assignment ID '{name}' is not valid.")
        props = body.get("properties") or {}
        definition = self.role_definition(props.get("roleDefinitionId") or "")
        if definition is None or self._permissions_in_effect(definition) is None:  # none, or not replicated yet
            raise role_missing(props.get("roleDefinitionId") or "")
        if not any(s == "/" or _within(scope, s) for s in definition["properties"]["assignableScopes"]):
            raise ArmError(
                400, "InvalidCreateRoleAssignmentRequest",
                f"The role {definition['properties']['roleName']} is not assignable at scope {scope}.",
            )  # fmt: skip
        principal = props.get("principalId") or ""
        if not _is_guid(principal) or props.get("principalType", "ServicePrincipal") not in PRINCIPAL_TYPES:
            raise ArmError(400, "InvalidPrincipalId", f"A valid principal ID must be provided: {principal!r}.")
        if "principalType" not in props and not self.replication.identity_ready(principal):
            raise ArmError(
                400, "PrincipalNotFound",
                f"Principal {principal} does not exist in the directory {self.tenant}. Check that you "
                "have the correct principal ID. If you are creating this principal and then immediately assigning a "
                "role, this error might be related to a replication delay. In this case, set the role assignment "
                "principalType property to a value, such as ServicePrincipal, User, or Group.  See "
                "https://aka.ms/docs-principaltype",
            )  # fmt: skip
        self._check_scope_exists(scope)
        key = f"{scope.rstrip('/')}/providers/Microsoft.Authorization/roleAssignments/{name}".lower()
        for other_key, other in self.role_assignments.items():
            p = other["properties"]
            if (
                other_key != key
                and p["scope"].lower() == scope.rstrip("/").lower()
                and p["principalId"] == principal
                and p["roleDefinitionId"].lower() == definition["id"].lower()
            ):
                raise ArmError(409, "RoleAssignmentExists", "The role assignment already exists.")
        existing = self.role_assignments.get(key)
        if existing is not None:
            if (
                existing["properties"]["principalId"] != principal
                or existing["properties"]["roleDefinitionId"].lower() != definition["id"].lower()
            ):
                raise ArmError(
                    400, "RoleAssignmentUpdateNotPermitted",
                    "Tenant ID, application ID, principal ID, and scope are not allowed to be updated.",
                )  # fmt: skip
            return 201, copy.deepcopy(existing)
        assignment = {
            "id": f"{scope.rstrip('/')}/providers/Microsoft.Authorization/roleAssignments/{name}",
            "name": name,
            "type": "Microsoft.Authorization/roleAssignments",
            "properties": {
                "roleDefinitionId": definition["id"],
                "principalId": principal,
                "principalType": props.get("principalType", "ServicePrincipal"),
                "scope": scope.rstrip("/"),
                "description": props.get("description", ""),
            },
        }
        self.role_assignments[key] = assignment
        self.replication.assignment_written(key)
        return 201, copy.deepcopy(assignment)

    def _check_scope_exists(self, scope: str) -> None:
        parts = [p for p in scope.strip("/").split("/") if p]
        if len(parts) == 2:
            return
        if len(parts) == 4:
            self.group(parts[3])
            return
        if scope.lower().rstrip("/") not in self.resources:
            raise ArmError(404, "ResourceNotFound", f"The scope '{scope}' does not exist.")

    def get_role_assignment(self, scope: str, name: str) -> dict:
        key = f"{scope.rstrip('/')}/providers/Microsoft.Authorization/roleAssignments/{name}".lower()
        found = self.role_assignments.get(key)
        if found is None:
            raise ArmError(404, "RoleAssignmentNotFound", f"The role assignment '{name}' is not found.")
        return copy.deepcopy(found)

    def delete_role_assignment(self, scope: str, name: str) -> dict | None:
        key = f"{scope.rstrip('/')}/providers/Microsoft.Authorization/roleAssignments/{name}".lower()
        return self._unassign(key)

    def _unassign(self, key: str) -> dict | None:
        """Remove an assignment; its role still counts it until that replicates (replication.py)."""
        removed = self.role_assignments.pop(key, None)
        if removed is not None:
            self.replication.assignment_deleted(key, removed["properties"]["roleDefinitionId"].rsplit("/", 1)[-1])
        return removed

    def list_role_assignments(self, scope: str, principal: str | None) -> list[dict]:
        """At or above the scope; with a principal filter also below it (ARM's rules)."""
        found = []
        for assignment in self.role_assignments.values():
            p = assignment["properties"]
            if principal is not None and p["principalId"] != principal:
                continue
            above = _within(scope, p["scope"])
            below = principal is not None and _within(p["scope"], scope)
            if above or below:
                found.append(copy.deepcopy(assignment))
        return sorted(found, key=lambda a: a["id"].lower())

    def drop_assignments_below(self, resource_id: str) -> None:
        """A deleted resource takes the role assignments scoped to it (and below it) with it."""
        for key in [k for k, a in self.role_assignments.items() if _within(a["properties"]["scope"], resource_id)]:
            self._unassign(key)

    def allowed(self, principal: str, action: str, scope: str, data: bool = False) -> bool:
        grant, deny = ("dataActions", "notDataActions") if data else ("actions", "notActions")
        for key, assignment in self.role_assignments.items():
            p = assignment["properties"]
            if p["principalId"] != principal or not _within(scope, p["scope"]):
                continue
            if not self.replication.assignment_effective(key):  # ARM does not know it yet
                continue
            definition = self.role_definition(p["roleDefinitionId"])
            permissions = self._permissions_in_effect(definition) if definition else None
            for permission in permissions or []:
                if any(action_matches(a, action) for a in permission.get(grant, [])) and not any(
                    action_matches(a, action) for a in permission.get(deny, [])
                ):
                    return True
        return False


# --- what an ARM request needs (for principals other than the subscription's owner) ---------------

# References in a PUT body that ARM authorizes as linked actions (the resource's type -> (JSON path, action)).
LINKED = {
    "microsoft.network/networkinterfaces": (
        ("properties.ipConfigurations[].properties.subnet.id", "Microsoft.Network/virtualNetworks/subnets/join/action"),
        ("properties.networkSecurityGroup.id", "Microsoft.Network/networkSecurityGroups/join/action"),
        (
            "properties.ipConfigurations[].properties.applicationSecurityGroups[].id",
            "Microsoft.Network/applicationSecurityGroups/joinIpConfiguration/action",
        ),
    ),
    "microsoft.compute/virtualmachines": (
        ("properties.networkProfile.networkInterfaces[].id", "Microsoft.Network/networkInterfaces/join/action"),
        ("identity.userAssignedIdentities{}", "Microsoft.ManagedIdentity/userAssignedIdentities/assign/action"),
        ("properties.storageProfile.imageReference.id", "Microsoft.Compute/images/read"),
    ),
}


def _values(document, path: str) -> list[str]:
    """The strings at a JSON path: `a.b` keys, `[]` every item of a list, `{}` every key of a mapping."""
    current = [document]
    for step in path.split("."):
        key = step.removesuffix("[]").removesuffix("{}")
        current = [c.get(key) for c in current if isinstance(c, dict)]
        if step.endswith("[]"):
            current = [item for c in current if isinstance(c, list) for item in c]
        elif step.endswith("{}"):
            current = [k for c in current if isinstance(c, dict) for k in c]
    return [c for c in current if isinstance(c, str) and c]


VERBS = {"GET": "read", "HEAD": "read", "PUT": "write", "PATCH": "write", "DELETE": "delete"}  # HTTP -> action


def rbac_extension(method: str, namespace: str, tail: list[str]) -> str | None:
    """The action of a request for an extension resource (namespace, then type/name pairs)."""
    verb = VERBS.get(method)
    return f"{namespace}/{'/'.join(tail[0::2])}/{verb}" if verb else None


def required(method: str, path: str, body) -> tuple[str, str, list[tuple[str, str]]] | None:
    """(action, scope, [(linked action, linked scope)]) of an ARM request, or None when the twin does
    not authorize it (operation status polls, SKU and usage listings, the subscription itself)."""
    parts = [p for p in path.split("/") if p]
    lower = [p.lower() for p in parts]
    if len(parts) < 4 or lower[2] != "resourcegroups":
        return None
    group_scope = "/" + "/".join(parts[:4])
    if len(parts) == 4:
        verb = VERBS.get(method)
        return (f"Microsoft.Resources/subscriptions/resourceGroups/{verb}", group_scope, []) if verb else None
    if len(parts) == 5 or lower[4] != "providers" or len(parts) < 7:
        return None
    last = max(i for i, part in enumerate(lower) if part == "providers")
    if last > 4 and len(parts) > last + 2:
        # An extension resource below another one (a role assignment on an NSG): its own provider's
        # action (Microsoft.Authorization/roleAssignments/write), at the parent resource's scope.
        extension = rbac_extension(method, parts[last + 1], parts[last + 2 :])
        return (extension, "/" + "/".join(parts[:last]), []) if extension else None
    namespace, tail = parts[5], parts[6:]
    types, names = tail[0::2], tail[1::2]
    action = None
    if len(tail) % 2:  # a collection, or an action on a resource
        if len(tail) == 1:
            return f"{namespace}/{types[0]}/read", group_scope, []
        last = tail[-1]
        types, names = tail[:-1][0::2], tail[:-1][1::2]
        # A GET below a resource reads (its instanceView, a child list, checkIPAddressAvailability); others act.
        action = f"{last}/read" if method == "GET" else f"{last}/action"
    scope = "/" + "/".join(parts[:6] + [x for pair in zip(types, names, strict=True) for x in pair])
    kind = "/".join([namespace, *types])
    if action is not None:
        return f"{kind}/{action}", scope, []
    verb = VERBS.get(method)
    if verb is None:
        return None
    linked = []
    if verb == "write":
        for json_path, linked_action in LINKED.get(kind.lower(), ()):
            linked += [(linked_action, value) for value in _values(body or {}, json_path)]
    return f"{kind}/{verb}", scope, linked
