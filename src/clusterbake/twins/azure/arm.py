"""An HTTPS fake of Azure Resource Manager, driven through the real azure-mgmt SDK clients.

    python -m clusterbake.twins.azure.arm --dir DIR [--port 0] [--proxy-port 0]

Writes `DIR/endpoints.json` once listening: the ARM URL, the proxy URL, the CA file, the
subscription and tenant, and the environment a client needs (`env`). The resources and
Azure's rules are in state.py (and its mixins); this module is ARM's wire protocol, with the
shared HTTP plumbing in handler.py, Key Vault's data plane in vault_plane.py and the endpoints
behind the CONNECT proxy in services.py:

- **URLs** are ARM's (`/subscriptions/{s}/resourceGroups/{g}/providers/{ns}/{type}/{name}`,
  case-insensitive), every ARM request needs `api-version` (MissingApiVersionParameter,
  InvalidApiVersionParameter otherwise) and a bearer token the twin issued
  (AuthenticationFailed / InvalidAuthenticationToken, 401).
- **Long-running operations**: PUT answers 201 (200 on update) with the resource in
  provisioningState Creating/Updating, DELETE and actions 202; both with
  `Azure-AsyncOperation` (status `InProgress` -> `Succeeded`/`Failed` with `error`),
  `Location` (202 until done) and `Retry-After: 1`.
- **Errors**: `{"error": {"code", "message", "target"}}` with Azure's codes.
- **Paging**: lists answer `value` and `nextLink` (`$skiptoken`), `page_size` items a page.
- **Tokens** (clients authenticate as an App Service managed identity, a documented
  azure-identity source): `GET /msi/token?api-version=2019-08-01&resource=...` with the
  `X-IDENTITY-HEADER` secret; `client_id=` asks for a user-assigned identity's token.
  Tokens are HMAC-signed JWTs holding the principal's `oid`.
- **Key Vault data plane** at the vault's real URL `https://<vault>.vault.azure.net/`:
  clients reach it through the twin's CONNECT proxy (`HTTPS_PROXY`), which only tunnels
  `*.vault.azure.net:443` and terminates TLS with the twin's certificate. Key Vault's
  challenge (401 with `WWW-Authenticate: Bearer authorization=..., resource=...`), then
  access policies decide; secrets are versioned (a version can be listed, disabled with
  UpdateSecret, and a disabled one is refused with 403 SecretDisabled), delete is soft; a
  value over 25 KB is refused (400 BadParameter, SecretTooLarge) while that strict switch is on.
- **Strict behaviours, ON**: Compute throttling (throttle.py), Azure Policy deny assignments
  (policy.py, none until a test sets them), VM list options (compute.py `vm_list`),
  subscription-wide lists filtered by the caller's role assignments; and the switches below.
- **Test switches** (`/_twin/...`, no token needed): `PUT /_twin/capacity`
  `{"<size>": {"limit": n, "code": "AllocationFailed"}}`, `PUT /_twin/quota`
  `{"<location>": {"<usage name>": limit}}`, `PUT /_twin/strict` `{"<switch>": false}` (each
  strictness of state.STRICT, on by default; `GET` shows them), `PUT|GET /_twin/throttle`
  (Compute's policies; `refused`), `PUT /_twin/policies` (deny assignments), `GET /_twin/state`
  (everything, for tests, and `warnings`: what Azure accepts that the twin notes), `GET
  /_twin/amlfs` (per Managed Lustre file system, each NIC address of its network: null when its
  servers reach it, else why not: lustre.py), `GET /_twin/vms/<name>/custom-data` (what a VM was
  given), `GET|PUT /_twin/spread` `{"rbac": s, "identity": s}` (replication.py: how long RBAC
  writes and new identities take to take effect; $ARM_TWIN_RBAC_SPREAD and
  $ARM_TWIN_IDENTITY_SPREAD at start, default 3), `GET|PUT /_twin/controller` `{"restricted": true}`
  (the controller held to its role assignments like any principal, not the subscription's owner;
  `actions`: what its requests needed since the last PUT, linked actions included: rbac.required).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

from clusterbake.twins.azure import api_versions, policy, rbac, skus, throttle
from clusterbake.twins.azure.handler import ARM_AUDIENCE, AUDIENCES, STORAGE_AUDIENCE, VAULT_AUDIENCE, Handler, Reply  # noqa: F401
from clusterbake.twins.azure.services import (  # noqa: F401
    BlobHandler,
    BootLogHandler,
    PricesHandler,
    ProxyHandler,
    ProxyServer,
    ServiceHandler,
    TlsServer,
)
from clusterbake.twins.azure.state import ArmError, ArmState, Operation, ResourceId
from clusterbake.twins.azure.tls import make_certificates, server_context
from clusterbake.twins.azure.vault_plane import VaultHandler  # noqa: F401

LOCATIONS = sorted(skus.LOCATIONS)
API_VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}(-preview)?$")
TOKEN_SECONDS = 3600


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Twin:
    """The twin's state, its signing key and its settings, shared by both listeners."""

    # A VM's vmId -> its node's serial console log (None: no node); the daemon sets its nodes'.
    console_log: Callable[[str], Path | None] = staticmethod(lambda vm_id: None)

    def __init__(self, state: ArmState, directory: Path, page_size: int = 25, identity_header: str | None = None):
        self.state = state
        self.directory = directory
        self.page_size = page_size
        self.key = secrets.token_bytes(32)
        self.identity_header = identity_header or secrets.token_hex(16)
        self.controller_oid = str(state.guid("controller"))
        # The controller: the subscription's owner unless restricted (PUT /_twin/controller), when its role
        # assignments decide as for any principal; the actions of its requests are recorded either way.
        self.controller_restricted = False
        self.controller_actions: set[str] = set()
        self.state_file = directory / "state.json"
        self.base_url = ""  # set once listening
        self.blob_root: Path | None = None  # where the blob containers' files are (the twin's node storage)
        self.throttle = throttle.Throttle.of(throttle.DEFAULT_POLICIES)  # Compute's, ON (PUT /_twin/throttle)
        self.policies: list[dict] = []  # Azure Policy deny assignments a test set (PUT /_twin/policies)

    def boot_diagnostics(self, vm: dict, query: dict) -> dict:
        """retrieveBootDiagnosticsData: SAS URIs of the VM's serial console log and screenshot in
        boot diagnostics' managed storage, readable until they expire; refused without boot diagnostics."""
        diagnostics = ((vm["properties"].get("diagnosticsProfile") or {}).get("bootDiagnostics")) or {}
        if not diagnostics.get("enabled"):
            raise ArmError(
                409, "OperationNotAllowed", f"Boot diagnostics is not enabled for the virtual machine '{vm['name']}'."
            )
        minutes = int(query.get("sasUriExpirationTimeInMinutes") or 120)
        if not 1 <= minutes <= 1440:
            raise ArmError(400, "InvalidParameter", "sasUriExpirationTimeInMinutes must be from 1 to 1440.")
        vm_id = vm["properties"]["vmId"].lower()
        host = f"md-{hashlib.sha256(vm_id.encode()).hexdigest()[:12]}.blob.storage.azure.net"
        expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + minutes * 60))

        def uri(blob_name: str) -> str:
            path = f"/bootdiagnostics-{vm_id}/{vm['name']}.{vm_id}.{blob_name}"
            return f"https://{host}{path}?" + urlencode({"sv": "2022-11-02", "sr": "b", "sp": "r", "se": expiry,
                                                           "sig": self.boot_log_signature(path, expiry)})  # fmt: skip

        return {"consoleScreenshotBlobUri": uri("screenshot.bmp"), "serialConsoleLogBlobUri": uri("serialconsole.log")}

    def boot_log_signature(self, path: str, expiry: str) -> str:
        return _b64(hmac.new(self.key, f"bootdiagnostics\n{path}\n{expiry}".encode(), hashlib.sha256).digest())

    def token(self, oid: str, audience: str, app_id: str) -> tuple[str, int]:
        expires = int(time.time()) + TOKEN_SECONDS
        header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        payload = _b64(
            json.dumps(
                {
                    "aud": audience,
                    "iss": f"https://sts.windows.net/{self.state.tenant}/",
                    "oid": oid,
                    "tid": self.state.tenant,
                    "appid": app_id,
                    "exp": expires,
                    "iat": int(time.time()),
                }
            ).encode()
        )
        signature = _b64(hmac.new(self.key, f"{header}.{payload}".encode(), hashlib.sha256).digest())
        return f"{header}.{payload}.{signature}", expires

    def identity_token(self, identity: dict, resource: str) -> tuple[str, int]:
        """A token of a VM's user-assigned identity ({"principalId", "clientId"}) for IMDS (imds.py Token):
        ValueError for an audience the twin does not issue, LookupError while the identity has not
        replicated yet (replication.py)."""
        audience = resource.removesuffix("/.default").rstrip("/")
        if audience not in AUDIENCES:
            raise ValueError(
                f"AADSTS500011: The resource principal named {resource} was not found in the tenant "
                f"{self.state.tenant} (the twin issues tokens for {', '.join(AUDIENCES)})"
            )
        with self.state.lock:
            if not self.state.replication.identity_ready(identity["principalId"]):
                raise LookupError(f"identity {identity['clientId']} has not replicated yet")
        return self.token(identity["principalId"], resource, identity["clientId"])

    def verify(self, authorization: str | None, audience: str) -> dict:
        if not authorization:
            raise ArmError(
                401,
                "AuthenticationFailed",
                "Authentication failed. The 'Authorization' header is missing.",
            )
        scheme, _, token = authorization.partition(" ")
        parts = token.split(".")
        if scheme.lower() != "bearer" or len(parts) != 3:
            raise ArmError(401, "AuthenticationFailed", "Authentication failed. The 'Authorization' header is invalid.")
        expected = _b64(hmac.new(self.key, f"{parts[0]}.{parts[1]}".encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(expected, parts[2]):
            raise ArmError(401, "InvalidAuthenticationToken", "The access token is invalid.")
        claims = json.loads(_unb64(parts[1]))
        if claims["exp"] < time.time():
            raise ArmError(401, "ExpiredAuthenticationToken", "The access token expiry UTC time is in the past.")
        if claims["aud"].rstrip("/") != audience:
            raise ArmError(
                401,
                "InvalidAuthenticationTokenAudience",
                f"The access token has been obtained for wrong audience or resource '{claims['aud']}'. It should "
                f"exactly match with one of the allowed audiences '{audience}'.",
            )
        return claims

    def save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state.snapshot(), indent=1, sort_keys=True))
        tmp.replace(self.state_file)


