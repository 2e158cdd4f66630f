"""The local provider's power agent: the host-side service that starts and stops elastic nodes.

On a cloud, Slurm's ResumeProgram on the head calls the cloud's API; on the local
provider the "cloud" is this host, so the head's program (role slurm_power,
`clusterbake-power`) asks this agent, with a token only the head and the controller
hold. It listens on a Unix socket in a directory of the cluster's that only the head
has (bound into it at HEAD_SOCKET_DIR): no compute node, and nothing on the bridge,
reaches it, and the token never crosses a network (security review finding 17). It serves:

- `POST /power` {"action": "start" | "stop", "nodes": [...]}: start nodes (each joins
  by itself from its group's bundle, written into it before boot) or power them off
  (their disk is kept, like a stopped instance). Answers {"results": {node: "ok" | error}}.
- `GET /nodes`: {"running": [...], "planned": [...]} (the reconcile loop compares it with Slurm).

Started by `cluster up` when a node group is elastic, stopped by `cluster down`.
Fault injection for tests: node names listed (one per line) in
`<cluster dir>/inject/resume-fail` (or `suspend-fail`) are refused with "injected
failure" when asked to start (stop): a cloud that has no capacity, an API call that
fails while the instance keeps running.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import secrets
import socketserver
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from clusterbake.errors import ClusterbakeError
from clusterbake.nspawn import machines
from clusterbake.progress import say
from clusterbake.state import ClusterDir, write_secret

MAX_BODY = 1 << 20
SOCKET_NAME = "agent.sock"
# Where the head sees the agent's directory (a read-only bind: a socket still takes connections).
HEAD_SOCKET_DIR = "/run/clusterbake-power-agent"
PID_FILE = "power-agent.pid"  # in the cluster's directory
START_TIMEOUT = 20.0


def log(message: str) -> None:
    print(f"{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%S')} {message}", flush=True)


class Agent:
    def __init__(self, config_path: Path, state_root: Path, token: str):
        self.config_path = config_path
        self.state_root = state_root
        self.token = token
        self.lock = threading.Lock()  # one power action at a time: they share known_hosts and state

    def provider(self):
        from clusterbake.config import load_config
        from clusterbake.providers.local.provider import LocalProvider
        from clusterbake.state import StateDir

        # Read the config each time: `cluster up` after a max_count change plans more nodes.
        return LocalProvider(load_config(self.config_path), StateDir(self.state_root))

    def power(self, action: str, nodes: list[str]) -> dict[str, str]:
        if action == "start":
            # slurmctld takes a powering-up node's registration only with a boot time (whole seconds,
            # from slurmd's uptime) no older than its power-up request ("waiting_for_node_boot"). A kept
            # disk boots in under a second: a slurmd that registered within the request's second could
            # report a boot before it, was ignored, and never registered again (ResumeTimeout). Boots
            # start from the second after next: at most two seconds a power-up.
            time.sleep(2.0 - time.time() % 1.0)
        with self.lock:
            provider = self.provider()
            planned = {n.name for n in provider.nodes if n.role == "compute"}
            failing = provider.injected("resume-fail" if action == "start" else "suspend-fail")

            def one(name: str) -> str:
                if name not in planned:
                    return f"{name} is not a compute node of cluster {provider.config.cluster_name}"
                if name in failing:
                    return f"injected failure (inject/{'resume' if action == 'start' else 'suspend'}-fail)"
                try:
                    if action == "start":
                        provider.power_on(name)
                    else:
                        provider.power_off(name)
                except Exception as exc:
                    log(f"{action} {name} failed:\n{traceback.format_exc()}")
                    return f"{type(exc).__name__}: {exc}"
                return "ok"

            with ThreadPoolExecutor(max_workers=min(16, max(1, len(nodes)))) as pool:
                results = dict(zip(nodes, pool.map(one, nodes), strict=True))
            if action == "start":
                provider.refresh_known_hosts()
        for name, result in results.items():
            log(f"{action} {name}: {result}")
        return results

    def nodes(self) -> dict[str, Any]:
        provider = self.provider()
        return {
            "running": sorted(provider.running_nodes()),
            "planned": [n.name for n in provider.nodes if n.role == "compute"],
        }


class UnixHTTPServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


def serve(agent: Agent, socket_path: Path) -> None:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def address_string(self) -> str:  # a Unix socket's peer has no address
            return "head"

        def _answer(self, status: int, data: Any) -> None:
            body = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self) -> bool:
            given = self.headers.get("Authorization", "").removeprefix("Bearer ")
            if not hmac.compare_digest(given.encode(), agent.token.encode()):
                self._answer(HTTPStatus.UNAUTHORIZED, {"error": "a valid token is required"})
                return False
            return True

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path == "/nodes":
                self._answer(HTTPStatus.OK, agent.nodes())
            else:
                self._answer(HTTPStatus.NOT_FOUND, {"error": self.path})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            if length > MAX_BODY:
                self._answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"a body over {MAX_BODY} bytes"})
                return
            # Read the body before any answer: closing with it unread resets the connection, and the
            # caller sees a broken pipe instead of the refusal.
            body = self.rfile.read(length)
            if not self._authorized():
                return
            if self.path != "/power":
                self._answer(HTTPStatus.NOT_FOUND, {"error": self.path})
                return
            try:
                request = json.loads(body)
                action, nodes = request["action"], list(request["nodes"])
            except (ValueError, KeyError, TypeError):
                self._answer(HTTPStatus.BAD_REQUEST, {"error": "expected {action, nodes}"})
                return
            if action not in ("start", "stop"):
                self._answer(HTTPStatus.BAD_REQUEST, {"error": f"unknown action {action}"})
                return
            self._answer(HTTPStatus.OK, {"results": agent.power(action, nodes)})

    # Bound and listening under another name, then renamed into place: the socket's path appears only
    # once a connection is accepted (a client that saw it between bind and listen was refused).
    ready = socket_path.with_name(socket_path.name + ".new")
    for path in (socket_path, ready):
        path.unlink(missing_ok=True)  # one a killed agent left
    server = UnixHTTPServer(str(ready), Handler)
    # The head's SlurmUser connects (its uid is the image's, unknown here): the directory, seen only by
    # the head and the host, is the boundary; the token is the check.
    os.chmod(ready, 0o666)
    ready.rename(socket_path)
    log(f"power agent on {socket_path}")
    server.serve_forever()


# --- the host's side: starting and stopping the agent (LocalProvider) ---------------------------


def _pid(cluster: ClusterDir) -> int | None:
    try:
        pid = int((cluster.root / PID_FILE).read_text())
    except (OSError, ValueError):
        return None
    return pid if machines.alive(pid) else None


def ensure_running(cluster: ClusterDir, config: Path, state: Path, socket_dir: Path, token_file: Path) -> None:
    """Start the cluster's agent unless it runs: in a session of its own, its token made once (0600),
    its log in the cluster's logs; wait until it listens."""
    if _pid(cluster) is not None:
        return
    write_secret(token_file, lambda: secrets.token_hex(32).encode())
    log_file = cluster.logs / "power-agent.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    socket_path = socket_dir / SOCKET_NAME
    argv = [
        sys.executable, "-m", "clusterbake.providers.local.power_agent",
        "--config", str(config), "--state", str(state), "--socket", str(socket_path), "--token-file", str(token_file),
    ]  # fmt: skip
    socket_path.unlink(missing_ok=True)
    with log_file.open("ab") as out, open(os.devnull, "rb") as devnull:
        process = subprocess.Popen(argv, stdin=devnull, stdout=out, stderr=out, start_new_session=True)
    (cluster.root / PID_FILE).write_text(f"{process.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT
    while not machines.unix_socket_open(socket_path):
        if process.poll() is not None or time.monotonic() > deadline:
            raise ClusterbakeError(f"the power agent did not start; see {log_file}")
        time.sleep(0.1)
    say(f"    power agent (elastic and lost nodes) on {socket_path} (the head's {HEAD_SOCKET_DIR})")


def stop(cluster: ClusterDir) -> bool:
    """Stop the cluster's agent; whether one ran."""
    pid = _pid(cluster)
    if pid is None:
        return False
    machines.stop(pid, timeout=5.0)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the local provider's power agent (started by `cluster up`)")
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("--socket", required=True, type=Path, help="the Unix socket to listen on")
    parser.add_argument("--token-file", required=True, type=Path)
    args = parser.parse_args(argv)
    agent = Agent(args.config, args.state, args.token_file.read_text().strip())
    serve(agent, args.socket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
