"""The interface every provider (local, aws, azure) implements for the CLI."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from clusterbake.config import ClusterConfig
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.plan import NodeSpec, plan_nodes
from clusterbake.remote import Endpoint
from clusterbake.state import ClusterDir, StateDir


@dataclass(frozen=True)
class Price:
    """A machine's price: USD per hour, or None with `source` saying why it is unknown (a cloud's price
    API gives it; nothing guesses one)."""

    usd_per_hour: float | None
    source: str

    @property
    def known(self) -> bool:
        return self.usd_per_hour is not None


@dataclass
class NodeStatus:
    name: str
    role: str
    nodegroup: str
    address: str | None
    state: str  # running, stopped, absent (local also: orphaned)
    detail: str = ""
    image: str | None = None  # the image the node's disk (instance) was made from; None: none, or unknown


@dataclass
class MachineCost:
    """One running machine's price per hour (None: unknown, `source` says why)."""

    node: str
    instance_id: str
    instance_type: str
    market: str  # on-demand, spot, capacity-block, ...
    usd_per_hour: float | None
    source: str


@dataclass
class CostEstimate:
    """What the cluster's running machines cost per hour now, and what that leaves out."""

    machines: list[MachineCost] = field(default_factory=list)
    not_included: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def usd_per_hour(self) -> float | None:
        """The sum over the priced machines; None when none of the running ones could be priced."""
        known = [m.usd_per_hour for m in self.machines if m.usd_per_hour is not None]
        if self.machines and not known:
            return None
        return sum(known, 0.0)

    @property
    def complete(self) -> bool:
        return all(m.usd_per_hour is not None for m in self.machines)

    def to_json(self) -> dict:
        return {
            "currency": "USD",
            "per_hour": self.usd_per_hour,
            "complete": self.complete,
            "machines": [
                {
                    "node": m.node,
                    "instance_id": m.instance_id,
                    "instance_type": m.instance_type,
                    "market": m.market,
                    "per_hour": m.usd_per_hour,
                    "source": m.source,
                }
                for m in self.machines
            ],
            "not_included": list(self.not_included),
            "note": self.note,
        }


@dataclass
class Leftover:
    """Something of the cluster that still bills after `cluster down`."""

    what: str
    kept: bool = False  # kept on purpose (retain: true, a file_system_id the config names)


@dataclass
class BillingCheck:
    leftovers: list[Leftover] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # what could not be checked, and why
    note: str = ""

    @property
    def unexpected(self) -> list[Leftover]:
        return [item for item in self.leftovers if not item.kept]


