"""Helpers of the aws provider's tests: the moto server handle, the CLI, the inventory script."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3
import yaml
from clitest import run_cli, run_inventory, stop_server

from clusterbake.twins.aws.egress import add_nat_route

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
REGION = "us-east-1"
ZONE = "us-east-1a"


@dataclass
class Moto:
    url: str
    capacity_file: Path
    env: dict[str, str]
    console_dir: Path  # <instance id>.log: that instance's console output (GetConsoleOutput)
    faults_file: Path  # $MOTO_FAULTS_FILE: faults injected per API action (moto_ext.FAULTS)
    quotas_file: Path  # $MOTO_QUOTAS_FILE: EC2 quotas' applied values (twins/aws/service_quotas.py)
    topology_file: Path  # $MOTO_TOPOLOGY_FILE: where instances hang (twins/aws/topology.py)

    def console(self, instance_id: str, text: str) -> None:
        """What the instance's console shows (its boot program prints its host keys there)."""
        (self.console_dir / f"{instance_id}.log").write_text(text)

    def ec2(self):
        return self.client("ec2")

    def client(self, service: str):
        """A boto3 client of `service` (iam, sts, kms, secretsmanager, efs, fsx, s3, ...) on the server."""
        return boto3.client(
            service,
            region_name=REGION,
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def limit_capacity(self, limits: dict[str, int | dict] | None) -> None:
        """Make RunInstances fail beyond `limits` (None: no limit): per type a count (the error is
        InsufficientInstanceCapacity) or {"count": N, "code": one of moto_ext.CAPACITY_MESSAGES}."""
        if limits is None:
            self.capacity_file.unlink(missing_ok=True)
        else:
            self.capacity_file.write_text(json.dumps(limits))

    def set_quotas(self, values: dict[str, float | None] | None) -> None:
        """EC2 quotas' applied values by quota code (null: never raised, the default applies); None: the
        twin account's own."""
        if values is None:
            self.quotas_file.unlink(missing_ok=True)
        else:
            self.quotas_file.write_text(json.dumps(values))

    def inject_faults(self, faults: dict[str, dict] | None) -> None:
        """The next calls of each action get a fault: {"DescribeInstances": {"fault": "InternalError",
        "times": 2}}; "*": the first `times` calls of every action (None: no faults)."""
        if faults is None:
            self.faults_file.unlink(missing_ok=True)
        else:
            from clusterbake.twins.aws.moto_ext import check_faults

            self.faults_file.write_text(json.dumps(check_faults(faults)))

    def faults_left(self) -> dict:
        return json.loads(self.faults_file.read_text()) if self.faults_file.exists() else {}


@dataclass
class Network:
    vpc_id: str
    subnet_id: str
    other_subnet_id: str  # in another VPC
    ami_id: str


def make_network(ec2) -> Network:
    vpc = ec2.create_vpc(CidrBlock="10.50.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.50.0.0/20", AvailabilityZone=ZONE)["Subnet"]["SubnetId"]
    other_vpc = ec2.create_vpc(CidrBlock="10.60.0.0/16")["Vpc"]["VpcId"]
    other = ec2.create_subnet(VpcId=other_vpc, CidrBlock="10.60.0.0/20", AvailabilityZone=ZONE)["Subnet"]["SubnetId"]
    add_nat_route(ec2, vpc, subnet)  # the nodes' way to Secrets Manager (checked before `cluster up`)
    images = ec2.describe_images(Filters=[{"Name": "architecture", "Values": ["x86_64"]}])["Images"]
    return Network(vpc, subnet, other, sorted(i["ImageId"] for i in images)[0])


def example_config(network: Network, **changes) -> dict:
    """examples/aws-p5.yaml with moto's VPC and subnet, then `changes` (top-level keys) applied."""
    config = yaml.safe_load((REPO / "examples" / "aws-p5.yaml").read_text())
    config["aws"] |= {"vpc_id": network.vpc_id, "subnet_id": network.subnet_id}
    config.update(changes)
    return config


def small_config(network: Network, name: str, cpu_type: str, *groups: dict, **changes) -> dict:
    """example_config with a small head (m7i.large), one static node `cpu-1` of `cpu_type`, then
    `groups`, no partitions of its own, then `changes`."""
    groups = ({"name": "cpu", "count": 1, "instance_type": cpu_type}, *groups)
    head = {"instance_type": "m7i.large"}
    return example_config(network, cluster_name=name, head=head, node_groups=list(groups), partitions=[], **changes)


def run_cb(moto: Moto, state_dir: Path, config: dict | Path, *args: str, check: bool = True, timeout: int = 120):
    """The real CLI as a subprocess against the moto server."""
    return run_cli(moto.env, state_dir, config, *args, check=check, timeout=timeout)


def provisioned(moto: Moto, state_dir: Path, ami_id: str, config: dict):
    """A cluster provisioned once (`cluster up --provision-only`) for a test module, then removed:
    yields what the module's tests need; the fixture's body is `yield from provisioned(...)`."""
    from clusterbake.images.store import write_aws_record
    from clusterbake.state import StateDir

    write_aws_record(StateDir(state_dir), ami_id, REGION)
    first = run_cb(moto, state_dir, config, "cluster", "up", "--provision-only")
    yield {
        "state_dir": state_dir,
        "config": config,
        "first": first,
        "path": state_dir / f"{config['cluster_name']}.yaml",
    }
    run_cb(moto, state_dir, config, "cluster", "down")


def inventory(moto: Moto, state_dir: Path, config_path: Path, **env: str) -> dict:
    return run_inventory("aws_ec2.py", moto.env, state_dir, config_path, **env)


def live_instances(ec2, cluster: str) -> list[dict]:
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": "tag:clusterbake:cluster", "Values": [cluster]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
        ]
    )
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def tag_map(resource: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def moto_server(root: Path, **server_env: str) -> Iterator[Moto]:
    """Start tests/aws/moto_ec2_server.py on a free port of 127.0.0.1; stop it at the end."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # The environment of the code under test (CLI and inventory subprocesses).
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    capacity_file = root / "capacity.json"
    (root / "console").mkdir(exist_ok=True)
    log_path = root / "moto.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [sys.executable, str(HERE / "moto_ec2_server.py"), "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **env,
                "MOTO_CAPACITY_FILE": str(capacity_file),
                "MOTO_FAULTS_FILE": str(root / "faults.json"),
                "MOTO_CONSOLE_DIR": str(root / "console"),
                "MOTO_QUOTAS_FILE": str(root / "quotas.json"),
                "MOTO_TOPOLOGY_FILE": str(root / "topology.json"),
                **server_env,
            },
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"moto server did not start: {log_path.read_text()}") from None
                    time.sleep(0.1)
            yield Moto(
                url, capacity_file, env, root / "console", root / "faults.json", root / "quotas.json",
                root / "topology.json",
            )  # fmt: skip
        finally:
            stop_server(server)


ACCOUNT = "123456789012"  # moto's account


@dataclass
class Authorizing:
    """A moto server with IAM authorization on (after the three requests that make its administrator)."""

    moto: Moto
    admin: dict[str, str]  # the administrator's access key (boto3 keyword arguments)

    def client(self, service: str, **credentials):
        """A client as the administrator, or as `credentials`."""
        return boto3.client(service, region_name=REGION, endpoint_url=self.moto.url, **(credentials or self.admin))

    @property
    def admin_env(self) -> dict[str, str]:
        """The CLI's environment as the administrator."""
        return {**self.moto.env, "AWS_ACCESS_KEY_ID": self.admin["aws_access_key_id"],
                "AWS_SECRET_ACCESS_KEY": self.admin["aws_secret_access_key"]}  # fmt: skip

    def user(self, name: str, policy: dict) -> dict[str, str]:
        """An IAM user held to `policy`: the CLI's environment with its access key."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName=name, PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return {
            **self.moto.env,
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }

    def session(self, name: str, policy: dict) -> dict:
        """A role `name` with `policy`, assumable by the administrator: its session's credentials."""
        admin_arn = f"arn:aws:iam::{ACCOUNT}:user/admin"
        trust = {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"AWS": admin_arn}, "Action": "sts:AssumeRole"}
        ]}  # fmt: skip
        roles = self.client("iam")
        roles.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))
        roles.put_role_policy(RoleName=name, PolicyName=name, PolicyDocument=json.dumps(policy))
        found = self.client("sts").assume_role(RoleArn=f"arn:aws:iam::{ACCOUNT}:role/{name}", RoleSessionName=name)
        credentials = found["Credentials"]
        return {
            "aws_access_key_id": credentials["AccessKeyId"],
            "aws_secret_access_key": credentials["SecretAccessKey"],
            "aws_session_token": credentials["SessionToken"],
        }


@contextmanager
def authorizing_server(root: Path) -> Iterator[Authorizing]:
    root.mkdir(parents=True, exist_ok=True)
    with moto_server(root, INITIAL_NO_AUTH_ACTION_COUNT="3") as server:
        setup = server.client("iam")
        setup.create_user(UserName="admin")
        everything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        setup.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=json.dumps(everything))
        key = setup.create_access_key(UserName="admin")["AccessKey"]
        yield Authorizing(
            server, {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}
        )
