"""Helpers of the twin tests: the CLI against the twin, boto3 with the twin's key, nsenter into nodes.

(A module of its own, not conftest.py: several test directories have a conftest.py.)
"""

from __future__ import annotations

import configparser
import contextlib
import functools
import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import boto3
import polling
import yaml
from nodeshell import run_on
from polling import wait_for
from sdkenv import Environ

REPO = Path(__file__).resolve().parents[2]
CB = [str(REPO / ".venv" / "bin" / "clusterbake")]
# The twins' node images take the image settings of the suite's cluster: a layer on its image.
SUITE_CONFIG = REPO / "tests" / "integration" / "cluster.yaml"
CLUSTER = "citwin"
REGION = "us-east-1"


def run(argv, check=True, timeout=900, env=None, **kwargs):
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{shlex.join(map(str, argv))} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
            f"\n--- stderr\n{result.stderr[-8000:]}"
        )
    return result


class Twin:
    def __init__(self, env: dict[str, str], config: Path, cluster: str = CLUSTER):
        self.env = env
        self.config = config
        self.cluster = cluster

    def cb(self, *args, **kwargs):
        return run([*CB, "-c", str(self.config), *args], env=self.env, **kwargs)

    def on(self, node: str, command: str, **kwargs):
        """A shell command on a node (nodeshell: as `clusterbake ssh` runs it, over a connection kept
        open); the provider finds the node through the twin's API, as the CLI would. kwargs: check,
        timeout, input."""
        with Environ(self.env):
            endpoint = self.provider.endpoint(node)
        return run_on(endpoint, command, **kwargs)

    @functools.cached_property
    def provider(self):
        from clusterbake.config import load_config
        from clusterbake.providers import get_provider

        with Environ(self.env):
            return get_provider(load_config(self.config))

    def train_deepspeed(self, job_name: str, nodes: int = 2):
        """The DeepSpeed example on `nodes` nodes, 12 steps with a checkpoint every 6 on /shared; waits for it."""
        return self.cb(
            "job", "submit", "deepspeed", "--nodes", str(nodes), "--upload", "examples/deepspeed",
            "--job-name", job_name, "--wait", "--", "deepspeed/train.py",
            "--deepspeed_config", "deepspeed/ds_config.json", "--steps", "12", "--checkpoint-every", "6",
            timeout=1200,
        )  # fmt: skip

    def client(self, service: str):
        """A boto3 client with the twin's administrator key (what `twin up` exported)."""
        credentials = configparser.ConfigParser()
        credentials.read(self.env["AWS_SHARED_CREDENTIALS_FILE"])
        profile = credentials[self.env["AWS_PROFILE"]]
        session = boto3.session.Session(
            aws_access_key_id=profile["aws_access_key_id"],
            aws_secret_access_key=profile["aws_secret_access_key"],
            region_name=REGION,
        )
        return session.client(service, endpoint_url=self.env["AWS_ENDPOINT_URL"])

    def status(self) -> dict:
        return json.loads(run([*CB, "twin", "status", "aws"], env=self.env).stdout)

    def instance(self, name: str, states=("pending", "running", "stopping", "stopped")) -> dict | None:
        pages = (
            self.client("ec2")
            .get_paginator("describe_instances")
            .paginate(
                Filters=[
                    {"Name": "tag:clusterbake:cluster", "Values": [self.cluster]},
                    {"Name": "tag:clusterbake:name", "Values": [name]},
                    {"Name": "instance-state-name", "Values": list(states)},
                ]
            )
        )
        found = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        return found[0] if found else None

    def node_pid(self, instance_id: str) -> int:
        """PID 1 of the instance's node (the child of its nspawn process)."""
        return node_init_pid(f"cb-twin-aws-{instance_id}", instance_id)

    def inside(self, instance_id: str, command: str, check=True) -> subprocess.CompletedProcess:
        """A command in the node's namespaces, without SSH (what a console would show)."""
        pid = self.node_pid(instance_id)
        return run(["nsenter", "-t", str(pid), "-a", "sh", "-c", command], check=check, timeout=120)

    def wait_idle(self, nodes: set[str], timeout: float = 180) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            result = self.on("head", "sinfo --noheader --Node --format='%N %t'", check=False)
            states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
            if all(states.get(n) == "idle" for n in nodes):
                return states
            time.sleep(2)
        raise AssertionError(f"nodes {sorted(nodes)} not idle after {timeout}s: {states}")

    def assert_cluster_gone(self) -> None:
        """After `cluster down`: nothing of the cluster in the account, and (within the twin's
        next rounds) no node of its instances on the host."""
        ec2, iam = self.client("ec2"), self.client("iam")
        tag = [{"Name": "tag:clusterbake:cluster", "Values": [self.cluster]}]
        live = [
            i
            for r in ec2.describe_instances(Filters=tag)["Reservations"]
            for i in r["Instances"]
            if i["State"]["Name"] != "terminated"
        ]
        assert live == []
        assert ec2.describe_launch_templates(Filters=tag)["LaunchTemplates"] == []
        assert ec2.describe_security_groups(Filters=tag)["SecurityGroups"] == []
        listed = self.client("secretsmanager").list_secrets(Filters=[{"Key": "tag-value", "Values": [self.cluster]}])
        assert listed["SecretList"] == []
        assert [r for r in iam.list_roles()["Roles"] if self.cluster in r["RoleName"]] == []
        profiles = iam.list_instance_profiles()["InstanceProfiles"]
        assert [p for p in profiles if self.cluster in p["InstanceProfileName"]] == []
        file_systems = self.client("efs").describe_file_systems()["FileSystems"]
        assert [f for f in file_systems if self.cluster in f["CreationToken"]] == []
        subnet = self.status()["subnet_id"]
        reserved = ec2.get_subnet_cidr_reservations(SubnetId=subnet)["SubnetIpv4CidrReservations"]
        assert [r for r in reserved if {"Key": "clusterbake:cluster", "Value": self.cluster} in r.get("Tags", [])] == []
        # A terminated instance's node goes in the twin's next round (0.25 s apart), not at once.
        wait_for(
            "the twin's nodes gone",
            lambda: [i for i in self.status()["instances"] if i["node"] != "absent"] == [],
            timeout=60,
        )


