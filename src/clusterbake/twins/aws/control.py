"""`clusterbake twin up|status|down aws`: the EC2 twin's host side.

`up` builds (or reuses) the twin's node image, creates the twin's bridge (the VPC's
range, the host at its first address) and the service namespace that holds
169.254.169.254, starts the twin process (daemon.py) in a session of its own, waits
until it answers, and prints the environment that points boto3 at it. `down` stops the
process (which removes every node), then removes anything a dead process left behind:
nodes, namespaces, the bridge and the twin's directory.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from clusterbake.config import ClusterConfig
from clusterbake.errors import ClusterbakeError
from clusterbake.nspawn import network
from clusterbake.progress import phase, say
from clusterbake.state import StateDir
from clusterbake.twins import host
from clusterbake.twins.aws.daemon import SERVICE_NETNS
from clusterbake.twins.aws.nodes import METADATA_ADDRESS, TWIN_NETWORK, Nodes

VPC_CIDR = "10.90.0.0/16"
SUBNET_CIDR = "10.90.0.0/24"
PORT = 4566
REGION = "us-east-1"
ZONE = "us-east-1a"
PROFILE = "clusterbake-twin"
START_TIMEOUT = 120.0
# Values `twin up` does not print: the administrator key is in a 0600 credentials file.
SECRET_ENV: tuple[str, ...] = ()
STOP_TIMEOUT = 120.0
# The node image's features: the training environment and the AWS boot path.
IMAGE_FEATURES = ["train", "aws"]


def twin_dir(state: StateDir) -> Path:
    return state.root / "twins" / "aws"


def bridge_address() -> str:
    return str(network.host_address(VPC_CIDR).ip)


def environment(state: StateDir, info: dict) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": info["endpoint"],
        "AWS_SHARED_CREDENTIALS_FILE": str(twin_dir(state) / "credentials"),
        "AWS_PROFILE": PROFILE,
        "AWS_DEFAULT_REGION": info["region"],
    }


def read_info(state: StateDir) -> dict | None:
    return host.read_info(twin_dir(state) / "twin.json")


def _service_namespace() -> None:
    """The namespace that answers for 169.254.169.254 on the bridge (the host keeps its own routes)."""
    host.ensure_service_namespace(TWIN_NETWORK, SERVICE_NETNS, (METADATA_ADDRESS,), VPC_CIDR)


def node_image(config: ClusterConfig, state: StateDir) -> Path:
    return host.node_image(config, state, IMAGE_FEATURES)


def up(config: ClusterConfig, state: StateDir) -> dict[str, str]:
    if os.geteuid() != 0:
        raise ClusterbakeError("the EC2 twin boots nodes (systemd-nspawn, network namespaces): run it as root")
    directory = twin_dir(state)
    info = read_info(state)
    if info:
        say(f"==> the EC2 twin already runs (pid {info['pid']})")
        return environment(state, info)
    image = node_image(config, state)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with phase("EC2 twin: bridge and metadata namespace"):
        network.ensure_bridge(TWIN_NETWORK, VPC_CIDR)
        _service_namespace()
    log_file = directory / "twin.log"
    with phase("EC2 twin: start"):
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
        info = host.start_process(argv, env, log_file, lambda: read_info(state), START_TIMEOUT, "EC2 twin")
    say(
        f"    EC2 twin at {info['endpoint']}: VPC {info['vpc_id']}, subnet {info['subnet_id']} "
        f"({info['subnet_cidr']}, {info['availability_zone']}), AMI {', '.join(info['amis'].values())}"
    )
    return environment(state, info)


def request(state: StateDir, method: str, path: str, body: dict | None = None) -> dict:
    """A call to the running twin's control socket."""
    return host.control_request(twin_dir(state), read_info(state) is not None, "EC2 twin", "aws", method, path, body)


def status(state: StateDir) -> dict:
    info = read_info(state)
    if info is None:
        return {"running": False}
    return {"running": True, **info, **request(state, "GET", "/status")}


def down(state: StateDir) -> list[str]:
    directory = twin_dir(state)
    return host.take_down(
        directory,
        read_info(state),
        "EC2 twin",
        STOP_TIMEOUT,
        lambda: Nodes(directory, VPC_CIDR, lambda m: None).remove_all(),
        TWIN_NETWORK,
        SERVICE_NETNS,
    )