# How long a head may take to answer before Slurm's commands go to the next head.
CONTROLLER_PROBE_TIMEOUT = 5.0


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

    def finish_provision(self) -> None:  # noqa: B027 (optional hook: nothing goes on after provision)
        """Wait for what provision left going on in the background (the local provider's compute
        nodes start while the head is configured); a failure there is NodesDidNotBoot."""

    def configuring(self) -> contextlib.AbstractContextManager:
        """Around the head's play (ansible/cluster.yml): what the provider does while it runs (the
        local provider joins its new compute nodes as soon as the play has kept their bundles)."""
        return contextlib.nullcontext()

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
            remote.run(self.controller_endpoint(), command, timeout=30, check=True)
        except Exception as exc:  # the head may be stopped or unreachable: the node goes anyway
            say(f"    warning: could not mark {name} down in Slurm ({str(exc).splitlines()[0]})")

    def after_configure(self) -> list[str]:
        """After Ansible configured the cluster: publish what nodes fetch by themselves (cloud join bundles),
        hand it to running nodes where the provider can. What changed, in words (empty: nothing)."""
        return []

    @abstractmethod
    def destroy(self) -> list[str]:
        """Remove everything the cluster created; returns what was removed. Idempotent."""

    def rollback(self) -> list[str]:
        """Undo a failed first provision (destroy_after_failed_first_provision); a provider may keep
        the failure's evidence."""
        return self.destroy()

    @abstractmethod
    def status(self) -> list[NodeStatus]: ...

    @abstractmethod
    def inventory(self) -> dict:
        """`ansible-inventory --list` JSON of the running nodes."""

    @abstractmethod
    def endpoint(self, node: str) -> Endpoint:
        """How to reach a node over SSH (clusterbake.remote runs the commands)."""

    def controller_endpoint(self) -> Endpoint:
        """Where Slurm's commands run: the head; with a backup controller (head.count 2) the first head
        that answers SSH, whose commands reach whichever slurmctld is in control."""
        from clusterbake import remote

        heads = [n.name for n in self.nodes if n.role == "head"]
        if len(heads) == 1:
            return self.endpoint(heads[0])
        errors = []
        for name in heads:
            try:
                endpoint = self.endpoint(name)
                remote.probe(endpoint, timeout=CONTROLLER_PROBE_TIMEOUT)
            except ClusterbakeError as exc:  # remote.RemoteError included
                errors.append(f"{name}: {str(exc).splitlines()[0]}")
                continue
            return endpoint
        raise ClusterbakeError(
            f"no head answers SSH ({'; '.join(errors)}); `clusterbake cluster status` shows their machines"
        )

    @abstractmethod
    def start_node(self, name: str) -> None: ...

    @abstractmethod
    def stop_node(self, name: str) -> None: ...

    def use_image(self, image: Path | str) -> bool:
        """Make `image` the one new nodes (and replaced ones) boot; running nodes keep theirs. False:
        it already was."""
        raise ClusterbakeError(f"moving a cluster to another image is not supported on {self.config.provider} yet")

    def replace_node(self, name: str, image: Path | str | None = None) -> None:
        """Give a compute node a new disk (instance) from `image`, default the cluster's, and boot it;
        it joins by itself. Another image becomes the cluster's. Jobs are the caller's to drain first."""
        raise ClusterbakeError(f"replacing a node is not supported on {self.config.provider} yet")

    def interrupt_node(self, name: str, seconds: int) -> None:
        """Rehearse a spot reclaim: an interruption notice on the node now, the machine gone after
        `seconds`. Only the local provider stages one; on a cloud the cloud's own tool does."""
        raise ClusterbakeError(
            f"node interrupt: provider {self.config.provider} cannot stage an interruption; use the cloud's "
            "fault injection (AWS FIS aws:ec2:send-spot-instance-interruptions, Azure `az vm simulate-eviction`)"
        )

    def cost(self) -> CostEstimate | None:
        """The estimated price per hour of the cluster's running machines (`cluster status`);
        None: this provider cannot tell. Prices it cannot get are unknown, never guessed."""
        return None

    def billing_leftovers(self) -> BillingCheck | None:
        """After destroy(): what of the cluster still bills, read-only (`cluster down`'s last
        line); None: this provider cannot tell."""
        return None

    # --- `cluster up --dry-run` (clusterbake/dry_run.py): read-only ---------------------------

    machine_kind = "node"  # what the dry run calls a node's machine (an instance, a VM)
    cost_not_included: tuple[str, ...] = ()  # what a machine's price leaves out (storage, transfer)

    def check_image(self, image: Path | str) -> None:  # noqa: B027 (optional: provision checks it too)
        """The image boots every planned node (read-only; provision checks it again)."""

    def cluster_resources(self) -> list:
        """What `cluster up` makes besides the nodes' machines: dry_run.PlannedResource, each marked
        as made already or to create (read-only)."""
        return []

    def planned_machines(self) -> list[tuple[str, str, str, bool]]:
        """(node, instance type, market, elastic) of every planned node."""
        return [(node.name, "container", "local", node.elastic) for node in self.nodes]

    def machine_price(self, instance_type: str, market: str) -> Price:
        """The price per hour of one machine of `instance_type` at `market`, now."""
        return Price(0.0, "this machine's: nothing billed")
