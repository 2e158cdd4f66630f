"""What the cloud providers (aws, azure) share: a cluster's machines as one record, their
addresses, reaching a node over SSH, status, and publishing the join bundles.

A cloud provider says how to find its machines (`machines()`, each a `Machine` with a
`NodeState`, as libcloud normalises its drivers' nodes), how to read a node's host keys
from its console, where its subnet is and who logs in. A third cloud starts from here.
"""

from __future__ import annotations

import contextlib
import functools
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from clusterbake import remote
from clusterbake.config import NodeGroup
from clusterbake.errors import ClusterbakeError
from clusterbake.plan import LOGIN_GROUP, NodeSpec, address_pool, assign_addresses
from clusterbake.progress import say
from clusterbake.providers import common
from clusterbake.providers.base import NodeStatus, Provider
from clusterbake.remote import Endpoint

SSH_READY_TIMEOUT = 600.0
# The first addresses of a subnet are the cloud's (AWS: network, router, DNS; Azure: network,
# gateway, two DNS): nodes never get them.
RESERVED_FIRST_HOSTS = 3
REFRESH_TIMEOUT = 300


class NodeState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Machine:
    """A node's instance or VM, as either cloud has it."""

    name: str  # the node's name (its clusterbake name tag)
    id: str  # EC2 instance id; the VM's resource id
    label: str  # what the cloud's console calls it: the instance id, the VM's name
    address: str | None
    size: str  # instance type, VM size
    state: NodeState
    state_text: str  # the cloud's own word: EC2 "stopped", Azure "deallocated"
    image: str | None = None
    record: dict = field(default_factory=dict, compare=False)  # the provider's own record

    @property
    def up(self) -> bool:
        return self.state in (NodeState.PENDING, NodeState.RUNNING)


@dataclass(frozen=True)
class RecordFields:
    """Where a cloud's own record of a machine keeps what Machine holds: record keys, the cloud's word
    for its state (`state`) and that word's NodeState (`states`, UNKNOWN for any other)."""

    id: str
    label: str
    address: str
    size: str
    state: Callable[[dict], str]
    states: dict[str, NodeState]
    image: str | None = None

    def machines(self, records: dict[str, dict]) -> dict[str, Machine]:
        """The records by node name as Machines."""
        return {name: self.machine(name, record) for name, record in records.items()}

    def machine(self, name: str, record: dict) -> Machine:
        word = self.state(record)
        return Machine(
            name=name,
            id=record[self.id],
            label=record[self.label],
            address=record.get(self.address),
            size=record[self.size],
            state=self.states.get(word, NodeState.UNKNOWN),
            state_text=word,
            image=record.get(self.image) if self.image else None,
            record=record,
        )


def cloud_errors(method: Callable) -> Callable:
    """Run a provider method inside its SDK's error translation (CloudProvider.sdk_errors)."""

    @functools.wraps(method)
    def wrapper(self: CloudProvider, *args: Any, **kwargs: Any) -> Any:
        with self.sdk_errors():
            return method(self, *args, **kwargs)

    return wrapper


# (changes to report, whether the group's running nodes should fetch the new bundle now)
Publish = Callable[[str, str], tuple[list[str], bool]]