def node_init_pid(machine: str, what: str) -> int:
    """PID 1 of the node `machine` (the child of its nspawn process): an AssertionError naming
    `what` while there is none (not started, or nspawn has not forked the node's init yet)."""
    from clusterbake.nspawn import machines

    nspawn = machines.find_machines(machine).get(machine)
    assert nspawn, f"no node runs for {what}"
    try:
        children = Path(f"/proc/{nspawn}/task/{nspawn}/children").read_text().split()
    except OSError:
        children = []
    assert children, f"the node of {what} has no init process (yet)"
    return int(children[0])


def twin_environment(cloud: str = "aws") -> dict[str, str]:
    """`clusterbake twin up <cloud>`'s export lines, evaluated by bash as `eval "$(...)"` does (a
    secret's line reads its 0600 file), applied to a copy of this environment."""
    result = run([*CB, "--config", str(SUITE_CONFIG), "twin", "up", cloud], timeout=2400)
    for line in result.stdout.splitlines():
        assert line.startswith("export "), f"unexpected output of twin up: {line!r}"
    dumped = run(["bash", "-c", 'eval "$1" && env -0', "sh", result.stdout], env=dict(os.environ)).stdout
    return dict(item.split("=", 1) for item in dumped.split("\0") if "=" in item)


def host_leftovers(cloud: str = "aws") -> list[str]:
    """What the twin of `cloud` could leave on the host: namespaces, links, node processes, its daemon,
    mounts, state."""
    from clusterbake.nspawn import machines

    net = f"twin-{cloud}"
    left = [f"netns {n}" for n in run(["ip", "netns", "list"]).stdout.split() if net in n]
    left += [
        f"link {line.split(':')[1].strip()}"
        for line in run(["ip", "-o", "link"]).stdout.splitlines()
        if f"cb-{net}" in line
    ]
    left += [f"node {m}" for m in machines.find_machines(f"cb-{net}-")]
    left += [
        f"mount {line.split()[4]}"
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if f"/twins/{cloud}" in line.split()[4]
    ]
    daemon = f"clusterbake.twins.{cloud}.daemon"
    left += [f"process {pid}" for pid in os.listdir("/proc") if pid.isdigit() and daemon in _cmdline(pid)]
    state = Path(os.environ.get("CLUSTERBAKE_STATE_DIR", "/var/lib/clusterbake")) / "twins" / cloud
    if state.exists():
        left.append(f"state {state}")
    return left


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def slurm_states(cluster: Twin) -> dict[str, str]:
    """Node -> Slurm's short state (sinfo %t: idle, idle~, alloc, ...) as the head sees it."""
    result = cluster.on("head", "sinfo --noheader --Node --format='%N %t'")
    return dict(line.split() for line in result.stdout.splitlines() if line.strip())


