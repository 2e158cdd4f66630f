"""The twin's other endpoints behind its CONNECT proxy (Blob storage, boot diagnostics' logs, the retail prices
API), the proxy itself and the TLS server every endpoint runs on."""

from __future__ import annotations

import hmac
import json
import re
import ssl
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from clusterbake.twins.azure import blob, prices
from clusterbake.twins.azure.vault_plane import VaultHandler

if TYPE_CHECKING:
    from clusterbake.twins.azure.arm import Twin


VAULT_HOST = re.compile(r"^([a-z0-9-]{3,24})\.vault\.azure\.net:443$")
# Boot diagnostics' managed storage: retrieveBootDiagnosticsData answers SAS URIs of blobs there.
BOOT_LOG_HOST = re.compile(r"^(md-[a-z0-9]{12})\.blob\.storage\.azure\.net:443$")
BOOT_LOG_BYTES = 1024 * 1024  # what the twin serves of a node's serial console log (its end)


class ServiceHandler(BaseHTTPRequestHandler):
    """A data plane the twin serves outside ARM's protocol (its own answers, its own log label)."""

    protocol_version = "HTTP/1.1"
    twin: Twin
    label = "service"

    def log_message(self, format, *args):
        sys.stderr.write(f"{self.label} {self.address_string()} {format % args}\n")

    def reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)


class BlobHandler(ServiceHandler):
    """`https://<account>.blob.core.windows.net/...` (blob.py) inside a tunnel or at the nodes' address."""

    label = "blob"
    account_name = ""

    def _serve(self) -> None:
        self.reply(
            *blob.handle(
                self.twin, self.command, self.path, self.headers, self.client_address[0], self.account_name,
                self.twin.blob_root,
            )
        )  # fmt: skip

    do_GET = do_HEAD = do_PUT = do_DELETE = do_POST = _serve


class BootLogHandler(ServiceHandler):
    """Boot diagnostics' managed storage inside a tunnel: a VM's serial console log (its node's
    console) by the SAS URI retrieveBootDiagnosticsData gave, as Blob Storage answers a blob GET."""

    label = "bootdiagnostics"
    host_name = ""

    def _refuse(self, status: int, code: str, message: str) -> None:
        body = f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{message}</Message></Error>'
        self.reply(status, body.encode(), {"Content-Type": "application/xml", "x-ms-error-code": code})

    def do_GET(self) -> None:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        expiry, signature = query.get("se", ""), query.get("sig", "")
        expected = self.twin.boot_log_signature(split.path, expiry)
        if not signature or not hmac.compare_digest(signature, expected):
            return self._refuse(403, "AuthenticationFailed", "Signature did not match.")
        if expiry < time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()):
            return self._refuse(403, "AuthenticationFailed", "Signed expiry time has passed.")
        container, _, blob_name = split.path.strip("/").partition("/")
        log_file = self.twin.console_log(container.removeprefix("bootdiagnostics-"))
        if not blob_name.endswith(".serialconsole.log") or log_file is None or not log_file.exists():
            return self._refuse(404, "BlobNotFound", "The specified blob does not exist.")
        with log_file.open("rb") as handle:
            handle.seek(max(log_file.stat().st_size - BOOT_LOG_BYTES, 0))
            data = handle.read()
        self.reply(200, data, {"Content-Type": "text/plain", "x-ms-blob-type": "AppendBlob"})


class PricesHandler(ServiceHandler):
    """`https://prices.azure.com/api/retail/prices` (prices.py) inside a tunnel: anonymous, as the API is."""

    label = "prices"
    host_name = ""

    def do_GET(self) -> None:
        status, answer = prices.answer(self.path)
        self.reply(status, json.dumps(answer).encode(), {"Content-Type": "application/json; charset=utf-8"})


# What the CONNECT proxy tunnels: host:443 pattern -> (handler class, the attribute the match names).
TUNNELS = (
    (VAULT_HOST, VaultHandler, "vault_name"),
    (BOOT_LOG_HOST, BootLogHandler, "host_name"),
    (re.compile(r"^([a-z0-9]{3,24})\.blob\.core\.windows\.net:443$"), BlobHandler, "account_name"),
    (re.compile(r"^(prices\.azure\.com):443$"), PricesHandler, "host_name"),
)


class ProxyHandler(BaseHTTPRequestHandler):
    """An HTTP CONNECT proxy that only tunnels to the twin's data planes (Key Vault, Blob), terminating TLS itself."""

    protocol_version = "HTTP/1.1"
    twin: Twin
    context: ssl.SSLContext

    def log_message(self, format, *args):
        sys.stderr.write(f"proxy {self.address_string()} {format % args}\n")

    def do_CONNECT(self):
        target = self.path.lower()
        tunnel_to = next(((p.match(target), h, a) for p, h, a in TUNNELS if p.match(target)), None)
        if tunnel_to is None:
            self.send_response(403, "only Key Vault, Blob Storage, boot diagnostics and Retail Prices hosts are served")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        match, base, attribute = tunnel_to
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        try:
            tunnel = self.context.wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            sys.stderr.write(f"proxy: TLS handshake failed: {exc}\n")
            self.close_connection = True
            return
        handler = type(f"Tunnel{base.__name__}", (base,), {"twin": self.twin, attribute: match.group(1)})
        handler(tunnel, self.client_address, self.server)
        self.close_connection = True


class TlsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, handler, context: ssl.SSLContext):
        self.context = context
        super().__init__(address, handler)

    def get_request(self):
        sock, address = super().get_request()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (ssl.SSLError, ConnectionError)):
            return  # a client that gave up (or does not trust the CA): not the twin's error
        super().handle_error(request, client_address)


class ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
