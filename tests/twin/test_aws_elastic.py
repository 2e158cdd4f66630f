"""Elastic node groups on the EC2 twin: the head's ResumeProgram launches instances for jobs
with its own instance role, SuspendProgram terminates them when idle (issue 9, cloud half).

The cluster `citwinel` is examples/aws-twin.yaml with one elastic group (no static compute
node, up to 2 elastic ones, c7a.large or else m7a.large, idle after 20 s) and short power
settings, and one static node `block-1` in a Capacity Block bought through the twin's EC2 API
(realcloud review A1: the twin launches into a block only with MarketType capacity-block).
Capacity is the twin's (`PUT /capacity` on its control socket). The tests run in order on one
cluster, as tests/integration/test_elastic.py does on the local provider.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from polling import wait_for
from timetable import boots_cluster
from twintest import (
    POWER_LOG,
    REPO,
    Twin,
    elastic_cpu_group,
    growing_keeps_every_address,
    node_status,
    requeued_job_runs_when_capacity_is_back,
    slurm_states,
    submit_and_time_the_start,
    submit_where_no_capacity_is,
    twin_setting,
    wait_done,
)

from clusterbake.topology import expand_hostlist, render, switches

pytestmark = pytest.mark.integration
CLUSTER = "citwinel"
NODES = ("cpu-1", "cpu-2")
BLOCK: dict = {}  # the Capacity Block the fixture bought


def _config(max_count: int = 2) -> dict:
    config = yaml.safe_load((REPO / "examples" / "aws-twin.yaml").read_text())
    config["cluster_name"] = CLUSTER
    config["node_groups"], config["power"] = elastic_cpu_group(max_count, ["c7a.large", "m7a.large"])
    # Spot, in the twin's fresh account: its first Spot launch needs the service-linked role the
    # controller makes (realcloud review A2; the head's role may not make it).
    config["node_groups"][0]["spot"] = True
    config["node_groups"].append(
        {"name": "block", "count": 1, "instance_type": "c7a.large", "capacity_reservation_id": BLOCK["id"]}
    )
    config["partitions"] = [{"name": "cpu", "node_groups": ["cpu"], "default": True},
                            {"name": "block", "node_groups": ["block"]}]  # fmt: skip
    return config


def _buy_capacity_block(twin: Twin, subnet_id: str) -> dict:
    """One c7a.large for a day, from now, in the subnet's zone (DescribeCapacityBlockOfferings, then
    PurchaseCapacityBlock, as the EC2 User Guide buys one)."""
    ec2 = twin.client("ec2")
    zone = ec2.describe_subnets(SubnetIds=[subnet_id])["Subnets"][0]["AvailabilityZone"]
    offerings = ec2.describe_capacity_block_offerings(
        InstanceType="c7a.large", InstanceCount=1, CapacityDurationHours=24
    )["CapacityBlockOfferings"]
    offering = next(o for o in offerings if o["AvailabilityZone"] == zone)
    block = ec2.purchase_capacity_block(
        CapacityBlockOfferingId=offering["CapacityBlockOfferingId"], InstancePlatform="Linux/UNIX"
    )["CapacityReservation"]
    return {"id": block["CapacityReservationId"], "end": block["EndDate"]}


@pytest.fixture(scope="module")
@boots_cluster("AWS twin 1+1 block+0..2 elastic")
def elastic(twin_env, tmp_path_factory):
    path = tmp_path_factory.mktemp("twinel") / f"{CLUSTER}.yaml"
    twin = Twin(twin_env, path, cluster=CLUSTER)
    example = yaml.safe_load((REPO / "examples" / "aws-twin.yaml").read_text())
    BLOCK.update(_buy_capacity_block(twin, example["aws"]["subnet_id"]))
    path.write_text(yaml.safe_dump(_config(), sort_keys=False))
    # The twin answers DescribeInstanceTopology for this cluster's small types as EC2 does for a p5
    # (EC2 gives them no topology): topology.conf with block-1 placed at `cluster up`, the elastic
    # nodes placed by the head's reconcile loop once their instances run.
    with twin_setting("topology.json", {"stand_in_types": ["c7a.large", "m7a.large"]}):
        twin.up = twin.cb("cluster", "up", timeout=1200)
        yield twin
        capacity(None)
        twin.cb("cluster", "down", timeout=600)


def _control(path: str, body: dict | None):
    """The twin's control socket at `path`: PUT `body`, DELETE (None) or GET (`...`)."""
    from clusterbake.state import StateDir
    from clusterbake.twins.aws import control

    state = StateDir(Path(os.environ.get("CLUSTERBAKE_STATE_DIR", "/var/lib/clusterbake")))
    if control.read_info(state) is None:
        return None
    if body is ...:
        return control.request(state, "GET", path)
    if body is None:
        return control.request(state, "DELETE", path)
    assert control.request(state, "PUT", path, body) == body
    return body


