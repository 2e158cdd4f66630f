"""All-or-nothing launches: a node group comes up whole, or nothing this run launched stays.

One RunInstances call per node (each node has its own name tag and user data), the
node group's calls one after the other, then a wait until the group runs. When any
of that fails (InsufficientInstanceCapacity, a spot request EC2 cannot fill, an
instance that goes to `terminated` while starting, Ctrl-C), every instance launched
by this run, in this group and the ones before it, is terminated and the error
names the node group, the instance type, the Availability Zone and the count.
Throttling (RequestLimitExceeded, Throttling) is retried with backoff by api.call.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from botocore.exceptions import ClientError

from clusterbake.errors import ClusterbakeError
from clusterbake.progress import say
from clusterbake.providers.aws import tags
from clusterbake.providers.aws.api import CAPACITY_ERRORS, THROTTLING, call, error_code, paginate
from clusterbake.providers.aws.iam import call_while_profile_not_ready

# Right after RunInstances, DescribeInstances may not know the new ids yet.
NOT_YET_VISIBLE = frozenset({"InvalidInstanceID.NotFound"})
# A node's planned address an instance terminated moments ago still holds (its interface goes only
# once it finished shutting down: minutes for a large instance, e.g. right after a rollback).
ADDRESS_IN_USE = "InvalidIPAddress.InUse"
ADDRESS_WAIT = 600.0
ADDRESS_POLL = 5.0
RUNNING_TIMEOUT = 900.0
TERMINATED_TIMEOUT = 900.0
POLL = 5.0
BATCH = 500  # instance ids per Describe/Terminate call


class LaunchError(ClusterbakeError):
    """A node group could not be launched; what this run launched has been terminated."""


@dataclass(frozen=True)
class NodeLaunch:
    name: str
    template_id: str
    template_version: str
    user_data: str
    tags: dict[str, str]
    # The template's interfaces with the node's kept address on the first one (None: the template's).
    network_interfaces: list[dict] | None = None


@dataclass
class GroupLaunch:
    nodegroup: str
    instance_type: str
    availability_zone: str
    nodes: list[NodeLaunch] = field(default_factory=list)


def launch_groups(
    client,
    groups: list[GroupLaunch],
    *,
    sleep: Callable[[float], None] = time.sleep,
    running_timeout: float = RUNNING_TIMEOUT,
) -> list[dict]:
    """Launch each group's nodes and wait for them; returns the instances launched."""
    run_id = uuid.uuid4().hex[:12]
    launched: list[dict] = []
    for group in groups:
        if not group.nodes:
            continue
        started: list[dict] = []
        try:
            what = f"{len(group.nodes)} x {group.instance_type} ({group.nodegroup})"
            say(f"    launching {what} in {group.availability_zone}")
            for node in group.nodes:
                instance = _run_one(client, node, run_id, sleep=sleep)
                started.append(instance)
                launched.append(instance)
            wait_for_state(client, [i["InstanceId"] for i in started], "running", sleep=sleep, timeout=running_timeout)
        except BaseException as exc:
            left = rollback(client, launched, sleep=sleep)
            if not isinstance(exc, Exception):
                raise  # Ctrl-C: rolled back, interrupted
            raise LaunchError(_failure_message(group, len(started), exc, launched, left)) from exc
    return launched


def _run_one(client, node: NodeLaunch, run_id: str, sleep: Callable[[float], None] = time.sleep) -> dict:
    extra = {"NetworkInterfaces": node.network_interfaces} if node.network_interfaces else {}
    deadline = time.monotonic() + ADDRESS_WAIT
    while True:
        try:
            # A brand-new instance profile may be unknown to EC2 for a few seconds (IAM is eventually consistent).
            response = call_while_profile_not_ready(
                client.run_instances,
                LaunchTemplate={"LaunchTemplateId": node.template_id, "Version": node.template_version},
                MinCount=1,
                MaxCount=1,
                UserData=node.user_data,
                TagSpecifications=[tags.spec("instance", node.tags)],
                # A retried call (throttling, a lost response) must not launch the node twice.
                ClientToken=f"cb-{run_id}-{node.name}"[:64],
                sleep=sleep,
                **extra,
            )
            return response["Instances"][0]
        except ClientError as exc:
            if error_code(exc) != ADDRESS_IN_USE or time.monotonic() > deadline:
                raise
            address = (node.network_interfaces or [{}])[0].get("PrivateIpAddress")
            holder = _live_holder(client, address) if address else None
            if holder:
                raise ClusterbakeError(f"{node.name}: its planned address {address} is taken by {holder}") from exc
            say(f"    {node.name}: {address} is still held by an instance shutting down, waiting")
            sleep(ADDRESS_POLL)


