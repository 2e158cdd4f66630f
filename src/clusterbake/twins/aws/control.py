"""`clusterbake twin up|status|down aws`: the EC2 twin's host side.

`up` builds (or reuses) the twin's node image, creates the twin's bridge (the VPC's
range, the host at its first address) and the service namespace that holds
169.254.169.254, starts the twin process (daemon.py) in a session of its own, waits
until it answers, and prints the environment that points boto3 at it. `down` stops the
process (which removes every node), then removes anything a dead process left behind:
nodes, namespaces, the bridge and the twin's directory.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from clusterbake.config import ClusterConfig
from clusterbake.errors import ClusterbakeError
from clusterbake.progress import phase, say
from clusterbake.providers.local import machines, network
from clusterbake.state import StateDir
from clusterbake.twins.aws.daemon import SERVICE_NETNS
from clusterbake.twins.aws.nodes import METADATA_ADDRESS, TWIN_NETWORK, Nodes

VPC_CIDR = "10.90.0.0/16"
SUBNET_CIDR = "10.90.0.0/24"
PORT = 4566
REGION = "us-east-1"
ZONE = "us-east-1a"
PROFILE = "clusterbake-twin"
START_TIMEOUT = 120.0
STOP_TIMEOUT = 120.0
# The node image's features: the training environment and the AWS boot path.
IMAGE_FEATURES = ["train", "aws"]


def twin_dir(state: StateDir) -> Path:
    return state.root / "twins" / "aws"


def bridge_address() -> str:
    return str(network.host_address(VPC_CIDR).ip)


def image_config(base: ClusterConfig) -> ClusterConfig:
    """The image settings of the user's config, with the twin's features."""
    return ClusterConfig.model_validate(
        {
            "cluster_name": "twin",
            "image": base.image.model_dump(),
            "node_groups": [{"name": "twin", "count": 0, "features": IMAGE_FEATURES}],
        }
    )


def environment(state: StateDir, info: dict) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": info["endpoint"],
        "AWS_SHARED_CREDENTIALS_FILE": str(twin_dir(state) / "credentials"),
        "AWS_PROFILE": PROFILE,
        "AWS_DEFAULT_REGION": info["region"],
    }


def read_info(state: StateDir) -> dict | None:
    path = twin_dir(state) / "twin.json"
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if machines.alive(int(info.get("pid", 0))) else None


def _service_namespace() -> None:
    """The namespace that answers for 169.254.169.254 on the bridge (the host keeps its own routes)."""
    veth = network.veth_name(TWIN_NETWORK, "svc")
    if not (network.NETNS_DIR / SERVICE_NETNS).exists():
        network._ip("netns", "add", SERVICE_NETNS)
    if not network.link_exists(veth):
        network._ip("link", "add", veth, "type", "veth", "peer", "name", "imds0", "netns", SERVICE_NETNS)
    network._ip("link", "set", veth, "master", network.bridge_name(TWIN_NETWORK), "up")
    inside = network._ip("-j", "addr", "show", "dev", "imds0", netns=SERVICE_NETNS).stdout
    if METADATA_ADDRESS not in inside:
        network._ip("addr", "add", f"{METADATA_ADDRESS}/32", "dev", "imds0", netns=SERVICE_NETNS)
    network._ip("link", "set", "lo", "up", netns=SERVICE_NETNS)
    network._ip("link", "set", "imds0", "up", netns=SERVICE_NETNS)
    network._ip("route", "replace", VPC_CIDR, "dev", "imds0", "scope", "link", netns=SERVICE_NETNS)


def up(config: ClusterConfig, state: StateDir) -> dict[str, str]:
    if os.geteuid() != 0:
        raise ClusterbakeError("the EC2 twin boots nodes (systemd-nspawn, network namespaces): run it as root")
    directory = twin_dir(state)
    info = read_info(state)
    if info:
        say(f"==> the EC2 twin already runs (pid {info['pid']})")
        return environment(state, info)
    from clusterbake.image import build_image

    image = build_image(image_config(config), state)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with phase("EC2 twin: bridge and metadata namespace"):
        network.ensure_bridge(TWIN_NETWORK, VPC_CIDR)
        _service_namespace()
    log_file = directory / "twin.log"
    with phase("EC2 twin: start"), log_file.open("ab") as log:
        say(f"    log: {log_file}")
        argv = [
            sys.executable, "-m", "clusterbake.twins.aws.daemon",
            "--state", str(directory), "--address", bridge_address(), "--port", str(PORT),
            "--region", REGION, "--zone", ZONE, "--vpc-cidr", VPC_CIDR, "--subnet-cidr", SUBNET_CIDR,
            "--image", f"{image.name}={image}",
        ]  # fmt: skip
        # The twin is the cloud, not a client of one: none of the caller's AWS settings apply to it.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        # EC2's capacity, as tests set it (PUT /capacity on the control socket): moto_ext's switch.
        env["MOTO_CAPACITY_FILE"] = str(directory / "capacity.json")
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env
        )
        deadline = time.monotonic() + START_TIMEOUT
        while (info := read_info(state)) is None:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_file.read_text(errors="replace").splitlines()[-20:]
                process.kill()
                raise ClusterbakeError("the EC2 twin did not start:\n" + "\n".join(tail) + f"\nfull log: {log_file}")
            time.sleep(0.2)
    say(
        f"    EC2 twin at {info['endpoint']}: VPC {info['vpc_id']}, subnet {info['subnet_id']} "
        f"({info['subnet_cidr']}, {info['availability_zone']}), AMI {', '.join(info['amis'].values())}"
    )
    return environment(state, info)


def request(state: StateDir, method: str, path: str, body: dict | None = None) -> dict:
    """A call to the running twin's control socket."""

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(30)
            self.sock.connect(str(twin_dir(state) / "control.sock"))

    if read_info(state) is None:
        raise ClusterbakeError("the EC2 twin is not running; start it with `clusterbake twin up aws`")
    connection = UnixConnection("twin")
    try:
        data = json.dumps(body).encode() if body is not None else None
        connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read() or b"{}")
    finally:
        connection.close()
    if response.status != 200:
        raise ClusterbakeError(f"EC2 twin: {method} {path}: {answer.get('error', response.status)}")
    return answer


