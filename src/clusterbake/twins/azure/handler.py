"""The twin's HTTP plumbing every Azure endpoint shares (ARM, Key Vault, the node vault): JSON bodies, replies,
Azure's error shape and the token audiences."""

from __future__ import annotations

import json
import secrets
import sys
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from clusterbake.twins.azure.state import ArmError

if TYPE_CHECKING:
    from clusterbake.twins.azure.arm import Twin


ARM_AUDIENCE = "https://management.azure.com"


VAULT_AUDIENCE = "https://vault.azure.net"


STORAGE_AUDIENCE = "https://storage.azure.com"


AUDIENCES = (ARM_AUDIENCE, VAULT_AUDIENCE, STORAGE_AUDIENCE)


class Reply(Exception):
    """A response to send: status, JSON body (or None), headers."""

    def __init__(self, status: int, body=None, headers: dict | None = None):
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers or {}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "clusterbake-azure-twin"
    twin: Twin  # set on the subclass per server

    def log_message(self, format, *args):
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    # --- plumbing -------------------------------------------------------------------------

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise ArmError(
                400, "InvalidRequestContent", "The request content was invalid and could not be deserialized."
            ) from None

    def _send(self, status: int, body=None, headers: dict | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        request_id = self.headers.get("x-ms-client-request-id") or secrets.token_hex(16)
        self.send_header("x-ms-request-id", request_id)
        self.send_header("x-ms-correlation-request-id", request_id)
        if body is not None:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)

    def _dispatch(self) -> None:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        mutating = self.command in ("PUT", "DELETE", "POST", "PATCH")
        self.answer_headers: dict[str, str] = {}  # what every answer to this request carries (rate limits)
        try:
            body = self._body() if self.command in ("PUT", "POST", "PATCH") else {}
            with self.twin.state.lock:
                self.twin.state.advance()
                self.route(split.path, query, body)
        except Reply as reply:
            if mutating or reply.headers.get("Azure-AsyncOperation"):
                with self.twin.state.lock:
                    self.twin.save()
            self._send(reply.status, reply.body, self.answer_headers | reply.headers)
        except ArmError as error:
            headers = self.answer_headers | error.headers
            if error.status == 401:
                headers["x-ms-failure-cause"] = "gateway"
                headers["WWW-Authenticate"] = (
                    f'Bearer authorization_uri="https://login.microsoftonline.com/{self.twin.state.tenant}", '
                    'error="invalid_token"'
                )
            self._send(error.status, error.body(), headers)
        except Exception as exc:  # a twin bug: Azure's 500 shape, and the traceback in the log
            import traceback

            traceback.print_exc()
            self._send(500, {"error": {"code": "InternalServerError", "message": f"twin: {exc!r}"}})

    do_GET = do_PUT = do_DELETE = do_POST = do_PATCH = do_HEAD = _dispatch

    def route(self, path: str, query: dict, body) -> None:
        raise NotImplementedError
