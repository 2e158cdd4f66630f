"""The head's Prometheus (role prometheus) over its HTTP API, carried by the head's SSH connection.

Every request is one direct-tcpip channel to 127.0.0.1:<port> on the head (what `ssh -L`
opens): only SSH has to reach the head, on every provider, and no port of the cluster is
opened for the controller. The API: https://prometheus.io/docs/prometheus/latest/querying/api/
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlencode

from clusterbake import remote
from clusterbake.config import MONITORING_PORTS
from clusterbake.errors import ClusterbakeError
from clusterbake.remote import Endpoint

PORT = MONITORING_PORTS["prometheus"]
TIMEOUT = 60.0


class PrometheusError(ClusterbakeError):
    pass


class _ChannelConnection(http.client.HTTPConnection):
    """HTTP/1.1 over an already open channel instead of a socket it would connect itself."""

    def __init__(self, channel, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._channel = channel

    def connect(self) -> None:
        self._channel.settimeout(self.timeout)
        self.sock = self._channel


class Prometheus:
    def __init__(self, head: Endpoint, port: int = PORT):
        self.head, self.port = head, port

    def get(self, path: str, params: dict | None = None) -> dict:
        """The `data` of an API answer; PrometheusError when Prometheus is not there or refuses."""
        hint = f"is Prometheus running? clusterbake ssh {self.head.name} -- systemctl status prometheus"
        try:
            channel = remote.tunnel(self.head, "127.0.0.1", self.port)
        except remote.RemoteError as exc:
            raise PrometheusError(f"{exc}; {hint}") from exc
        connection = _ChannelConnection(channel, TIMEOUT)
        try:
            connection.request("GET", path + ("?" + urlencode(params) if params else ""))
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise PrometheusError(f"Prometheus on {self.head.name}: {path}: {exc}; {hint}") from exc
        finally:
            connection.close()
        try:
            answer = json.loads(body)
        except ValueError:
            raise PrometheusError(f"Prometheus on {self.head.name}: {path}: HTTP {response.status}, not JSON") from None
        if answer.get("status") != "success":
            raise PrometheusError(f"Prometheus on {self.head.name}: {path}: {answer.get('error') or response.status}")
        return answer["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's vector: [{"metric": {labels}, "value": [time, "value"]}]."""
        return self.get("/api/v1/query", {"query": expr})["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        """A range query's matrix: [{"metric": {labels}, "values": [[time, "value"], ...]}]."""
        return self.get("/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step})["result"]

    def targets(self) -> list[dict]:
        """The active scrape targets (job, labels, health, lastError)."""
        return self.get("/api/v1/targets", {"state": "active"})["activeTargets"]