def status(state: StateDir) -> dict:
    info = read_info(state)
    if info is None:
        return {"running": False}
    return {"running": True, **info, **request(state, "GET", "/status")}


def down(state: StateDir) -> list[str]:
    directory = twin_dir(state)
    removed: list[str] = []
    info = read_info(state)
    if info:
        pid = int(info["pid"])
        with phase("EC2 twin: stop (its nodes go with it)"):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT
            while machines.alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if machines.alive(pid):
                os.kill(pid, signal.SIGKILL)
            removed.append(f"twin process {pid}")
    # Whatever a dead process left behind.
    removed += [f"node {i}" for i in Nodes(directory, VPC_CIDR, Path(), lambda m: None).remove_all()]
    veth = network.veth_name(TWIN_NETWORK, "svc")
    if network.link_exists(veth):
        network._ip("link", "del", veth, check=False)
    if (network.NETNS_DIR / SERVICE_NETNS).exists():
        network._ip("netns", "del", SERVICE_NETNS)
        removed.append(f"namespace {SERVICE_NETNS}")
    if network.link_exists(network.bridge_name(TWIN_NETWORK)):
        network.remove_bridge(TWIN_NETWORK)
        removed.append(f"bridge {network.bridge_name(TWIN_NETWORK)}")
    if directory.exists():
        machines.unmount_tree(directory)
        subprocess.run(["rm", "-rf", "--one-file-system", str(directory)], check=True)
        removed.append(f"state {directory}")
    with contextlib.suppress(OSError):
        directory.parent.rmdir()
    return removed
