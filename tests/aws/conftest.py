"""A real moto_server process for the aws provider's tests (nothing runs against AWS).

The server is tests/aws/moto_ec2_server.py: moto's own server plus placement groups
and an InsufficientInstanceCapacity switch (see its docstring for exactly what it
adds). The code under test finds it through the standard AWS environment
(AWS_ENDPOINT_URL, test credentials, no profile or config file).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from awstest import Moto, Network, make_network, moto_server


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
