"""The interface every provider (local, aws, azure) implements for the CLI."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from clusterbake.config import ClusterConfig
from clusterbake.errors import ConfigError
from clusterbake.state import ClusterDir, StateDir
from clusterbake.topology import NodeSpec, plan_nodes


@dataclass
class NodeStatus:
    name: str
    role: str
    nodegroup: str
    address: str | None
    state: str  # running, stopped, absent
    detail: str = ""


class Provider(ABC):
    # When the first `cluster up` of a cluster fails, `cluster.up` calls destroy() to
    # remove what it created. A provider that rolls back by itself says False.
    destroy_after_failed_first_provision = True

    def __init__(self, config: ClusterConfig, state: StateDir):
        self.config = config
        self.state = state
        self.cluster: ClusterDir = state.cluster(config.cluster_name)
        self.nodes: list[NodeSpec] = plan_nodes(config)

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes)
        raise ConfigError(f"no node '{name}' in cluster {self.config.cluster_name} (nodes: {known})")

    @abstractmethod
    def validate(self) -> None:
        """Checks that need the provider (host limits, cloud quotas); raise ConfigError."""

    @abstractmethod
    def find_image(self) -> Path | str:
        """The image new nodes boot from; MissingImageError when none was built."""

    @abstractmethod
    def provision(self, image: Path | str) -> None:
        """Create (or start again) every node; idempotent."""

    def wait_ready(self) -> None:  # noqa: B027 (optional hook: the local provider waits in provision)
        """Before configuration: wait until every node answers SSH (provision may already have)."""

    @abstractmethod
    def destroy(self) -> list[str]:
        """Remove everything the cluster created; returns what was removed. Idempotent."""

    @abstractmethod
    def status(self) -> list[NodeStatus]: ...

    @abstractmethod
    def inventory(self) -> dict:
        """`ansible-inventory --list` JSON of the running nodes."""

    @abstractmethod
    def ssh_argv(self, node: str, command: list[str], tty: bool = False) -> list[str]: ...

    @abstractmethod
    def start_node(self, name: str) -> None: ...

    @abstractmethod
    def stop_node(self, name: str) -> None: ...
