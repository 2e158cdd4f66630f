"""Helpers of the twin tests: the CLI against the twin, boto3 with the twin's key, nsenter into nodes.

(A module of its own, not conftest.py: several test directories have a conftest.py.)
"""

from __future__ import annotations

import configparser
import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import boto3
from polling import wait_for

REPO = Path(__file__).resolve().parents[2]
CB = [str(REPO / ".venv" / "bin" / "clusterbake")]
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
        return self.cb("ssh", node, "--", command, **kwargs)

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
    """`clusterbake twin up <cloud>`'s export lines, applied to a copy of this environment."""
    result = run([*CB, "twin", "up", cloud], timeout=2400)
    env = dict(os.environ)
    for line in result.stdout.splitlines():
        assert line.startswith("export "), f"unexpected output of twin up: {line!r}"
        key, _, value = line[len("export ") :].partition("=")
        env[key] = value
    return env


def host_leftovers() -> list[str]:
    """What the twin could leave on the host: namespaces, links, node processes, mounts, state."""
    from clusterbake.nspawn import machines

    left = [f"netns {n}" for n in run(["ip", "netns", "list"]).stdout.split() if "twin-aws" in n]
    left += [
        f"link {line.split(':')[1].strip()}"
        for line in run(["ip", "-o", "link"]).stdout.splitlines()
        if "cb-twin-aws" in line
    ]
    left += [f"node {m}" for m in machines.find_machines("cb-twin-aws-")]
    left += [
        f"mount {line.split()[4]}"
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if "/twins/aws" in line.split()[4]
    ]
    state = Path(os.environ.get("CLUSTERBAKE_STATE_DIR", "/var/lib/clusterbake")) / "twins" / "aws"
    if state.exists():
        left.append(f"state {state}")
    return left