def submit_and_time_the_start(cluster: Twin, options: str, command: str) -> tuple[str, float]:
    """polling.submit_and_time_the_start on the twin cluster's head."""
    return polling.submit_and_time_the_start(
        lambda script, timeout: cluster.on("head", script, timeout=timeout).stdout, options, command
    )


def wait_done(cluster: Twin, job: str, timeout: float = 120) -> None:
    wait_for(
        f"job {job} completed",
        lambda: "JobState=COMPLETED" in cluster.on("head", f"scontrol show job {job}").stdout,
        timeout=timeout,
    )


@contextlib.contextmanager
def twin_setting(name: str, values: dict):
    """`values` merged into one of the EC2 twin's settings files (its state folder's quotas.json,
    topology.json ...: twins/aws/control.py), what it held before put back after."""
    path = Path(os.environ.get("CLUSTERBAKE_STATE_DIR", "/var/lib/clusterbake")) / "twins" / "aws" / name
    before = path.read_text() if path.exists() else None
    path.write_text(json.dumps({**json.loads(before or "{}"), **values}))
    try:
        yield
    finally:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(before)


def elastic_cpu_group(max_count: int, instance_types: list[str]) -> tuple[list[dict], dict]:
    """(node_groups, power) of the twins' elastic tests: one group `cpu` without static nodes, up to
    `max_count` elastic ones of `instance_types` (the first the primary), idle after 20 s, and power
    settings short enough for a test (a failed node back after 15 s, a type skipped for 10 s)."""
    groups = [
        {
            "name": "cpu",
            "min_count": 0,
            "max_count": max_count,
            "instance_types": list(instance_types),
            "idle_time": 20,
            "features": ["train"],
        }
    ]
    power = {
        "resume_timeout": 180,
        "suspend_timeout": 10,
        "failed_node_cooldown": 15,
        "orphan_grace": 10,
        "capacity_cooldown": 10,
    }
    return groups, power


# --- the elastic twin tests' shared steps (tests/twin/test_aws_elastic.py, test_azure_elastic.py) ---

POWER_LOG = "cat /var/log/clusterbake/power.log"


def node_status(cluster: Twin) -> dict[str, dict]:
    """`cluster status --json`'s nodes by name."""
    return {n["name"]: n for n in json.loads(cluster.cb("cluster", "status", "--json").stdout)["nodes"]}


def submit_where_no_capacity_is(cluster: Twin, cloud: str, error_pattern: str) -> str:
    """With no capacity for any of the group's types, a job on powered-down cpu-2: the resume fails,
    cpu-2 goes DOWN with the cloud's error (`error_pattern`) and the job is requeued. The job's id."""
    job = cluster.on("head", "sbatch --parsable --requeue -N1 -w cpu-2 -o /shared/retry.out --wrap hostname")
    job = job.stdout.strip()
    reason = wait_for(
        f"cpu-2 down with {cloud}'s error",
        lambda: re.search(error_pattern, cluster.on("head", "scontrol show node cpu-2").stdout),
        timeout=90,
    )
    assert reason
    # Requeued, not lost: slurmctld requeues the job once it has handled the node going down, which
    # under load comes after the reason shows (REQUEUED, then PENDING).
    wait_for(
        f"job {job} requeued",
        lambda: "JobState=PENDING" in cluster.on("head", f"scontrol show job {job}").stdout,
        timeout=60,
    )
    return job


