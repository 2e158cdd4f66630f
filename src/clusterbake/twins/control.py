"""`clusterbake twin up|image|status|down <cloud>`: the host side of a twin, one lifecycle for both.

`up` builds (or reuses) the twin's node image, cleans up after a twin that died, creates the
twin's bridge (its network's range, the host at the first address: the cloud's default
gateway) and the service namespace that answers for the cloud's link-local addresses
(169.254.169.254, and Azure's DNS 168.63.129.16), starts the twin's process (its daemon.py)
in a session of its own, waits until it answers, and returns the environment that points the
cloud's SDK at it. `down` stops the process (which removes every node), then removes anything
a dead process left behind: nodes, namespaces, the bridge and the twin's directory.

A cloud's twin (twins/aws/control.py, twins/azure/control.py) says only what differs: its
addresses, its daemon's arguments, the environment it prints, how its nodes are found.
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


class TwinControl:
    cloud: str  # `clusterbake twin up <cloud>`
    title: str  # "EC2 twin"
    network_cidr: str  # the VPC's / virtual network's range: the twin's bridge
    subnet_cidr: str
    port: int
    image_features: list[str]  # the node image's feature groups
    twin_network: str  # the bridge's name
    service_netns: str
    service_addresses: tuple[str, ...]  # link-local addresses the service namespace answers for
    daemon_module: str
    # Values `twin up` does not print (host.shell_exports writes them to 0600 files).
    secret_env: tuple[str, ...] = ()
    # The caller's variables that must not reach the twin: it is the cloud, not a client of one.
    foreign_env: tuple[str, ...] = ()
    start_timeout = 120.0
    stop_timeout = 120.0

    # --- what each cloud says ---

    def daemon_arguments(self, directory: Path) -> list[str]:
        """The daemon's cloud-specific arguments (region, location, ...)."""
        raise NotImplementedError

    def daemon_environment(self, directory: Path, env: dict[str, str]) -> dict[str, str]:
        return env

    def environment(self, state: StateDir, info: dict) -> dict[str, str]:
        """What a client of the running twin needs."""
        raise NotImplementedError

    def summary(self, info: dict) -> str:
        """One line about the running twin, after `up`."""
        raise NotImplementedError

    def remove_nodes(self, directory: Path) -> list[str]:
        """Remove the nodes a dead twin left; their names."""
        raise NotImplementedError

    # --- the lifecycle ---

    def twin_dir(self, state: StateDir) -> Path:
        return state.root / "twins" / self.cloud

    def bridge_address(self) -> str:
        return str(network.host_address(self.network_cidr).ip)

    def read_info(self, state: StateDir) -> dict | None:
        return host.read_info(self.twin_dir(state) / "twin.json")

    def node_image(self, config: ClusterConfig, state: StateDir) -> Path:
        return host.node_image(config, state, self.image_features)

    def up(self, config: ClusterConfig, state: StateDir) -> dict[str, str]:
        if os.geteuid() != 0:
            raise ClusterbakeError(f"the {self.title} boots nodes (systemd-nspawn, network namespaces): run it as root")
        directory = self.twin_dir(state)
        info = self.read_info(state)
        if info:
            say(f"==> the {self.title} already runs (pid {info['pid']})")
            return self.environment(state, info)
        if directory.exists():
            say(f"    cleaning up after an {self.title} that is not running")
            self.down(state)
        image = self.node_image(config, state)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with phase(f"{self.title}: bridge and service namespace ({', '.join(self.service_addresses)})"):
            network.ensure_bridge(self.twin_network, self.network_cidr)
            host.ensure_service_namespace(
                self.twin_network, self.service_netns, self.service_addresses, self.network_cidr
            )
        log_file = directory / "twin.log"
        with phase(f"{self.title}: start"):
            say(f"    log: {log_file}")
            argv = [
                sys.executable, "-m", self.daemon_module,
                "--state", str(directory), "--address", self.bridge_address(), "--port", str(self.port),
                "--subnet-cidr", self.subnet_cidr, *self.daemon_arguments(directory),
                "--image", f"{image.name}={image}",
            ]  # fmt: skip
            env = {k: v for k, v in os.environ.items() if not k.startswith(self.foreign_env)}
            env = self.daemon_environment(directory, env)
            started = lambda: self.read_info(state)  # noqa: E731
            info = host.start_process(argv, env, log_file, started, self.start_timeout, self.title)
        say(f"    {self.title} at {info['endpoint']}: {self.summary(info)}")
        return self.environment(state, info)

    def request(self, state: StateDir, method: str, path: str, body: dict | None = None) -> dict:
        """A call to the running twin's control socket."""
        running = self.read_info(state) is not None
        return host.control_request(self.twin_dir(state), running, self.title, self.cloud, method, path, body)

    def status(self, state: StateDir) -> dict:
        info = self.read_info(state)
        if info is None:
            return {"running": False}
        return {"running": True, **info, **self.request(state, "GET", "/status")}

    def down(self, state: StateDir) -> list[str]:
        directory = self.twin_dir(state)
        return host.take_down(
            directory,
            self.read_info(state),
            self.title,
            self.stop_timeout,
            lambda: self.remove_nodes(directory),
            self.twin_network,
            self.service_netns,
        )
