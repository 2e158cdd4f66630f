"""Azure RBAC role assignments for the cluster's managed identities (azure-mgmt-authorization).

Role assignments carry no tags: each one's name is a uuid5 of (scope, principal, role), so a
re-run finds the one it made (and Azure's RoleAssignmentExists, 409, for the same grant under
another name, is taken as done). They go before their principal does: `cluster down`
deletes every assignment of the cluster's identities first (delete_all; Azure keeps the
assignments of a deleted identity, as "Identity not found", until someone removes them).

Azure's RBAC is eventually consistent ("Troubleshoot Azure RBAC"; Azure/azure-cli#20727): an
assignment of a custom role made a moment ago may answer RoleDefinitionDoesNotExist, one for a
new principal PrincipalNotFound, and deleting a role whose assignments just went
RoleDefinitionHasAssignments. `while_replicating` tries such a call again for REPLICATION_WAIT
seconds, saying so (realcloud review B7).

The roles (Microsoft's built-in role ids, "Azure built-in roles"):
- Storage Blob Data Contributor / Reader: the nodes' identity on each blob container
  blobfuse2 mounts (blobs.py).
- Managed Identity Operator: the head's identity on the nodes' identity, the one identity a VM
  the head's power program makes may carry (power.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from clusterbake.errors import ClusterbakeError
from clusterbake.progress import say
from clusterbake.providers.azure.api import error_code, message

BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
BLOB_DATA_READER = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
IDENTITY_OPERATOR = "f1a07417-d97a-45cb-824c-7a7467783830"
NAMESPACE = uuid.UUID("3f0c2b9e-7a51-4d8e-b6f2-c1a9e4d07b35")
# What a new role or principal is answered with until Azure has replicated it (to an assignment's create).
NOT_REPLICATED = ("RoleDefinitionDoesNotExist", "PrincipalNotFound")
REPLICATION_WAIT = 300.0  # Azure: changes "can take up to 10 minutes"; most settle within a few
REPLICATION_POLL = (1.0, 15.0)  # the first and the longest wait between tries
SAY_EVERY = 30.0


def while_replicating(
    call: Callable[[], Any],
    codes: tuple[str, ...],
    what: str,
    hint: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """`call()`, tried again with growing waits while Azure answers one of `codes`, for REPLICATION_WAIT
    seconds; the wait is said. Past that, a ClusterbakeError with Azure's words and `hint`."""
    from azure.core.exceptions import HttpResponseError

    started, delay, said = clock(), REPLICATION_POLL[0], None
    while True:
        try:
            return call()
        except HttpResponseError as exc:
            code, waited = error_code(exc), clock() - started
            if code not in codes:
                raise
            if waited + delay > REPLICATION_WAIT:
                raise ClusterbakeError(f"{what}: {message(exc)} (for {waited:.0f}s); {hint}") from exc
            if said is None or waited - said >= SAY_EVERY:
                progress = f"waiting ({waited:.0f}s of {REPLICATION_WAIT:.0f}s)"
                say(f"    {what}: {code}: Azure has not replicated it yet, {progress}")
                said = waited
        sleep(delay)
        delay = min(delay * 2, REPLICATION_POLL[1])


def role_definition_id(subscription_id: str, role: str) -> str:
    return f"/subscriptions/{subscription_id}/providers/Microsoft.Authorization/roleDefinitions/{role}"


def assignment_name(scope: str, principal_id: str, role: str) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{scope.lower()}|{principal_id}|{role.lower()}"))


def ensure(authorization, subscription_id: str, scope: str, principal_id: str, role: str) -> bool:
    """`role` for the principal (a managed identity) at `scope`; True when this call created it."""
    from azure.core.exceptions import HttpResponseError
    from azure.mgmt.authorization.models import RoleAssignmentCreateParameters

    name = assignment_name(scope, principal_id, role)
    try:
        authorization.role_assignments.get(scope, name)
        return False
    except HttpResponseError as exc:
        if exc.status_code != 404:
            raise
    parameters = RoleAssignmentCreateParameters(
        role_definition_id=role_definition_id(subscription_id, role),
        principal_id=principal_id,
        # A new identity may not have replicated to Entra ID yet: the type spares Azure the lookup.
        principal_type="ServicePrincipal",
    )
    try:
        while_replicating(
            lambda: authorization.role_assignments.create(scope, name, parameters),
            NOT_REPLICATED,
            f"role {role} for {principal_id} at {scope}",
            "Azure has not made the role or the identity known yet; run `clusterbake cluster up` again later",
        )
    except HttpResponseError as exc:
        if error_code(exc) == "RoleAssignmentExists":
            return False
        raise
    return True


def delete_all(authorization, subscription_id: str, principals: dict[str, str]) -> list[str]:
    """Every role assignment of the principals (label -> principal id), anywhere in the subscription."""
    removed = []
    scope = f"/subscriptions/{subscription_id}"
    for label, principal_id in sorted(principals.items()):
        # Every page first, then the deletions: deleting while paging shifts what the next page holds.
        assignments = list(
            authorization.role_assignments.list_for_scope(scope, filter=f"principalId eq '{principal_id}'")
        )
        for assignment in assignments:
            authorization.role_assignments.delete_by_id(assignment.id)
            removed.append(f"role assignment of {label} at {assignment.scope}")
    return removed


def prune(authorization, subscription_id: str, principal_id: str, role: str, keep: list[str]) -> int:
    """Delete the principal's assignments of `role` at any scope but `keep` (a grant a cluster made before
    its scopes narrowed); how many."""
    scope = f"/subscriptions/{subscription_id}"
    kept = {s.lower().rstrip("/") for s in keep}
    found = list(authorization.role_assignments.list_for_scope(scope, filter=f"principalId eq '{principal_id}'"))
    stale = [
        a
        for a in found
        if a.role_definition_id.lower().endswith(f"/{role.lower()}") and a.scope.lower().rstrip("/") not in kept
    ]
    for assignment in stale:
        authorization.role_assignments.delete_by_id(assignment.id)
    return len(stale)
