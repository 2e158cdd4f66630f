"""The interface every provider (local, aws, azure) implements for the CLI."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from clusterbake.config import ClusterConfig
from clusterbake.errors import ConfigError
from clusterbake.remote import Endpoint
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
        """Before configuration: wait until every node answers SSH (provision may already have).

        Cloud providers probe all nodes at once: clusterbake.remote.wait_ready over their endpoints.
        """

    def tell_slurm_down(self, name: str, reason: str) -> None:
        """Mark a compute node DOWN in Slurm before its machine goes (best effort: the head may be down too).

        slurmctld would otherwise keep showing the node idle until SlurmdTimeout; with
        ReturnToService=2 the node returns to service when its slurmd registers again.
        """
        from clusterbake import remote
        from clusterbake.progress import say

        if self.node(name).role != "compute":
            return
        command = ["scontrol", "update", f"NodeName={name}", "State=DOWN", f"Reason={reason}"]
        try:
            remote.run(self.endpoint("head"), command, timeout=30, check=True)
        except Exception as exc:  # the head may be stopped or unreachable: the node goes anyway
            say(f"    warning: could not mark {name} down in Slurm ({str(exc).splitlines()[0]})")

    def after_configure(self) -> None:  # noqa: B027 (optional hook)
        """After Ansible configured the cluster: publish what nodes fetch by themselves (cloud join bundles)."""

    @abstractmethod
    def destroy(self) -> list[str]:
        """Remove everything the cluster created; returns what was removed. Idempotent."""

    @abstractmethod
    def status(self) -> list[NodeStatus]: ...

    @abstractmethod
    def inventory(self) -> dict:
        """`ansible-inventory --list` JSON of the running nodes."""

    @abstractmethod
    def endpoint(self, node: str) -> Endpoint:
        """How to reach a node over SSH (clusterbake.remote runs the commands)."""

    @abstractmethod
    def start_node(self, name: str) -> None: ...

    @abstractmethod
    def stop_node(self, name: str) -> None: ...
