"""The host side the twins share (twins/aws/control.py, twins/azure/control.py): the service
namespace on the twin's bridge, starting and stopping the twin's process, its control socket."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from clusterbake.config import ClusterConfig
from clusterbake.errors import ClusterbakeError
from clusterbake.images.store import CLOUD_BOOT_GROUPS
from clusterbake.nspawn import machines, network
from clusterbake.progress import phase
from clusterbake.state import StateDir, open_private


def shell_exports(env: dict[str, str], secret_keys: tuple[str, ...], directory: Path) -> list[str]:
    """`export` lines for `eval "$(clusterbake twin up ...)"`. A secret's value is not printed (it
    would land in terminals and CI logs): it goes to a 0600 file the line reads at eval time."""
    lines = []
    for key, value in env.items():
        if key in secret_keys:
            path = directory / key.lower()
            with open_private(path) as secret:
                secret.write(value)
            lines.append(f'export {key}="$(cat {shlex.quote(str(path))})"')
        else:
            lines.append(f"export {key}={shlex.quote(value)}")
    return lines


def read_info(path: Path) -> dict | None:
    """The twin's info file (written by its process once ready), if that process lives."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if machines.alive(int(info.get("pid", 0))) else None


def ensure_service_namespace(twin_network: str, netns: str, addresses: tuple[str, ...], route: str) -> None:
    """A namespace on the twin's bridge holding the cloud's link-local service addresses (/32 each,
    e.g. 169.254.169.254), so the host keeps its own routes; `route`: the nodes' range, on-link."""
    veth = network.veth_name(twin_network, "svc")
    if not (network.NETNS_DIR / netns).exists():
        network._ip("netns", "add", netns)
    if not network.link_exists(veth):
        network._ip("link", "add", veth, "type", "veth", "peer", "name", "imds0", "netns", netns)
    network._ip("link", "set", veth, "master", network.bridge_name(twin_network), "up")
    inside = network._ip("-j", "addr", "show", "dev", "imds0", netns=netns).stdout
    for address in addresses:
        if f'"{address}"' not in inside:
            network._ip("addr", "add", f"{address}/32", "dev", "imds0", netns=netns)
    network._ip("link", "set", "lo", "up", netns=netns)
    network._ip("link", "set", "imds0", "up", netns=netns)
    network._ip("route", "replace", route, "dev", "imds0", "scope", "link", netns=netns)


def remove_network(twin_network: str, netns: str) -> list[str]:
    """The service namespace and the bridge (after the nodes went)."""
    removed = []
    veth = network.veth_name(twin_network, "svc")
    if network.link_exists(veth):
        network._ip("link", "del", veth, check=False)
    if (network.NETNS_DIR / netns).exists():
        network._ip("netns", "del", netns)
        removed.append(f"namespace {netns}")
    if network.link_exists(network.bridge_name(twin_network)):
        network.remove_bridge(twin_network)
        removed.append(f"bridge {network.bridge_name(twin_network)}")
    return removed


def start_process(
    argv: list[str], env: dict[str, str], log_file: Path, ready: Callable[[], dict | None], timeout: float, what: str
) -> dict:
    """Start the twin's process in a session of its own; wait until `ready()` gives its info."""
    with log_file.open("ab") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env
        )
    deadline = time.monotonic() + timeout
    while (info := ready()) is None:
        if process.poll() is not None or time.monotonic() > deadline:
            tail = log_file.read_text(errors="replace").splitlines()[-20:]
            process.kill()
            raise ClusterbakeError(f"the {what} did not start:\n" + "\n".join(tail) + f"\nfull log: {log_file}")
        time.sleep(0.2)
    return info


def stop_process(pid: int, timeout: float) -> None:
    """SIGTERM (the process removes its nodes), then SIGKILL after timeout."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while machines.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if machines.alive(pid):
        os.kill(pid, signal.SIGKILL)


def remove_directory(directory: Path) -> list[str]:
    if not directory.exists():
        return []
    machines.unmount_tree(directory)
    subprocess.run(["rm", "-rf", "--one-file-system", str(directory)], check=True)
    return [f"state {directory}"]


def unix_request(path: Path, method: str, url: str, body: dict | None, what: str) -> dict:
    """A call to a running twin's control socket; an answer other than 200 raises naming the twin."""

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(30)
            self.sock.connect(str(path))

    connection = UnixConnection("twin")
    try:
        data = json.dumps(body).encode() if body is not None else None
        connection.request(method, url, body=data, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read() or b"{}")
    finally:
        connection.close()
    if response.status != 200:
        raise ClusterbakeError(f"{what}: {method} {url}: {answer.get('error', response.status)}")
    return answer


def control_request(directory: Path, running: bool, what: str, cloud: str, method: str, url: str, body=None) -> dict:
    """A call to a running twin's control socket; a clear error when the twin is not running."""
    if not running:
        raise ClusterbakeError(f"the {what} is not running; start it with `clusterbake twin up {cloud}`")
    return unix_request(directory / "control.sock", method, url, body, what)


def take_down(
    directory: Path,
    info: dict | None,
    what: str,
    stop_timeout: float,
    remove_nodes: Callable[[], list[str]],
    twin_network: str,
    netns: str,
) -> list[str]:
    """Stop a twin's process (its nodes go with it), then remove whatever a dead one left behind:
    nodes (`remove_nodes` names them), its network and its directory."""
    removed: list[str] = []
    if info:
        pid = int(info["pid"])
        with phase(f"{what}: stop (its nodes go with it)"):
            stop_process(pid, stop_timeout)
            removed.append(f"twin process {pid}")
    removed += [f"node {name}" for name in remove_nodes()]
    removed += remove_network(twin_network, netns)
    removed += remove_directory(directory)
    with contextlib.suppress(OSError):  # other twins' directories are still there
        directory.parent.rmdir()
    return removed


def node_image(config: ClusterConfig, state: StateDir, features: list[str]) -> Path:
    """The twin's node image, built or found in the store for the same inputs (`twin image`, and
    the first step of `twin up`)."""
    from clusterbake.images.local import build_image  # only a build needs the builder's imports

    # The cloud's group as a layer on the local image of the other features, where one is built
    # (the test suite's): its boot role, not a second full build.
    return build_image(image_config(config, features), state, layer_groups=CLOUD_BOOT_GROUPS)


def image_config(base: ClusterConfig, features: list[str]) -> ClusterConfig:
    """A twin's node image: the image settings (and the training environment's extra packages) of the
    user's config, with the twin's features."""
    return ClusterConfig.model_validate(
        {
            "cluster_name": "twin",
            "image": base.image.model_dump(),
            "training": base.training.model_dump(),
            "node_groups": [{"name": "twin", "count": 0, "features": features}],
        }
    )
