"""A real moto_server process for the aws provider's tests (nothing runs against AWS).

The server is tests/aws/moto_ec2_server.py: moto's own server plus placement groups
and an InsufficientInstanceCapacity switch (see its docstring for exactly what it
adds). The code under test finds it through the standard AWS environment
(AWS_ENDPOINT_URL, test credentials, no profile or config file).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from awstest import HERE, REGION, ZONE, Moto, Network
from clitest import stop_server


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
                "MOTO_CONSOLE_DIR": str(root / "console"),
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
            yield Moto(url, capacity_file, env, root / "console")
        finally:
            stop_server(server)


def make_network(ec2) -> Network:
    vpc = ec2.create_vpc(CidrBlock="10.50.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.50.0.0/20", AvailabilityZone=ZONE)["Subnet"]["SubnetId"]
    other_vpc = ec2.create_vpc(CidrBlock="10.60.0.0/16")["Vpc"]["VpcId"]
    other = ec2.create_subnet(VpcId=other_vpc, CidrBlock="10.60.0.0/20", AvailabilityZone=ZONE)["Subnet"]["SubnetId"]
    images = ec2.describe_images(Filters=[{"Name": "architecture", "Values": ["x86_64"]}])["Images"]
    return Network(vpc, subnet, other, sorted(i["ImageId"] for i in images)[0])


@pytest.fixture(scope="session")
def moto(tmp_path_factory) -> Iterator[Moto]:
    """The server most tests share."""
    with moto_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="session")
def network(moto) -> Network:
    return make_network(moto.ec2())


@pytest.fixture
def own_moto(tmp_path_factory) -> Iterator[tuple[Moto, str]]:
    """A server of its own for a test whose thousand instances would slow the others down,
    without moto's ~1,300 default AMIs (every RunInstances filters through them); its one
    AMI is registered here. Yields the server and that AMI's id."""
    with moto_server(tmp_path_factory.mktemp("moto-own"), MOTO_EC2_LOAD_DEFAULT_AMIS="false") as server:
        image = server.ec2().register_image(Name="clusterbake-test", RootDeviceName="/dev/sda1")
        yield server, image["ImageId"]
