"""`clusterbake twin up|status|down azure`: the Azure twin's host side.

`up` builds (or reuses) the twin's node image (feature groups `train` and `azure`: the
training environment and the cloud boot service reading Azure's IMDS and Key Vault),
creates the twin's bridge (the virtual network's range, the host at the subnet's first
address, Azure's default gateway) and the service namespace that holds 169.254.169.254
(IMDS) and 168.63.129.16 (DNS), starts the twin's process (daemon.py) in a session of its
own, waits until it answers, and prints the environment that points the Azure SDK at it
(the ARM fake's `endpoints.json` env). `down` stops the process (which removes every
node), then removes anything a dead process left behind: nodes, namespaces, the bridge
and the twin's directory.
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
from clusterbake.twins.azure.daemon import SERVICE_NETNS
from clusterbake.twins.azure.nodes import DNS_ADDRESS, METADATA_ADDRESS, TWIN_NETWORK, AzureNodes

VNET_CIDR = "10.91.0.0/16"  # distinct from the EC2 twin's 10.90.0.0/16 and the local provider's
SUBNET_CIDR = "10.91.0.0/24"
PORT = 8443  # ARM
PROXY_PORT = 8444  # the Key Vault CONNECT proxy (HTTPS_PROXY) for the host's clients
LOCATION = "eastus"
START_TIMEOUT = 120.0
# Values `twin up` does not print: the managed identity endpoint's secret.
SECRET_ENV: tuple[str, ...] = ("IDENTITY_HEADER",)
STOP_TIMEOUT = 120.0
IMAGE_FEATURES = ["train", "azure"]
# What a client of the twin must not bring along: another cloud's or another ARM's settings.
FOREIGN_ENV = ("AZURE_", "IDENTITY_", "MSI_", "REQUESTS_CA_BUNDLE", "HTTPS_PROXY", "https_proxy")


def twin_dir(state: StateDir) -> Path:
    return state.root / "twins" / "azure"


def bridge_address() -> str:
    return str(network.host_address(VNET_CIDR).ip)


def environment(info: dict) -> dict[str, str]:
    """What a client needs (the ARM fake's endpoints.json env): ARM's URL, the managed identity
    endpoint and its secret header, the twin's CA, and the Key Vault proxy."""
    return dict(info["env"])


def read_info(state: StateDir) -> dict | None:
    return host.read_info(twin_dir(state) / "twin.json")


def node_image(config: ClusterConfig, state: StateDir) -> Path:
    return host.node_image(config, state, IMAGE_FEATURES)


def up(config: ClusterConfig, state: StateDir) -> dict[str, str]:
    if os.geteuid() != 0:
        raise ClusterbakeError("the Azure twin boots nodes (systemd-nspawn, network namespaces): run it as root")
    directory = twin_dir(state)
    info = read_info(state)
    if info:
        say(f"==> the Azure twin already runs (pid {info['pid']})")
        return environment(info)
    if directory.exists():
        say("    cleaning up after an Azure twin that is not running")
        down(state)
    image = node_image(config, state)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with phase("Azure twin: bridge, IMDS and DNS namespace"):
        network.ensure_bridge(TWIN_NETWORK, VNET_CIDR)
        host.ensure_service_namespace(TWIN_NETWORK, SERVICE_NETNS, (METADATA_ADDRESS, DNS_ADDRESS), VNET_CIDR)
    log_file = directory / "twin.log"
    with phase("Azure twin: start"):
        say(f"    log: {log_file}")
        argv = [
            sys.executable, "-m", "clusterbake.twins.azure.daemon",
            "--state", str(directory), "--address", bridge_address(), "--port", str(PORT),
            "--proxy-port", str(PROXY_PORT), "--location", LOCATION,
            "--vnet-cidr", VNET_CIDR, "--subnet-cidr", SUBNET_CIDR,
            "--image", f"{image.name}={image}",
        ]  # fmt: skip
        # The twin is the cloud, not a client of one: none of the caller's Azure settings apply to it.
        env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN_ENV)}
        info = host.start_process(argv, env, log_file, lambda: read_info(state), START_TIMEOUT, "Azure twin")
    say(
        f"    Azure twin at {info['endpoint']}: subscription {info['subscription_id']}, subnet "
        f"{info['subnet_id']} ({info['subnet_cidr']}, {info['location']}), image {', '.join(info['images'].values())}"
    )
    return environment(info)


def request(state: StateDir, method: str, path: str, body: dict | None = None) -> dict:
    """A call to the running twin's control socket (status, scheduled events)."""
    return host.control_request(
        twin_dir(state), read_info(state) is not None, "Azure twin", "azure", method, path, body
    )


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
        "Azure twin",
        STOP_TIMEOUT,
        lambda: AzureNodes(directory, VNET_CIDR, None, lambda m: None).remove_all(),
        TWIN_NETWORK,
        SERVICE_NETNS,
    )
