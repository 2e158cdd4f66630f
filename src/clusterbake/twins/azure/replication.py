"""Azure's eventual consistency in the twin (realcloud review B7, D7, D9): a write that takes effect
only seconds after ARM answered it.

- **RBAC** (`rbac` seconds, `$ARM_TWIN_RBAC_SPREAD`, default 3): role definitions and role
  assignments are eventually consistent (Azure/azure-cli#20727: a new custom role missing from
  reads for a while; "Troubleshoot Azure RBAC": assignment changes "can take up to 10 minutes to
  take effect"). Until then a new custom role cannot be assigned (RoleDefinitionDoesNotExist), an
  updated one still grants what it granted before, a new assignment grants nothing
  (AuthorizationFailed), and a role whose assignments were just deleted still counts them
  (RoleDefinitionHasAssignments). rbac.py asks this module.
- **Identities** (`identity` seconds, `$ARM_TWIN_IDENTITY_SPREAD`, default 3): a new user-assigned
  identity's service principal replicates in Entra ID ("Troubleshoot Azure RBAC": PrincipalNotFound
  right after a principal is made): until then IMDS and the App Service identity endpoint give it
  no token, and a role assignment naming it without `principalType` is refused.

Times are wall-clock seconds kept in the state file (`written`), so a restarted twin keeps them.
`spread` is a setting, not state: the environment at start, or `PUT /_twin/spread`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

DEFAULT_SPREAD = 3.0
ENVIRONMENT = {"rbac": "ARM_TWIN_RBAC_SPREAD", "identity": "ARM_TWIN_IDENTITY_SPREAD"}
KINDS = {"definitions": "rbac", "assignments": "rbac", "unassigned": "rbac", "identities": "identity"}


def configured_spread(kind: str) -> float:
    """Seconds from the environment ($ARM_TWIN_RBAC_SPREAD, $ARM_TWIN_IDENTITY_SPREAD), else DEFAULT_SPREAD."""
    return float(os.environ.get(ENVIRONMENT[kind]) or DEFAULT_SPREAD)


class Replication:
    """When what was written (role definitions, assignments, identities) takes effect."""

    def __init__(
        self, rbac: float | None = None, identity: float | None = None, clock: Callable[[], float] = time.time
    ):
        self.spread = {
            "rbac": configured_spread("rbac") if rbac is None else rbac,
            "identity": configured_spread("identity") if identity is None else identity,
        }
        self.clock = clock
        # definitions: guid -> {"at", "previous": the permissions in effect before that write (None: none)};
        # assignments: assignment key -> at; unassigned: role guid -> when an assignment of it went;
        # identities: principal id -> when the identity was made.
        self.written: dict[str, dict] = {kind: {} for kind in KINDS}

    def restore(self, written: dict | None) -> None:
        self.written = {kind: dict((written or {}).get(kind) or {}) for kind in KINDS}

    def _settled(self, kind: str, key: str) -> bool:
        entry = self.written[kind].get(key)
        if entry is None:
            return True
        at = entry["at"] if isinstance(entry, dict) else entry
        return self.clock() - at >= self.spread[KINDS[kind]]

    def _note(self, kind: str, key: str, entry) -> None:
        """Record a write, forgetting this kind's writes that have settled (the state file stays small)."""
        for old in [k for k in self.written[kind] if self._settled(kind, k)]:
            del self.written[kind][old]
        self.written[kind][key] = entry

    # --- role definitions -----------------------------------------------------------------

    def definition_written(self, guid: str, previous: list | None) -> None:
        self._note("definitions", guid.lower(), {"at": self.clock(), "previous": previous})

    def permissions(self, guid: str, current: list) -> list | None:
        """The role's permissions in effect now: `current` once its last write settled, before that what
        was in effect before it (None for a role that did not exist yet)."""
        if self._settled("definitions", guid.lower()):
            return current
        return self.written["definitions"][guid.lower()]["previous"]

    def definition_deleted(self, guid: str) -> None:
        self.written["definitions"].pop(guid.lower(), None)
        self.written["unassigned"].pop(guid.lower(), None)

    # --- role assignments -----------------------------------------------------------------

    def assignment_written(self, key: str) -> None:
        self._note("assignments", key, self.clock())

    def assignment_effective(self, key: str) -> bool:
        return self._settled("assignments", key)

    def assignment_deleted(self, key: str, role_guid: str) -> None:
        self.written["assignments"].pop(key, None)
        self._note("unassigned", role_guid.lower(), self.clock())

    def recently_unassigned(self, role_guid: str) -> bool:
        """An assignment of the role was deleted less than the spread ago: ARM still counts it."""
        return not self._settled("unassigned", role_guid.lower())

    # --- identities -----------------------------------------------------------------------

    def identity_made(self, principal_id: str) -> None:
        self._note("identities", principal_id, self.clock())

    def identity_ready(self, principal_id: str) -> bool:
        return self._settled("identities", principal_id)