class ArmHandler(Handler):
    def route(self, path: str, query: dict, body) -> None:
        state = self.twin.state
        if path.startswith("/_twin/"):
            self.twin_route(path, body)
        if path == "/msi/token":
            self.msi_token(query)
        version = query.get("api-version")
        if version is None:
            raise ArmError(
                400,
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            )
        if not API_VERSION.match(version):
            raise ArmError(
                400,
                "InvalidApiVersionParameter",
                f"The api-version '{version}' is invalid. The supported versions are dates such as '2024-07-01'.",
            )
        self.claims = self.twin.verify(self.headers.get("Authorization"), ARM_AUDIENCE)
        self.controller = controller = self.claims["oid"] == self.twin.controller_oid
        if controller:
            self.record_controller_actions(path, body)
        if not controller or self.twin.controller_restricted:
            self.authorize(path, body)  # a managed identity (or a restricted operator): its role assignments decide
        state.actor = (self.claims["appid"], "Application" if controller else "ManagedIdentity")
        parts = [p for p in path.split("/") if p]
        lower = [p.lower() for p in parts]
        self.answer_headers |= self.twin.throttle.charge(throttle.policy_of(self.command, parts))
        if len(parts) < 2 or lower[0] != "subscriptions":
            raise ArmError(404, "InvalidResourceType", f"The resource path '{path}' is not known to this twin.")
        subscription = parts[1]
        state.check_subscription(subscription)
        rest, rest_lower = parts[2:], lower[2:]
        if not rest:
            raise Reply(
                200,
                {
                    "id": f"/subscriptions/{state.subscription}",
                    "subscriptionId": state.subscription,
                    "tenantId": state.tenant,
                    "displayName": "clusterbake twin",
                    "state": "Enabled",
                },
            )
        if "microsoft.authorization" in rest_lower:
            at = rest_lower.index("microsoft.authorization")
            if at >= 1 and rest_lower[at - 1] == "providers":
                scope = "/" + "/".join(parts[: at + 1])
                self.authorization_route(scope, rest[at + 1 :], query, body)
        if rest_lower[0] == "resourcegroups":
            self.groups_route(subscription, rest, rest_lower, query, body)
        if rest_lower[0] == "resources" and len(rest) == 1 and self.command == "GET":
            self.list_resources(subscription, None, query)
        if rest_lower[0] == "providers" and len(rest) >= 2:
            self.subscription_provider_route(subscription, rest, rest_lower, query, body)
        raise ArmError(404, "InvalidResourceType", f"The resource path '{path}' is not known to this twin.")

    # --- role definitions and assignments (rbac.py) ------------------------------------------

    def record_controller_actions(self, path: str, body) -> None:
        needed = rbac.required(self.command, path, body if isinstance(body, dict) else {})
        if needed is not None:
            action, _, linked = needed
            self.twin.controller_actions |= {action, *(linked_action for linked_action, _ in linked)}

    def authorize(self, path: str, body) -> None:
        """ARM's RBAC for a principal that is not the subscription's owner (the controller): the request's
        action at its scope, then each linked action (a subnet a NIC joins, an identity a VM gets, ...)."""
        state = self.twin.state
        needed = rbac.required(self.command, path, body if isinstance(body, dict) else {})
        if needed is None:
            return
        action, scope, linked = needed
        who = f"The client '{self.claims['appid']}' with object id '{self.claims['oid']}'"
        if not state.allowed(self.claims["oid"], action, scope):
            raise ArmError(
                403,
                "AuthorizationFailed",
                f"{who} does not have authorization to perform action '{action}' over scope '{scope}' or the scope "
                "is invalid. If access was recently granted, please refresh your credentials.",
            )
        for linked_action, linked_scope in linked:
            if not state.allowed(self.claims["oid"], linked_action, linked_scope):
                raise ArmError(
                    403,
                    "LinkedAuthorizationFailed",
                    f"{who} has permission to perform action '{action}' on scope '{scope}'; however, it does not have "
                    f"permission to perform action(s) '{linked_action}' on the linked scope(s) '{linked_scope}' "
                    "(respectively) or the linked scope(s) are invalid.",
                )

    def authorization_route(self, scope: str, tail: list[str], query: dict, body) -> None:
        state = self.twin.state
        lower = [t.lower() for t in tail]
        if lower == ["roleassignments"] and self.command == "GET":
            principal = re.search(r"principalId eq '([^']+)'", query.get("$filter") or "")
            self.page(state.list_role_assignments(scope, principal.group(1) if principal else None), query)
        if len(lower) == 2 and lower[0] == "roleassignments":
            if self.command == "PUT":
                raise Reply(*state.put_role_assignment(scope, tail[1], body))
            if self.command == "GET":
                raise Reply(200, state.get_role_assignment(scope, tail[1]))
            if self.command == "DELETE":
                removed = state.delete_role_assignment(scope, tail[1])
                raise Reply(200, removed) if removed else Reply(204)
        if lower == ["roledefinitions"] and self.command == "GET":
            name = re.search(r"roleName eq '([^']+)'", query.get("$filter") or "")
            found = [state.role_definition(g) for g in rbac.BUILT_IN_ROLES]
            found += list(state.role_definitions.values())
            self.page([d for d in found if not name or d["properties"]["roleName"] == name.group(1)], query)
        if len(lower) == 2 and lower[0] == "roledefinitions":
            if self.command == "PUT":
                raise Reply(201, state.put_role_definition(tail[1], body))
            if self.command == "GET":
                found = state.role_definition(tail[1])
                if found is None:
                    raise rbac.role_missing(tail[1], 404)
                raise Reply(200, found)
            if self.command == "DELETE":
                removed = state.delete_role_definition(tail[1])
                raise Reply(200, removed) if removed else Reply(204)
        raise ArmError(404, "InvalidResourceType", f"'{'/'.join(tail)}' of Microsoft.Authorization is not emulated.")

    # --- twin switches and tokens ----------------------------------------------------------

    def twin_route(self, path: str, body) -> None:
        state = self.twin.state
        if path == "/_twin/capacity" and self.command == "PUT":
            state.capacity = {k.lower(): dict(v) for k, v in (body or {}).items()}
            raise Reply(200, state.capacity)
        if path == "/_twin/quota" and self.command == "PUT":
            state.quota = {k.lower(): dict(v) for k, v in (body or {}).items()}
            raise Reply(200, state.quota)
        if path == "/_twin/strict" and self.command == "PUT":
            raise Reply(200, state.set_strict(body if isinstance(body, dict) else {}))
        if path == "/_twin/controller" and self.command in ("GET", "PUT"):
            if self.command == "PUT":  # {"restricted": bool}: starts a new record of its actions
                self.twin.controller_restricted = bool((body or {}).get("restricted"))
                self.twin.controller_actions = set()
            raise Reply(200, {"object_id": self.twin.controller_oid, "restricted": self.twin.controller_restricted,
                              "actions": sorted(self.twin.controller_actions)})  # fmt: skip
        if path == "/_twin/strict" and self.command == "GET":
            raise Reply(200, state.strict)
        if path == "/_twin/spread" and self.command in ("GET", "PUT"):
            spread = state.replication.spread
            for kind, seconds in (body or {}).items() if self.command == "PUT" else ():
                if kind not in spread or not isinstance(seconds, int | float) or seconds < 0:
                    raise ArmError(400, "InvalidRequestContent", f"spread: {kind!r} must be rbac or identity, >= 0 s")
                spread[kind] = float(seconds)
            raise Reply(200, spread)
        if path == "/_twin/throttle" and self.command == "PUT":
            unknown = sorted(set(body or {}) - set(throttle.DEFAULT_POLICIES))
            if unknown:
                raise ArmError(400, "InvalidParameter", f"no Compute policy {unknown} (the twin counts "
                               f"{', '.join(throttle.DEFAULT_POLICIES)})")  # fmt: skip
            policies = {name: (p["limit"], p["seconds"]) for name, p in (body or {}).items()}
            self.twin.throttle = throttle.Throttle.of(policies)
            raise Reply(200, self.twin.throttle.settings())
        if path == "/_twin/throttle" and self.command == "GET":
            raise Reply(200, self.twin.throttle.settings())
        if path == "/_twin/policies" and self.command == "PUT":
            self.twin.policies = policy.validated(body or [], state.subscription)
            raise Reply(200, self.twin.policies)
        if path == "/_twin/state" and self.command == "GET":
            raise Reply(200, state.snapshot() | {"controller_oid": self.twin.controller_oid,
                                                 "warnings": state.warnings()})  # fmt: skip
        if path == "/_twin/amlfs" and self.command == "GET":
            raise Reply(200, {fs["id"]: {"mgsAddress": fs["properties"]["clientInfo"]["mgsAddress"],
                                         "clients": state.amlfs_clients(fs)}
                              for fs in state.amlfs_filesystems()})  # fmt: skip
        match = re.fullmatch(r"/_twin/vms/([^/]+)/custom-data", path)
        if match and self.command == "GET":
            for vm in state.resources.values():
                if vm["type"] == "Microsoft.Compute/virtualMachines" and vm["name"] == match.group(1):
                    raise Reply(200, {"customData": vm.get("_custom_data"), "userData": vm.get("_user_data")})
            raise ArmError(404, "ResourceNotFound", f"no VM {match.group(1)}")
        raise ArmError(404, "NotFound", f"{self.command} {path}: no such twin switch")

    def msi_token(self, query: dict) -> None:
        """App Service managed identity protocol (IDENTITY_ENDPOINT / IDENTITY_HEADER)."""
        if self.headers.get("X-IDENTITY-HEADER") != self.twin.identity_header:
            raise Reply(401, {"statusCode": 401, "message": "X-IDENTITY-HEADER is missing or wrong"})
        if query.get("api-version") != "2019-08-01":
            raise Reply(400, {"statusCode": 400, "message": "api-version 2019-08-01 is required"})
        resource = query.get("resource", "").removesuffix("/.default").rstrip("/")
        if resource not in AUDIENCES:
            raise Reply(400, {"statusCode": 400, "message": f"unknown resource {resource!r}"})
        client_id = query.get("client_id")
        if client_id:
            state = self.twin.state
            identity = state.identity_by_client_id(client_id)
            if identity is None or not state.replication.identity_ready(identity["properties"]["principalId"]):
                # App Service's answer for an identity it cannot use (one not assigned, or not replicated yet).
                raise Reply(400, {"statusCode": 400, "message": "Unable to load the proper Managed Identity.",
                                  "correlationId": str(uuid.uuid4())})  # fmt: skip
            oid, app = identity["properties"]["principalId"], client_id
        else:
            oid, app = self.twin.controller_oid, "clusterbake-controller"
        token, expires = self.twin.token(oid, resource, app)
        raise Reply(
            200,
            {
                "access_token": token,
                "expires_on": str(expires),
                "resource": resource,
                "token_type": "Bearer",
                "client_id": app,
            },
        )

    # --- responses --------------------------------------------------------------------------

    def page(self, items: list, query: dict) -> None:
        start = int(query.get("$skiptoken") or 0)
        size = self.twin.page_size
        body: dict = {"value": items[start : start + size]}
        if start + size < len(items):
            split = urlsplit(self.path)
            params = {k: v for k, v in query.items() if k != "$skiptoken"} | {"$skiptoken": str(start + size)}
            body["nextLink"] = f"{self.twin.base_url}{split.path}?{urlencode(params, quote_via=quote)}"
        raise Reply(200, body)

    def lro(self, status: int, body, op: Operation | None, version: str) -> None:
        if op is None:
            raise Reply(status, body)
        base = (
            f"{self.twin.base_url}/subscriptions/{self.twin.state.subscription}/providers/{op.namespace}"
            f"/locations/{op.location}"
        )
        headers = {"Azure-AsyncOperation": f"{base}/operations/{op.id}?api-version={version}", **_retry_after(op)}
        if status == 202:
            headers["Location"] = f"{base}/operationResults/{op.id}?api-version={version}"
        raise Reply(status, body, headers)

    # --- resource groups --------------------------------------------------------------------

    def groups_route(self, subscription, rest, lower, query, body) -> None:
        state = self.twin.state
        if len(rest) == 1:
            if self.command != "GET":
                raise ArmError(405, "MethodNotAllowed", "Use GET to list resource groups.")
            groups = [g for _, g in sorted(state.groups.items())]
            tag = _tag_filter(query.get("$filter"))
            if tag is not None:
                groups = [g for g in groups if tag[0] in g["tags"] and (tag[1] is None or g["tags"][tag[0]] == tag[1])]
            self.page(groups, query)
        name = rest[1]
        if len(rest) == 2:
            if self.command == "PUT":
                status, group = state.put_group(name, body)
                raise Reply(status, group)
            if self.command == "GET":
                raise Reply(200, state.group(name))
            if self.command == "HEAD":
                raise Reply(204 if name.lower() in state.groups else 404)
            if self.command == "PATCH":
                group = state.group(name)
                if "tags" in body:
                    group["tags"] = state._tags(body["tags"])
                raise Reply(200, group)
            if self.command == "DELETE":
                op = state.delete_group(name)
                if op is None:
                    raise ArmError(404, "ResourceGroupNotFound", f"Resource group '{name}' could not be found.")
                self.lro(202, None, op, query["api-version"])
        if len(rest) == 3 and lower[2] == "resources" and self.command == "GET":
            self.list_resources(subscription, name, query)
        if len(rest) >= 4 and lower[2] == "providers":
            self.resource_route(subscription, name, rest[3:], query, body)
        raise ArmError(404, "InvalidResourceType", f"The resource path '{self.path}' is not known to this twin.")

    def listing(self, subscription: str, group: str | None, type_key: str, query: dict) -> list[dict]:
        """A collection GET: the resources of a type in the group (None: the subscription). A subscription-wide
        list answers only what the caller may read (ARM filters it by their role assignments, where a
        group's list needs read on the group); VMs with List's query options (compute.vm_list)."""
        state = self.twin.state
        items = state.list(subscription, group, type_key)
        if group is None and not self.controller:
            items = [i for i in items if state.allowed(self.claims["oid"], f"{i['type']}/read", i["id"])]
        if type_key == "microsoft.compute/virtualmachines":
            items = state.vm_list(items, query)
        return items

    def list_resources(self, subscription, group, query) -> None:
        text = query.get("$filter")
        tag = _tag_filter(text)
        rtype = None
        if text and (match := re.search(r"resourceType eq '([^']+)'", text)):
            rtype = match.group(1)
        self.page(self.twin.state.generic_list(subscription, group, tag, rtype), query)

    def resource_route(self, subscription, group, rest, query, body) -> None:
        """rest: [namespace, type, name, (childtype, childname)*, (action)?]"""
        state = self.twin.state
        version = query["api-version"]
        namespace = rest[0]
        tail = rest[1:]
        if tail:
            api_versions.check(f"{namespace}/{tail[0]}", version, LOCATIONS[0])
        state.api_version = version
        if len(tail) % 2 == 1:
            if len(tail) == 1:  # a collection of top-level resources
                if self.command != "GET":
                    raise ArmError(405, "MethodNotAllowed", f"{self.command} on a collection")
                self.page(self.listing(subscription, group, f"{namespace}/{tail[0]}".lower(), query), query)
            # a child collection or an action on a resource
            parent = ResourceId(subscription, group, namespace, tail[:-1][0::2], tail[:-1][1::2])
            last = tail[-1]
            parent_type = parent.type_key
            if parent_type == "microsoft.compute/virtualmachines" and self.command == "POST":
                vm_parent = state.resources.get(parent.key)
                if vm_parent is None:
                    raise ArmError(
                        404, "ResourceNotFound", f"The Resource '{parent.type_name}/{parent.name}' was not found."
                    )
                if last.lower() == "retrievebootdiagnosticsdata":
                    raise Reply(200, self.twin.boot_diagnostics(vm_parent, query))
                op = state.vm_action(parent, last)
                if op is None:
                    raise Reply(200 if last.lower() != "simulateeviction" else 204)
                self.lro(202, None, op, version)
            if (
                parent_type == "microsoft.network/virtualnetworks"
                and last.lower() == "checkipaddressavailability"
                and self.command == "GET"
            ):
                vnet = state.get(parent)
                raise Reply(200, state.check_ip_address_availability(vnet, query.get("ipAddress")))
            if parent_type == "microsoft.compute/virtualmachines" and last.lower() == "instanceview":
                vm = state.get(parent)
                raise Reply(200, state.instance_view(state.resources[parent.key]) if vm else None)
            if self.command == "GET" and state.resources.get(parent.key) is not None:
                child_type = f"{parent_type}/{last}".lower()
                self.page(state.list(subscription, group, child_type, parent=str(parent)), query)
            state.get(parent)  # 404 for the parent
            raise ArmError(404, "InvalidResourceType", f"'{last}' is not known to this twin.")
        rid = ResourceId(subscription, group, namespace, tail[0::2], tail[1::2])
        if rid.type_key == "microsoft.keyvault/vaults/accesspolicies" and self.command == "PUT":
            raise Reply(200, state.update_access_policy(rid, rid.name, body))
        if self.command == "GET":
            resource = state.get(rid)
            if rid.type_key == "microsoft.compute/virtualmachines" and query.get("$expand") == "instanceView":
                resource = state.view(state.resources[rid.key], expand_instance_view=True)
            raise Reply(200, resource)
        if self.command == "PUT":
            policy.check(self.twin.policies, rid, body if isinstance(body, dict) else {})
            status, resource, op = state.put(rid, body)
            if op is not None and rid.type_key == "microsoft.storage/storageaccounts":
                # The storage provider answers a create with 202 and no body (its SDK accepts 200 or 202).
                self.lro(202, None, op, version)
            self.lro(status, resource, op, version)
        if self.command == "PATCH":
            existing = state.get(rid)
            merged = {**existing, **{k: v for k, v in body.items() if k != "properties"}}
            merged["properties"] = {**existing.get("properties", {}), **(body.get("properties") or {})}
            policy.check(self.twin.policies, rid, merged)
            status, resource, op = state.put(rid, merged)
            self.lro(200, resource, op, version)
        if self.command == "DELETE":
            status, op = state.delete(rid)
            self.lro(status, None, op, version)
        raise ArmError(405, "MethodNotAllowed", f"{self.command} is not supported here")

    # --- subscription-level providers ---------------------------------------------------------

    def subscription_provider_route(self, subscription, rest, lower, query, body) -> None:
        state = self.twin.state
        namespace = lower[1]
        tail, tail_lower = rest[2:], lower[2:]
        if not tail and self.command == "GET":
            raise Reply(200, api_versions.provider(rest[1], LOCATIONS))
        if namespace == "microsoft.storagecache" and tail_lower == ["checkamlfssubnets"] and self.command == "POST":
            state.check_amlfs_subnets(body)
            raise Reply(200)
        if namespace == "microsoft.compute" and tail_lower == ["skus"]:
            location = None
            if (match := re.search(r"location eq '([^']+)'", query.get("$filter") or "")) is not None:
                location = match.group(1)
            self.page(skus.catalogue(location), query)
        if len(tail) >= 2 and tail_lower[0] == "locations":
            location = tail_lower[1]
            if namespace == "microsoft.compute" and tail_lower[2:] == ["usages"]:
                usage = state.usage(location)
                items = [
                    {
                        "unit": "Count",
                        "currentValue": current,
                        "limit": limit,
                        "name": {"value": name, "localizedValue": localized},
                    }
                    for name, (current, limit, localized) in usage.items()
                ]
                self.page(items, query)
            if len(tail) == 4 and tail_lower[2] in ("operations", "asyncoperations", "operationresults"):
                op = state.operation(tail[3])
                wait = _retry_after(op)
                if tail_lower[2] == "operationresults":
                    if op.status == "InProgress":
                        raise Reply(202, None, {"Location": self.twin.base_url + self.path, **wait})
                    if op.status == "Failed":
                        raise ArmError(409, op.error["code"], op.error["message"])
                    raise Reply(204)
                status = {"name": op.id, "status": op.status, "startTime": op.started}
                if op.error:
                    status["error"] = op.error
                raise Reply(200, status, wait if op.status == "InProgress" else {})
            if namespace == "microsoft.keyvault" and len(tail) >= 4 and tail_lower[2] == "deletedvaults":
                name = tail[3]
                deleted = state.deleted_vaults.get(name.lower())
                if len(tail) == 4 and self.command == "GET":
                    if deleted is None or deleted["properties"]["location"] != location:
                        raise ArmError(404, "ResourceNotFound", f"The deleted vault '{name}' was not found.")
                    raise Reply(200, _public(deleted))
                if len(tail) == 5 and tail_lower[4] == "purge" and self.command == "POST":
                    op = state.purge_vault(location, name)
                    self.lro(202, None, op, query["api-version"])
        if namespace == "microsoft.keyvault" and tail_lower == ["deletedvaults"]:
            self.page([_public(v) for _, v in sorted(state.deleted_vaults.items())], query)
        if len(tail) == 1 and self.command == "GET":  # every resource of a type in the subscription
            self.page(self.listing(subscription, None, f"{namespace}/{tail_lower[0]}", query), query)
        raise ArmError(404, "InvalidResourceType", f"The resource path '{self.path}' is not known to this twin.")


