"""The Azure twin's instance metadata service: one HTTP server answering every node as Azure's IMDS does.

Requests come from the nodes' own addresses (the server listens on 169.254.169.254:80 in
the twin's service namespace on the nodes' bridge), so the source address says which VM
asks. Behaviour follows "Azure Instance Metadata Service"
(https://learn.microsoft.com/azure/virtual-machines/instance-metadata-service), "How to
use managed identities for Azure resources on an Azure VM to acquire an access token" and
"Azure Metadata Service: Scheduled Events for Linux VMs":

- every request needs the header `Metadata: true` (400 otherwise) and must not carry
  `X-Forwarded-For` (400: IMDS is not to be reached through a proxy);
- `api-version` is required (400 with `newest-versions` when missing or unknown), except
  for `/metadata/versions`;
- `/metadata/instance` (`compute`, `network`), and any path below it
  (`/metadata/instance/compute/vmSize`); leaves with `format=text` answer plain text;
  `compute.userData` is the VM's userData (base64), `customData` is always empty (Azure's
  IMDS does not serve it);
- `/metadata/identity/oauth2/token?resource=...[&client_id=|object_id=|msi_res_id=]`: an
  access token of one of the VM's user-assigned identities; without a selector only when
  the VM has exactly one; `400 invalid_request "Identity not found"` for an identity the
  VM does not have, and for one that has not replicated yet (a new identity: the twin's
  identity spread, replication.py; Azure documents no other answer for it);
- `/metadata/scheduledevents`: `{"DocumentIncarnation", "Events"}`, events set by tests
  through the twin's control socket; a POST of `{"StartRequests": [{"EventId"}]}`
  approves (removes) events, as a VM acknowledges them.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

INSTANCE_VERSIONS = (
    "2017-03-01", "2017-04-02", "2017-08-01", "2017-10-01", "2017-12-01", "2018-02-01", "2018-04-02",
    "2018-10-01", "2019-02-01", "2019-03-11", "2019-04-30", "2019-06-01", "2019-06-04", "2019-08-01",
    "2019-08-15", "2019-11-01", "2020-06-01", "2020-07-15", "2020-09-01", "2020-10-01", "2020-12-01",
    "2021-01-01", "2021-02-01", "2021-03-01", "2021-05-01", "2021-10-01", "2021-11-01", "2021-11-15",
    "2021-12-13", "2023-07-01",
)  # fmt: skip
NEWEST = ["2023-07-01", "2021-12-13", "2021-11-15"]
USER_DATA_SINCE = "2021-01-01"
TOKEN_VERSIONS = ("2018-02-01", "2019-08-01")
EVENT_VERSIONS = ("2017-08-01", "2017-11-01", "2019-01-01", "2019-08-01", "2020-07-01")

# lookup(source address) -> None (no VM there) or a dict:
#   instance: the instance document {"compute": ..., "network": ...}
#   identities: [{"id", "clientId", "principalId"}] of the VM's user-assigned identities
#   vm: the VM's name (scheduled events are per VM)
Lookup = Callable[[str], dict[str, Any] | None]
# token(identity, resource) -> (access token, expires_on) for that identity and audience; raises
# ValueError for a resource the twin cannot issue tokens for, LookupError for an identity that has not
# replicated yet.
Token = Callable[[dict, str], tuple[str, int]]
# events(vm name) -> {"DocumentIncarnation", "Events"}; approve(vm name, [event ids]) -> None
Events = Callable[[str], dict]
Approve = Callable[[str, list[str]], None]


class Handler(BaseHTTPRequestHandler):
    server: MetadataServer
    protocol_version = "HTTP/1.1"
    server_version = "IMDS/150.870.65.1325"  # what Azure's IMDS calls itself

    def log_message(self, format: str, *args: Any) -> None:
        self.server.log(f"{self.client_address[0]} {format % args}")

    def _send(self, status: int, body: Any, text: bool = False) -> None:
        data = (body if text else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8" if text else "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _common(self) -> tuple[str, dict[str, str], dict] | None:
        """(path, query, the VM's lookup) once the request passed Azure's checks; None: answered."""
        if "X-Forwarded-For" in self.headers:
            self._send(
                HTTPStatus.BAD_REQUEST, {"error": "Bad request. Requests with header X-Forwarded-For are not allowed"}
            )
            return None
        if (self.headers.get("Metadata") or "").lower() != "true":
            self._send(HTTPStatus.BAD_REQUEST, {"error": "Bad request. Required metadata header not specified"})
            return None
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        vm = self.server.lookup(self.client_address[0])
        if vm is None:
            self._send(HTTPStatus.NOT_FOUND, {"error": "Not found. No virtual machine of the twin at this address"})
            return None
        return split.path.rstrip("/") or "/", query, vm

    def _version(self, query: dict, known: tuple[str, ...]) -> str | None:
        version = query.get("api-version")
        if version is None:
            self._send(
                HTTPStatus.BAD_REQUEST,
                {
                    "error": "Bad request. api-version was not specified in the request. For more information "
                    "refer to aka.ms/azureimds",
                    "newest-versions": NEWEST,
                },
            )
            return None
        if version not in known:
            self._send(
                HTTPStatus.BAD_REQUEST,
                {
                    "error": "Bad request. api-version is invalid or was not specified in the request. For more "
                    "information refer to aka.ms/azureimds",
                    "newest-versions": NEWEST,
                },
            )
            return None
        return version

    def do_GET(self) -> None:
        common = self._common()
        if common is None:
            return
        path, query, vm = common
        if path == "/metadata/versions":
            self._send(HTTPStatus.OK, {"apiVersions": list(INSTANCE_VERSIONS)})
        elif path == "/metadata/instance" or path.startswith("/metadata/instance/"):
            self._instance(vm, path, query)
        elif path == "/metadata/identity/oauth2/token":
            self._token(vm, query)
        elif path == "/metadata/scheduledevents":
            if self._version(query, EVENT_VERSIONS):
                self._send(HTTPStatus.OK, self.server.events(vm["vm"]))
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": "Not found"})

    def do_POST(self) -> None:
        common = self._common()
        if common is None:
            return
        path, query, vm = common
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path != "/metadata/scheduledevents":
            self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "Method not allowed"})
            return
        if not self._version(query, EVENT_VERSIONS):
            return
        try:
            body = json.loads(raw or b"{}")
            ids = [str(r["EventId"]) for r in body.get("StartRequests", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            self._send(HTTPStatus.BAD_REQUEST, {"error": 'Bad request. Expected {"StartRequests": [{"EventId": ...}]}'})
            return
        self.server.approve(vm["vm"], ids)
        self._send(HTTPStatus.OK, {})

    def _instance(self, vm: dict, path: str, query: dict) -> None:
        version = self._version(query, INSTANCE_VERSIONS)
        if version is None:
            return
        document = json.loads(json.dumps(vm["instance"]))
        if version < USER_DATA_SINCE:
            document["compute"].pop("userData", None)
        node: Any = document
        for part in [p for p in path.split("/")[3:] if p]:
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                self._send(HTTPStatus.NOT_FOUND, {"error": "Not found"})
                return
        text = query.get("format") == "text"
        leaf = not isinstance(node, dict | list)
        if text and not leaf:
            self._send(
                HTTPStatus.BAD_REQUEST, {"error": "Bad request. Only leaf nodes can be requested with format=text"}
            )
        elif text:
            self._send(HTTPStatus.OK, str(node), text=True)
        else:
            self._send(HTTPStatus.OK, node)

    def _token(self, vm: dict, query: dict) -> None:
        def error(code: str, description: str) -> None:
            self._send(HTTPStatus.BAD_REQUEST, {"error": code, "error_description": description})

        version = query.get("api-version")
        if version is None:
            error("invalid_request", "Required query variable 'api-version' is missing")
            return
        if version not in TOKEN_VERSIONS:
            error("invalid_request", f"Invalid api-version '{version}'")
            return
        resource = query.get("resource")
        if not resource:
            error("invalid_request", "Required query variable 'resource' is missing")
            return
        identities = vm["identities"]
        selectors = {k: query[k] for k in ("client_id", "object_id", "msi_res_id", "mi_res_id") if query.get(k)}
        if len(selectors) > 1:
            error("invalid_request", "Only one of client_id, object_id or msi_res_id may be given")
            return
        if selectors:
            key, wanted = next(iter(selectors.items()))
            field = {"client_id": "clientId", "object_id": "principalId"}.get(key, "id")
            chosen = [i for i in identities if i[field].lower() == wanted.lower()]
        else:
            if len(identities) > 1:
                error(
                    "invalid_request",
                    "Multiple user assigned identities exist, please specify the clientId / resourceId of the "
                    "identity in the token request",
                )
                return
            chosen = identities
        if not chosen:
            error("invalid_request", "Identity not found")
            return
        try:
            token, expires = self.server.token(chosen[0], resource)
        except ValueError as exc:
            error("invalid_resource", str(exc))
            return
        except LookupError as exc:
            self.server.log(f"{self.client_address[0]} no token yet: {exc}")
            error("invalid_request", "Identity not found")
            return
        self.server.log(f"{self.client_address[0]} token of {chosen[0]['clientId']} for {resource}")
        self._send(
            HTTPStatus.OK,
            {
                "access_token": token,
                "refresh_token": "",
                "expires_in": str(max(expires - int(time.time()), 0)),
                "expires_on": str(expires),
                "ext_expires_in": str(max(expires - int(time.time()), 0)),
                "not_before": str(expires - 3600),
                "resource": resource,
                "token_type": "Bearer",
                "client_id": chosen[0]["clientId"],
            },
        )


class MetadataServer(ThreadingHTTPServer):
    """Serves on an already bound socket (created in the twin's service namespace)."""

    daemon_threads = True

    def __init__(
        self,
        sock: socket.socket,
        lookup: Lookup,
        token: Token,
        events: Events,
        approve: Approve,
        log: Callable[[str], None],
    ):
        super().__init__(sock.getsockname()[:2], Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.lookup, self.token, self.events, self.approve, self.log = lookup, token, events, approve, log
