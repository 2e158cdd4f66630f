"""The twin's instance metadata service: one HTTP server answering every node as EC2's IMDS does.

Requests come from the nodes' own addresses (the server listens on 169.254.169.254:80
in the twin's service namespace, on the nodes' bridge), so the source address says
which instance asks. Behaviour follows the EC2 user guide ("Use the Instance Metadata
Service to access instance metadata", "Instance metadata categories"):

- IMDSv2: `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds` (1-21600)
  returns a token bound to that instance; the response's IP TTL is the instance's
  `HttpPutResponseHopLimit`, so a container one routing hop behind the instance does
  not get it with the default hop limit of 1. A PUT carrying `X-Forwarded-For` is
  refused, as EC2 does.
- `HttpTokens=required`: a GET without a valid token gets 401; `optional`: IMDSv1 works.
  `HttpEndpoint=disabled`: every request gets 403.
- The categories clusterbake and its images use, with EC2's listing format
  (directories end in `/`, `public-keys/` lists `0=<key name>`): ami-id, hostname,
  instance-id, instance-type, local-hostname, local-ipv4, mac, network/interfaces/macs,
  placement/{availability-zone,region}, public-keys, iam/{info,security-credentials/},
  spot/instance-action and events/recommendations/rebalance (only while a notice is
  set), tags/instance (only with InstanceMetadataTags=enabled), services/{domain,partition};
  dynamic/instance-identity/document; user-data.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
MAX_TTL = 21600
VERSION = re.compile(r"^(latest|\d{4}-\d{2}-\d{2})$")

# Builds the metadata of the instance at a source address (None: not an instance of
# the twin). Keys: instance_id, http_tokens, http_endpoint, hop_limit, tags_enabled,
# user_data (bytes | None), meta (the meta-data tree as nested dicts), identity (dict),
# role (str | None); credentials(instance_id, role) -> dict for iam/security-credentials.
Lookup = Callable[[str], dict[str, Any] | None]
Credentials = Callable[[str, str], dict[str, Any] | None]


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Tokens:
    """IMDSv2 session tokens: bound to one instance, valid for their TTL."""

    def __init__(self) -> None:
        self._tokens: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def issue(self, instance_id: str, ttl: int) -> str:
        token = secrets.token_urlsafe(42)
        with self._lock:
            now = time.monotonic()
            self._tokens = {t: v for t, v in self._tokens.items() if v[1] > now}
            self._tokens[token] = (instance_id, now + ttl)
        return token

    def valid(self, token: str, instance_id: str) -> bool:
        with self._lock:
            owner, expires = self._tokens.get(token, ("", 0.0))
        return owner == instance_id and expires > time.monotonic()


def resolve(tree: Any, parts: list[str]) -> Any:
    """The node of the meta-data tree at `parts`, or None."""
    node = tree
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def listing(node: dict) -> str:
    lines = []
    for key, value in node.items():
        if key == "public-keys":
            lines.append("public-keys/")
        elif isinstance(value, dict):
            lines.append(f"{key}/")
        else:
            lines.append(key)
    return "\n".join(lines)


class MetadataHandler(BaseHTTPRequestHandler):
    server: MetadataServer
    protocol_version = "HTTP/1.1"
    server_version = "EC2ws"

    def log_message(self, format: str, *args: Any) -> None:
        self.server.log(f"{self.client_address[0]} {format % args}")

    def _send(self, status: int, body: bytes | str = b"", content_type: str = "text/plain") -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _instance(self) -> dict[str, Any] | None:
        instance = self.server.lookup(self.client_address[0])
        if instance is None:
            self._send(HTTPStatus.NOT_FOUND, "no instance at this address")
            return None
        if instance.get("http_endpoint", "enabled") != "enabled":
            self._send(HTTPStatus.FORBIDDEN, "the instance metadata endpoint is disabled for this instance")
            return None
        return instance

    def do_PUT(self) -> None:
        instance = self._instance()
        if instance is None:
            return
        if self.path.rstrip("/") != "/latest/api/token":
            self._send(HTTPStatus.FORBIDDEN)
            return
        if "X-Forwarded-For" in self.headers:
            self._send(HTTPStatus.FORBIDDEN, "a token request must not carry X-Forwarded-For")
            return
        ttl = self.headers.get(TTL_HEADER, "")
        if not ttl.isdigit() or not 1 <= int(ttl) <= MAX_TTL:
            self._send(HTTPStatus.BAD_REQUEST, f"{TTL_HEADER} must be 1..{MAX_TTL}")
            return
        token = self.server.tokens.issue(instance["instance_id"], int(ttl))
        # The hop limit is the IP TTL of the answer: each routing hop on the way back
        # (a container's bridge behind the instance) takes one.
        self.connection.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, int(instance.get("hop_limit", 1)))
        self._send(HTTPStatus.OK, token)
        self.server.log(f"{self.client_address[0]} token for {instance['instance_id']} (ttl {ttl}s)")

    def do_GET(self) -> None:
        instance = self._instance()
        if instance is None:
            return
        token = self.headers.get(TOKEN_HEADER)
        if token is not None and not self.server.tokens.valid(token, instance["instance_id"]):
            self._send(HTTPStatus.UNAUTHORIZED)
            return
        if token is None and instance.get("http_tokens", "optional") == "required":
            self._send(HTTPStatus.UNAUTHORIZED)
            return
        path = self.path.split("?", 1)[0]
        parts = [p for p in path.split("/") if p]
        if not parts:
            self._send(HTTPStatus.OK, "latest")
            return
        if not VERSION.match(parts[0]):
            self._send(HTTPStatus.NOT_FOUND)
            return
        self._category(instance, parts[1:], trailing_slash=path.endswith("/"))

    do_HEAD = do_GET

    def _category(self, instance: dict[str, Any], parts: list[str], trailing_slash: bool) -> None:
        if not parts:
            top = ["dynamic", "meta-data"] + (["user-data"] if instance.get("user_data") is not None else [])
            self._send(HTTPStatus.OK, "\n".join(top))
            return
        head, rest = parts[0], parts[1:]
        if head == "user-data" and not rest:
            data = instance.get("user_data")
            if data is None:
                self._send(HTTPStatus.NOT_FOUND)
            else:
                self._send(HTTPStatus.OK, data, "application/octet-stream")
            return
        if head == "dynamic":
            tree = {"instance-identity": {"document": json.dumps(instance.get("identity", {}), indent=2)}}
            self._tree(tree, rest)
            return
        if head == "meta-data":
            if rest[:2] == ["iam", "security-credentials"] and len(rest) == 3:
                role = instance.get("role")
                if role is None or rest[2] != role:
                    self._send(HTTPStatus.NOT_FOUND)
                    return
                credentials = self.server.credentials(instance["instance_id"], role)
                if credentials is None:  # a role IAM has not spread yet
                    self._send(HTTPStatus.NOT_FOUND)
                    return
                self._send(HTTPStatus.OK, json.dumps(credentials, indent=2))
                return
            if rest[:1] == ["public-keys"]:
                self._public_keys(instance, rest[1:])
                return
            meta = instance.get("meta", {})
            if instance.get("public_keys"):
                meta = {**meta, "public-keys": {}}  # listed here, answered by _public_keys
            self._tree(meta, rest)
            return
        self._send(HTTPStatus.NOT_FOUND)

    def _public_keys(self, instance: dict[str, Any], rest: list[str]) -> None:
        keys: dict[str, str] = instance.get("public_keys", {})
        names = list(keys)
        if not rest:
            if not names:
                self._send(HTTPStatus.NOT_FOUND)
            else:
                self._send(HTTPStatus.OK, "\n".join(f"{i}={name}" for i, name in enumerate(names)))
            return
        if not rest[0].isdigit() or int(rest[0]) >= len(names):
            self._send(HTTPStatus.NOT_FOUND)
        elif len(rest) == 1:
            self._send(HTTPStatus.OK, "openssh-key")
        elif rest[1:] == ["openssh-key"]:
            self._send(HTTPStatus.OK, keys[names[int(rest[0])]] + "\n")
        else:
            self._send(HTTPStatus.NOT_FOUND)

    def _tree(self, tree: dict, parts: list[str]) -> None:
        node = resolve(tree, parts)
        if node is None or (isinstance(node, dict) and not node):
            self._send(HTTPStatus.NOT_FOUND)
        elif isinstance(node, dict):
            self._send(HTTPStatus.OK, listing(node))
        else:
            self._send(HTTPStatus.OK, str(node))


class MetadataServer(ThreadingHTTPServer):
    """Serves on an already bound socket (created in the twin's service namespace)."""

    daemon_threads = True

    def __init__(self, sock: socket.socket, lookup: Lookup, credentials: Credentials, log: Callable[[str], None]):
        super().__init__(sock.getsockname()[:2], MetadataHandler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.lookup = lookup
        self.credentials = credentials
        self.log = log
        self.tokens = Tokens()


def listen(address: str = "169.254.169.254", port: int = 80) -> socket.socket:
    """A listening TCP socket in the calling thread's network namespace."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(128)
    return sock