def _public(resource: dict) -> dict:
    return {k: v for k, v in resource.items() if not k.startswith("_")}


def _retry_after(op: Operation) -> dict[str, str]:
    """When to ask again: Retry-After in whole seconds, or retry-after-ms (which azure-core also reads)
    for the twin's sub-second operations."""
    remaining = max(op.due - time.monotonic(), 0.05)
    if remaining >= 1:
        return {"Retry-After": str(int(remaining + 0.999))}
    return {"retry-after-ms": str(int(remaining * 1000) + 10)}


def _tag_filter(text: str | None) -> tuple[str, str | None] | None:
    """`tagName eq 'k' and tagValue eq 'v'` (or tagName alone) of a $filter."""
    if not text:
        return None
    name = re.search(r"tagName eq '([^']+)'", text)
    if name is None:
        return None
    value = re.search(r"tagValue eq '([^']*)'", text)
    return name.group(1), value.group(1) if value else None


# --- Key Vault data plane ------------------------------------------------------------------------


def serve(directory: Path, host: str = "127.0.0.1", port: int = 0, proxy_port: int = 0, page_size: int = 25,
          operation_seconds: float = 0.2, identity_header: str | None = None) -> tuple[Twin, list]:  # fmt: skip
    """Start both listeners in threads; returns the twin and the servers (shutdown() them to stop).
    The replication spreads come from the environment (replication.py)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = ArmState(operation_seconds=operation_seconds)
    state_file = directory / "state.json"
    twin = Twin(state, directory, page_size=page_size, identity_header=identity_header)
    if state_file.exists():
        state.restore(json.loads(state_file.read_text()))
    ca, cert, key = make_certificates(directory / "tls")
    context = server_context(cert, key)
    arm = TlsServer((host, port), type("TwinArmHandler", (ArmHandler,), {"twin": twin}), context)
    proxy = ProxyServer(
        (host, proxy_port), type("TwinProxyHandler", (ProxyHandler,), {"twin": twin, "context": context})
    )
    twin.base_url = f"https://{host}:{arm.server_address[1]}"
    for server in (arm, proxy):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy_url = f"http://{host}:{proxy.server_address[1]}"
    endpoints = {
        "arm": twin.base_url,
        "proxy": proxy_url,
        "ca_file": str(ca),
        "subscription_id": state.subscription,
        "tenant_id": state.tenant,
        "controller_object_id": twin.controller_oid,
        "env": {
            "AZURE_RESOURCE_MANAGER_ENDPOINT": twin.base_url,
            "IDENTITY_ENDPOINT": f"{twin.base_url}/msi/token",
            "IDENTITY_HEADER": twin.identity_header,
            "REQUESTS_CA_BUNDLE": str(ca),
            "HTTPS_PROXY": proxy_url,
            "NO_PROXY": f"{host},localhost",
        },
    }
    tmp = directory / "endpoints.json.tmp"
    tmp.write_text(json.dumps(endpoints, indent=2))
    tmp.replace(directory / "endpoints.json")
    return twin, [arm, proxy]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="HTTPS fake of Azure Resource Manager (clusterbake's Azure twin)")
    parser.add_argument("--dir", required=True, type=Path, help="state, TLS files and endpoints.json")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--proxy-port", type=int, default=0)
    parser.add_argument("--page-size", type=int, default=int(os.environ.get("ARM_TWIN_PAGE_SIZE", "25")))
    parser.add_argument(
        "--operation-seconds", type=float, default=float(os.environ.get("ARM_TWIN_OPERATION_SECONDS", "0.2"))
    )
    args = parser.parse_args(argv)
    _, servers = serve(args.dir, args.host, args.port, args.proxy_port, args.page_size, args.operation_seconds)
    print(json.dumps({"endpoints": str(args.dir / "endpoints.json")}), flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    for server in servers:
        server.shutdown()
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(None)
    sys.exit(main())
