"""What the twins' processes share (twins/aws/daemon.py, twins/azure/daemon.py): the daemon's
arguments and life (run_daemon), logging, entering the service namespace, and the control socket
tests and the CLI talk to."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import threading
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from socketserver import ThreadingMixIn, UnixStreamServer
from typing import Any, Protocol

CLONE_NEWNET = 0x40000000

# (method, path, JSON body or None) -> (HTTP status, JSON answer)
Dispatch = Callable[[str, str, Any], tuple[int, Any]]


def log(message: str) -> None:
    print(f"{datetime.now(UTC).strftime('%H:%M:%S.%f')[:-3]} {message}", flush=True)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def in_netns(name: str, function):
    """Call function in network namespace `name` (this thread only), then come back."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {name}")
        try:
            return function()
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
    finally:
        os.close(own)
        os.close(target)


def serve_control(path: Path, dispatch: Dispatch) -> None:
    """A root-only Unix socket speaking HTTP with JSON bodies; each request goes to dispatch."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _handle(self) -> None:
            body = None
            if self.command in ("PUT", "POST"):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
            status, data = dispatch(self.command, self.path, body)
            answer = json.dumps(data, indent=2).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        do_GET = do_PUT = do_POST = do_DELETE = _handle

    class Server(ThreadingMixIn, UnixStreamServer):
        daemon_threads = True

        def get_request(self):
            request, _ = super().get_request()
            return request, ("control", 0)

    path.unlink(missing_ok=True)
    server = Server(str(path), Handler)
    os.chmod(path, 0o600)
    threading.Thread(target=server.serve_forever, name="control", daemon=True).start()


def keep_reconciling(reconcile: Callable[[], None], stopping: threading.Event, poll: float) -> None:
    """Run `reconcile` every `poll` seconds until `stopping`; a failed round is logged, not fatal."""
    while not stopping.is_set():
        try:
            reconcile()
        except Exception:
            log(f"reconcile failed:\n{traceback.format_exc()}")
        stopping.wait(poll)


class TwinDaemon(Protocol):
    stopping: threading.Event
    nodes: Any  # twins.nodes.TwinNodes, or None before the cloud is up

    def keep_nodes(self) -> None: ...

    def close(self) -> None: ...


def daemon_parser(cloud: str, port: int, listeners: str, image_help: str) -> argparse.ArgumentParser:
    """The arguments every twin's daemon takes (twins/control.py passes them), before its own."""
    parser = argparse.ArgumentParser(description=f"the {cloud} twin (started by `clusterbake twin up`)")
    parser.add_argument("--state", required=True)
    parser.add_argument("--address", required=True, help=f"the bridge address {listeners} on")
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--subnet-cidr", required=True)
    parser.add_argument("--image", action="append", default=[], help=image_help)
    return parser


def run_daemon(root: Path, twin: TwinDaemon, start: Callable[[], dict[str, Any]]) -> int:
    """A twin daemon's life: SIGTERM or SIGINT stops it; `start` brings its cloud up and returns what
    twin.json says of it (`twin up` waits for that file); then the nodes are kept until the stop. On
    the way out, whatever happened, every node is removed and twin.json and the control socket go."""

    def stop(signum, frame) -> None:
        twin.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        info = {"pid": os.getpid(), **start()}
        (root / "twin.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        log("ready")
        twin.keep_nodes()
    except Exception:
        log(f"twin failed:\n{traceback.format_exc()}")
        return 1
    finally:
        removed = twin.nodes.remove_all() if twin.nodes is not None else []
        log(f"stopped; removed nodes {removed}")
        twin.close()
        for name in ("twin.json", "control.sock"):
            with contextlib.suppress(OSError):
                (root / name).unlink()
    return 0