def _live_holder(client, address: str) -> str | None:
    """What holds `address` for good (an interface not of an instance going away), else None: the
    address of an instance shutting down is free once it has."""
    found = call(client.describe_network_interfaces, Filters=[{"Name": "private-ip-address", "Values": [address]}])
    for interface in found.get("NetworkInterfaces", []):
        instance_id = (interface.get("Attachment") or {}).get("InstanceId")
        if instance_id:
            reservations = call(client.describe_instances, InstanceIds=[instance_id])["Reservations"]
            states = {i["State"]["Name"] for r in reservations for i in r["Instances"]}
            if states <= {"shutting-down", "terminated"}:
                continue
        what = interface.get("Description") or interface.get("InterfaceType") or "a network interface"
        return f"{interface['NetworkInterfaceId']} ({what}, {instance_id or 'no instance'})"
    return None


def _failure_message(group: GroupLaunch, started: int, exc: BaseException, launched: list, left: list[str]) -> str:
    if isinstance(exc, ClientError):
        reason = f"{error_code(exc)}: {exc.response.get('Error', {}).get('Message', '')}"
    else:
        reason = str(exc)
    message = (
        f"node group {group.nodegroup}: could not launch {len(group.nodes)} x {group.instance_type} "
        f"in {group.availability_zone} ({started} launched before the failure): {reason}"
    )
    ids = [i["InstanceId"] for i in launched]
    if left:
        return message + (
            f"; terminating {', '.join(left)} failed: run `clusterbake cluster down` or terminate them by hand"
        )
    if ids:
        message += f"; terminated the {len(ids)} instance(s) this run launched ({', '.join(ids)})"
    else:
        message += "; nothing was launched"
    if error_code(exc) in CAPACITY_ERRORS:
        message += (
            "; try again later, another subnet (Availability Zone), a capacity reservation "
            "(capacity_reservation_id) or fewer nodes"
        )
    return message


def rollback(client, instances: list[dict], sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Terminate `instances`; returns the ids that could not be terminated."""
    ids = [i["InstanceId"] for i in instances]
    if not ids:
        return []
    say(f"    launch failed: terminating the {len(ids)} instance(s) this run launched")
    failed = []
    for start in range(0, len(ids), BATCH):
        chunk = ids[start : start + BATCH]
        try:
            call(client.terminate_instances, InstanceIds=chunk, retry_codes=THROTTLING | NOT_YET_VISIBLE)
        except ClientError:
            failed += chunk
    with contextlib.suppress(ClusterbakeError):  # asked to terminate: EC2 finishes it
        wait_for_state(client, [i for i in ids if i not in failed], "shutting-down", sleep=sleep)
    return failed


# Target state -> states that count as reached; every other state but these is waited on.
REACHED = {
    "running": {"running"},
    "stopped": {"stopped"},
    "terminated": {"terminated"},
    "shutting-down": {"shutting-down", "terminated"},
}
# Target state -> states from which it can no longer be reached.
DEAD_ENDS = {"running": {"shutting-down", "terminated", "stopped", "stopping"}}


def wait_for_state(
    client,
    ids: list[str],
    target: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
    timeout: float = TERMINATED_TIMEOUT,
    poll: float = POLL,
) -> None:
    """Poll DescribeInstances until every instance reached `target` (raise on a dead end or timeout)."""
    pending = list(ids)
    deadline = time.monotonic() + timeout
    while pending:
        states: dict[str, dict] = {}
        for start in range(0, len(pending), BATCH):
            for reservation in paginate(
                client,
                "describe_instances",
                "Reservations",
                retry_codes=THROTTLING | NOT_YET_VISIBLE,
                InstanceIds=pending[start : start + BATCH],
            ):
                for instance in reservation["Instances"]:
                    states[instance["InstanceId"]] = instance
        dead = {i: s for i, s in states.items() if s["State"]["Name"] in DEAD_ENDS.get(target, set())}
        if dead:
            reasons = "; ".join(
                f"{i} {s['State']['Name']} ({s.get('StateReason', {}).get('Message', 'no reason given')})"
                for i, s in sorted(dead.items())
            )
            raise ClusterbakeError(f"instances did not reach {target}: {reasons}")
        pending = [i for i in pending if states.get(i, {}).get("State", {}).get("Name") not in REACHED[target]]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise ClusterbakeError(
                f"{len(pending)} instance(s) not {target} after {timeout:.0f}s: {', '.join(pending)}"
            )
        sleep(poll)