def capacity(limits: dict[str, int] | None) -> None:
    """EC2's capacity on the twin: RunInstances fails beyond `limits` (None: no limit)."""
    _control("/capacity", limits)


def head(twin: Twin, command: str, **kwargs):
    return twin.on("head", command, **kwargs)


def _elastic_states(twin: Twin) -> dict[str, str]:
    return {name: state for name, state in slurm_states(twin).items() if name in NODES}


def _leaves(twin: Twin) -> dict[str, str]:
    """Each node's leaf switch as slurmctld has it (`scontrol show topology`)."""
    lines = head(twin, "scontrol show topology").stdout.splitlines()
    return {node: m.group(1) for line in lines if (m := re.search(r"SwitchName=(\S+) Level=0 .*Nodes=(\S+)", line))
            for node in expand_hostlist(m.group(2))}  # fmt: skip


def _placed_as_the_controller_would(twin: Twin) -> str:
    """topology.conf as `cluster up` would write it now: from the twin's DescribeInstanceTopology of the
    running compute instances (python-hostlist compressing, as on the controller)."""
    running = {name: i["InstanceId"] for name in ("block-1", *NODES) if (i := twin.instance(name))}
    answer = twin.client("ec2").describe_instance_topology(InstanceIds=sorted(running.values()))["Instances"]
    names = {instance_id: name for name, instance_id in running.items()}
    return render(switches({names[i["InstanceId"]]: i["NetworkNodes"] for i in answer}, ["block-1", *NODES]))


def test_elastic_nodes_start_powered_down_without_instances(elastic):
    assert _elastic_states(elastic) == {"cpu-1": "idle~", "cpu-2": "idle~"}
    assert all(elastic.instance(n) is None for n in NODES)
    # EC2 has no place for an instance that does not run: the elastic nodes under `unplaced`.
    leaves = _leaves(elastic)
    assert (leaves["cpu-1"], leaves["cpu-2"]) == ("unplaced", "unplaced") and leaves["block-1"].startswith("nn-")
    nodes = node_status(elastic)
    assert {n: nodes[n]["state"] for n in NODES} == {"cpu-1": "absent", "cpu-2": "absent"}
    # Planned addresses from the top of the twin's subnet 10.90.0.0/24 (each cluster's own state).
    assert all(nodes[n]["address"].startswith("10.90.0.") for n in ("head", *NODES))
    hosts = head(elastic, "getent hosts cpu-1 cpu-2").stdout.split()
    assert hosts == [nodes["cpu-1"]["address"], "cpu-1", nodes["cpu-2"]["address"], "cpu-2"]


def test_a_job_powers_both_nodes_up_through_the_heads_resume_program(elastic):
    """Spot instances in a fresh account, and Secrets Manager dropping the first fetches' connections:
    eleven, so that one of the two nodes loses all six of botocore's attempts of its first fetch (its
    `max_attempts: 5` retries; the two fetch side by side); each node still joins, on its own retry."""
    planned = {n: node_status(elastic)[n]["address"] for n in NODES}
    _control("/faults", {"GetSecretValue": {"fault": "drop", "times": 11}})
    try:
        job, took = submit_and_time_the_start(elastic, "-N2 -o /shared/up.out", "srun hostname; sleep 20")
        left = _control("/faults", ...)
    finally:
        _control("/faults", None)
    print(f"\nsbatch -N2 on powered-down twin nodes to RUNNING: {took:.1f}s")
    assert "GetSecretValue" not in (left or {}), left  # every dropped connection was a node's fetch
    waited = []
    for name in NODES:
        instance = elastic.instance(name)
        assert (instance["InstanceType"], instance.get("InstanceLifecycle")) == ("c7a.large", "spot")
        assert instance["PrivateIpAddress"] == planned[name]
        # The head launched it with its own role: the node fetched its bundle and joined by itself.
        fetch = elastic.inside(instance["InstanceId"], "journalctl -u clusterbake-node-fetch --no-pager")
        assert f"joined from secret clusterbake/{CLUSTER}/join/cpu" in fetch.stdout
        waited += [name] if "waiting for Secrets Manager" in fetch.stdout else []
    assert waited, "no node's first fetch failed: the faults went elsewhere"
    # Running, the instances have their place: the reconcile loop wrote it to topology.conf, in the
    # file `cluster up` would write (the head's `scontrol show hostlistsorted` compressing as
    # python-hostlist does), and slurmctld reads it.
    wait_for("cpu-1, cpu-2 placed", lambda: _leaves(elastic)["cpu-2"] != "unplaced" != _leaves(elastic)["cpu-1"],
             timeout=60, describe=lambda: head(elastic, POWER_LOG).stdout[-3000:])  # fmt: skip
    assert head(elastic, "cat /etc/slurm/topology.conf").stdout == _placed_as_the_controller_would(elastic)
    wait_done(elastic, job)
    assert sorted(head(elastic, "cat /shared/up.out").stdout.split()) == list(NODES)
    log = head(elastic, POWER_LOG).stdout
    assert re.search(r"resume cpu-1: i-\w+ c7a\.large at ", log), log
    assert "topology: /etc/slurm/topology.conf rewritten for 3 running node(s)" in log, log