class CloudProvider(Provider):
    # Tags, not the local state file, say what exists: a failed first `cluster up` rolls back
    # its own machines (a group's launches) and keeps the rest (security group, placement
    # groups, templates) for the next try; `cluster down` removes it.
    destroy_after_failed_first_provision = False
    # `cluster up` and `node start` say these when a node has no machine (EC2's words by default).
    machine_noun = "instance"
    create_verb = "launches"
    # What to look at when the head does not answer SSH.
    ready_hint = ""

    # --- what each cloud says ---

    # A context that turns the SDK's exceptions into ClusterbakeError (staticmethod of the cloud's api).
    sdk_errors: Callable[[], contextlib.AbstractContextManager]
    # Who logs in to the nodes, and the bastion in front of them (set from the config's section).
    login_user: str
    bastion: str | None
    subnet_field: str  # the setting that names the subnet, for errors

    @abstractmethod
    def machines(self, power: bool = False) -> dict[str, Machine]:
        """The cluster's machines by node name (`power`: read each one's power state where that costs
        a call of its own)."""

    @abstractmethod
    def _pin_host_keys(self, node: str, machine: Machine) -> None:
        """Pin the node's host keys from its console before SSH (common.pin_from_console)."""

    @property
    @abstractmethod
    def subnet_cidr(self) -> str: ...

    def _connection_extra(self) -> dict:
        """The cloud's own inventory variables of every host."""
        return {}

    def _bundle_publisher(self) -> Publish:
        raise NotImplementedError

    def _check_bundle(self, group: str, bundle: str) -> None:
        """Raise a ClusterbakeError naming what to change when the cloud's secret store cannot hold the
        group's bundle: every group is checked before any is published."""

    # --- shared ---

    def planned_machines(self) -> list[tuple[str, str, str, bool]]:
        return [
            (node.name, self._instance_type(node), self._market(self._group(node.nodegroup)), node.elastic)
            for node in self.nodes
        ]

    def _market(self, group: NodeGroup | None) -> str:
        return "spot" if group is not None and group.spot else "on-demand"

    def self_joining_groups(self) -> list[str]:
        """The groups whose nodes join by themselves from a bundle in the secret store: the login nodes'
        and the node groups."""
        return [*([LOGIN_GROUP] if self.config.login_nodes else []), *(g.name for g in self.config.node_groups)]

    def _group(self, name: str) -> NodeGroup | None:
        return next((g for g in self.config.node_groups if g.name == name), None)

    def _instance_type(self, node: NodeSpec) -> str:
        return self.config.node_size(node.role, node.nodegroup).instance_type

    def addresses(self, machines: dict[str, Machine] | None = None, in_use: set[str] | None = None) -> dict[str, str]:
        """Every planned node's private address (head, static and elastic nodes), kept for good.

        Kept in state.json (`nodes.<name>.address`), and a machine's own address wins (a controller
        without the state file keeps the running nodes' addresses). A new node takes the highest free
        address of the subnet (both clouds give out the lowest first), so growing a group never moves
        another node; `in_use`: addresses other interfaces of the subnet hold, never given to a new node."""
        machines = machines or {}
        kept = {name: node.get("address") for name, node in self.cluster.read_state().get("nodes", {}).items()}
        kept |= {name: m.address for name, m in machines.items() if m.address}
        pool = address_pool(self.subnet_cidr, skip_first=RESERVED_FIRST_HOSTS, from_top=True)
        if in_use:
            ours = {m.address for m in machines.values()}
            pool = [a for a in pool if a not in in_use or a in ours]
        return assign_addresses([n.name for n in self.nodes], pool, kept, self.subnet_field)

    def _missing(self, node: str) -> ClusterbakeError:
        return ClusterbakeError(
            f"node {node} has no {self.machine_noun}; `clusterbake cluster up` {self.create_verb} it"
        )

    @cloud_errors
    def wait_ready(self, timeout: float = SSH_READY_TIMEOUT) -> None:
        """The head answers SSH (its boot service installed the controller's key).

        Only the head: Ansible configures the head alone, compute nodes fetch their join bundle
        themselves, and `cluster up` then waits for them in Slurm."""
        head = self.machines().get("head")
        if head is None or not head.address:
            raise ClusterbakeError(
                f"the head has no {self.machine_noun} (or no address yet); `clusterbake cluster up` "
                f"{self.create_verb} it"
            )
        common.wait_ssh(self._pinned_endpoint("head", head), timeout, self.ready_hint)

    @cloud_errors
    def endpoint(self, node: str) -> Endpoint:
        """The node's private address as the cloud's login user; commands run as root (sudo)."""
        self.node(node)
        machine = self.machines().get(node)
        if machine is None or not machine.address:
            raise self._missing(node)
        return self._pinned_endpoint(node, machine)

    def _endpoint_to(self, node: str, address: str) -> Endpoint:
        return common.endpoint(self.cluster, node, address, self.login_user, self.bastion)

    def _pinned_endpoint(self, node: str, machine: Machine) -> Endpoint:
        """The node's endpoint, its host keys pinned first."""
        assert machine.address, machine
        self._pin_host_keys(node, machine)
        return self._endpoint_to(node, machine.address)

    def _ssh_options(self) -> list[str]:
        return common.ssh_options(self.cluster, self.bastion)

    def _connection_vars(self) -> dict:
        return common.connection_vars(self.cluster, self.login_user, self._ssh_options(), self._connection_extra())

    @cloud_errors
    def status(self) -> list[NodeStatus]:
        machines = self.machines(power=True)
        addresses = self.addresses(machines)
        result = []
        for node in self.nodes:
            machine = machines.get(node.name)
            if machine is None:  # not created, or an elastic node powered down: its planned address
                result.append(NodeStatus(node.name, node.role, node.nodegroup, addresses[node.name], "absent"))
                continue
            result.append(
                NodeStatus(
                    node.name,
                    node.role,
                    node.nodegroup,
                    machine.address,
                    "running" if machine.up else "stopped",
                    f"{machine.label} {machine.size} {machine.state_text}",
                    image=machine.image,
                )
            )
        return result

    @cloud_errors
    def after_configure(self) -> list[str]:
        """Publish each node group's (and the login nodes') join bundle where it changed; the running
        nodes of a group the cloud says should refresh fetch the new one now, the others at their next boot."""
        bundles = {}
        for group in self.self_joining_groups():
            path = self.cluster.join_bundles / f"{group}.json"
            if path.exists():
                bundles[group] = path.read_text()
                self._check_bundle(group, bundles[group])
        publish = self._bundle_publisher()
        changes: list[str] = []
        refresh: list[str] = []
        for group, bundle in bundles.items():
            published, fetch_now = publish(group, bundle)
            changes += published
            if fetch_now:
                refresh.append(group)
        if refresh:
            changes += self._fetch_new_bundles(refresh)
        return changes

    def _fetch_new_bundles(self, groups: list[str]) -> list[str]:
        running = {name: m for name, m in self.machines().items() if m.state == NodeState.RUNNING}
        names = [n.name for n in self.nodes if n.nodegroup in groups and n.name in running]
        endpoints = {n: self._pinned_endpoint(n, running[n]) for n in names}
        results = remote.run_many(endpoints, "clusterbake-node-boot fetch", timeout=REFRESH_TIMEOUT, check=False)
        changes = []
        for name, result in sorted(results.items()):
            if isinstance(result, Exception) or result.returncode != 0:
                say(
                    f"    warning: {name} did not fetch its new bundle now ({_short(result)}); it will at its next boot"
                )
            else:
                say(f"    {name} fetched its new join bundle")
                changes.append(f"{name}: new join bundle fetched")
        return changes


def _short(result) -> str:
    if isinstance(result, Exception):
        return str(result).splitlines()[0] if str(result) else type(result).__name__
    text = (result.stderr or b"").decode(errors="replace").strip().splitlines()
    return text[-1] if text else f"exit {result.returncode}"
