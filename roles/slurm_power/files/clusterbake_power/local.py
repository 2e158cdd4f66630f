"""The local provider's backend: its host-side power agent (providers/local/power_agent.py), over
the agent's Unix socket, which is bound into the head only, with the head's token."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path

from .core import PowerError


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket (the local power agent's, bound into the head only)."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


class LocalAgent:
    def __init__(self, config: dict):
        self.url = config["agent"].rstrip("/")
        if not self.url.startswith("unix://"):
            raise PowerError(f"power agent {self.url}: expected unix://<socket> (the agent's socket on the head)")
        self.token = Path(config["token_file"]).read_text().strip()

    def _call(self, method: str, path: str, body: dict | None = None, timeout: float = 300) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        connection = UnixHTTPConnection(self.url.removeprefix("unix://"), timeout)
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            answer = response.read()
            if response.status != 200:
                raise PowerError(f"power agent {self.url}: HTTP {response.status}: {answer[:300]!r}")
            return json.loads(answer)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise PowerError(f"power agent {self.url}: {exc}") from None
        finally:
            connection.close()

    def power(self, action: str, nodes: list[str]) -> dict[str, str]:
        return self._call("POST", "/power", {"action": action, "nodes": nodes})["results"]

    def running(self) -> set[str]:
        return set(self._call("GET", "/nodes", timeout=30)["running"])