def requeued_job_runs_when_capacity_is_back(cluster: Twin, job: str) -> None:
    """The reconcile loop returns cpu-2 after failed_node_cooldown, and the requeued job runs there."""
    wait_for(
        "the requeued job done",
        lambda: "JobState=COMPLETED" in cluster.on("head", f"scontrol show job {job}").stdout,
        timeout=240,
    )
    assert cluster.on("head", "cat /shared/retry.out").stdout.strip() == "cpu-2"
    assert "cpu-2 down since" in cluster.on("head", POWER_LOG).stdout


def growing_keeps_every_address(cluster: Twin, grown_config: dict, path: Path, name: str) -> None:
    """`cluster up` with max_count 2 -> 4 (grown_config, written to path): cpu-1 and cpu-2 keep their
    addresses, cpu-3 and cpu-4 get new ones and are powered down."""
    before = {node: n["address"] for node, n in node_status(cluster).items()}
    path.write_text(yaml.safe_dump(grown_config, sort_keys=False))
    bigger = Twin(cluster.env, path, cluster=name)
    bigger.cb("cluster", "up", timeout=900)
    after = {node: n["address"] for node, n in node_status(bigger).items()}
    assert {node: after[node] for node in before} == before
    assert sorted(set(after) - set(before)) == ["cpu-3", "cpu-4"]
    assert len(set(after.values())) == len(after)
    assert {"cpu-3": "idle~", "cpu-4": "idle~"}.items() <= slurm_states(bigger).items()


class CheckpointedTraining:
    """The DeepSpeed example on 2 nodes, 40 steps, a checkpoint every 20, submitted as the researcher: what
    a spot reclaim test interrupts, then checks resumed from the checkpoint the notice asked for."""

    def __init__(self, cluster: Twin, name: str):
        from clusterbake.job_report import events

        self.cluster, self.events = cluster, events
        submitted = cluster.cb(
            "job", "submit", "deepspeed", "--nodes", "2", "--upload", "examples/deepspeed", "--job-name", name,
            "--", "deepspeed/train.py", "--deepspeed_config", "deepspeed/ds_config.json",
            "--steps", "40", "--checkpoint-every", "20",
        ).stdout  # fmt: skip
        self.job_id = re.search(r"submitted job (\d+)", submitted).group(1)
        self.output = f"/shared/jobs/researcher/{name}-{self.job_id}.out"
        wait_for("step 5", lambda: any(e["event"] == "step" and e["step"] >= 5 for e in self.steps()), timeout=300)

    def log(self) -> str:
        return self.cluster.on("head", f"cat {self.output} 2>/dev/null || true").stdout

    def steps(self) -> list[dict]:
        return self.events(self.log())

    def assert_resumed_from_the_notice_checkpoint(self) -> None:
        """The job completes after one requeue, having checkpointed on the notice: nothing trained twice."""

        def finished() -> str:
            shown = self.cluster.on("head", f"scontrol show job -o {self.job_id}", check=False).stdout
            found = re.search(r"JobState=(\S+)", shown)
            return found.group(1) if found and found.group(1) in ("COMPLETED", "FAILED", "CANCELLED") else ""

        assert wait_for("the job done", finished, timeout=900, interval=3) == "COMPLETED"
        text = self.log()
        assert "asking for a checkpoint" in text and "checkpoint written; requeueing job" in text
        done = [e for e in self.events(text) if e["event"] == "done"][-1]  # the first run's ended at the checkpoint
        assert done["steps"] == 40 and not done["stopped_by_signal"]
        first_run = text.split("(restart 1)")[0]
        last_before = max(e["step"] for e in self.events(first_run) if e["event"] == "step")
        resumed = next(e for e in self.events(text) if e["event"] == "resumed")
        assert last_before - resumed["step"] <= 0