def test_idle_nodes_are_terminated_after_idle_time(elastic):
    wait_for("both idle~", lambda: set(_elastic_states(elastic).values()) == {"idle~"}, timeout=150)
    wait_for("no instance left", lambda: all(elastic.instance(n) is None for n in NODES), timeout=60)
    log = head(elastic, POWER_LOG).stdout
    for name in NODES:  # one call for both, or one each when they went idle apart
        assert re.search(rf"suspend [\w,-]*\b{name}\b[\w,-]* \(idle past their idle_time\)", log), log
    assert re.search(r"terminate cpu-2: i-\w+", log)
    wait_for("cpu-1, cpu-2 unplaced again", lambda: {_leaves(elastic)[n] for n in NODES} == {"unplaced"}, timeout=60)


def test_without_capacity_for_the_first_type_a_node_comes_up_as_the_next(elastic):
    capacity({"c7a.large": 0})
    try:
        job, took = submit_and_time_the_start(elastic, "-N1 -w cpu-1 -o /shared/fallover.out", "hostname; sleep 15")
    finally:
        capacity(None)
    print(f"\nsbatch -N1 to RUNNING with c7a.large out of capacity (m7a.large launched): {took:.1f}s")
    assert elastic.instance("cpu-1")["InstanceType"] == "m7a.large"
    log = head(elastic, POWER_LOG).stdout
    assert "resume cpu-1: c7a.large: InsufficientInstanceCapacity" in log
    assert "c7a.large skipped for 10s, trying m7a.large" in log
    fallover = r"resume cpu-1: i-\w+ m7a\.large at [\d.]+ \(fallback: c7a\.large: InsufficientInstanceCapacity\)"
    assert re.search(fallover, log), log
    wait_done(elastic, job)
    assert head(elastic, "cat /shared/fallover.out").stdout.strip() == "cpu-1"


def test_a_node_no_type_has_capacity_for_goes_down_and_its_job_is_requeued(elastic):
    wait_for("cpu-2 idle~", lambda: slurm_states(elastic)["cpu-2"] == "idle~", timeout=60)
    capacity({"c7a.large": 0, "m7a.large": 0})
    try:
        job = submit_where_no_capacity_is(
            elastic,
            "EC2",
            r"clusterbake: resume failed: no capacity \(c7a\.large: InsufficientInstanceCapacity[^;]*; "
            r"m7a\.large: InsufficientInstanceCapacity",
        )
        assert elastic.instance("cpu-2") is None
    finally:
        capacity(None)
    requeued_job_runs_when_capacity_is_back(elastic, job)


def test_the_capacity_block_node_runs_in_the_block_and_takes_no_job_past_its_end(elastic):
    """Launched with MarketType capacity-block into the block (the twin refuses it otherwise), joined;
    a Slurm maintenance reservation from 30 minutes before the block's end keeps a job without a time
    limit off it, while a short one runs."""
    instance = elastic.instance("block-1")
    assert (instance["InstanceLifecycle"], instance["CapacityReservationId"]) == ("capacity-block", BLOCK["id"])
    reservation = head(elastic, "scontrol show reservation --oneliner clusterbake-block-end-block").stdout
    start = head(elastic, f"date -d @{int(BLOCK['end'].timestamp()) - 1800} +%Y-%m-%dT%H:%M:%S").stdout.strip()
    assert f"StartTime={start} " in reservation and " Nodes=block-1 " in reservation, reservation
    assert "MAINT" in reservation and "Users=root " in reservation, reservation
    short = head(elastic, "sbatch --parsable -p block -t 5 -o /shared/block.out --wrap hostname").stdout.strip()
    wait_done(elastic, short)
    assert head(elastic, "cat /shared/block.out").stdout.strip() == "block-1"
    unbounded = head(elastic, "sbatch --parsable -p block --wrap hostname").stdout.strip()
    try:
        reason = wait_for(
            "the unbounded job held off the block",
            lambda: re.search(r"Reason=(\S*(Reserved|ReqNodeNotAvail)\S*)",
                              head(elastic, f"scontrol show job {unbounded}").stdout),
            timeout=60,
        )  # fmt: skip
        assert "JobState=PENDING" in head(elastic, f"scontrol show job {unbounded}").stdout, reason.group(1)
    finally:
        head(elastic, f"scancel {unbounded}")


def test_growing_max_count_keeps_every_address(elastic, tmp_path):
    growing_keeps_every_address(elastic, _config(max_count=4), tmp_path / f"{CLUSTER}.yaml", CLUSTER)


def test_cluster_down_leaves_nothing(elastic):
    elastic.cb("cluster", "down", timeout=600)
    elastic.assert_cluster_gone()
