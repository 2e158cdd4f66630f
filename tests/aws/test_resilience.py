"""AWS's transient failures, injected by the EC2 twin's moto over real HTTP (moto_ext FAULTS: a 5xx
in the service's own format, a connection closed before any answer): every call retries them
(api.call), so `cluster up` and `cluster down` ride them out (realcloud review A3). The retry
policy's own details (which codes, the waits) are tests/aws/test_stubbed.py's.
"""

from __future__ import annotations

import time

import boto3
import programs
import pytest
from awstest import REGION, REPO, live_instances, run_cb, small_config
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError

from clusterbake.errors import ClusterbakeError
from clusterbake.images.store import write_aws_record
from clusterbake.providers.aws import api, launch
from clusterbake.providers.aws.launch import NodeLaunch
from clusterbake.state import StateDir


@pytest.fixture
def aws_env(moto, monkeypatch):
    """This process's AWS clients (api.client) talk to the moto server."""
    for key, value in moto.env.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def faults(moto):
    yield moto.inject_faults
    moto.inject_faults(None)


def test_the_twin_drops_a_connection_and_answers_a_5xx_as_ec2_does(moto, faults):
    # botocore retries by itself in a plain client: not here, to see what the twin did.
    plain = boto3.client(
        "ec2",
        region_name=REGION,
        endpoint_url=moto.url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"total_max_attempts": 1}),
    )
    faults({"DescribeSubnets": {"fault": "drop", "times": 1}})
    with pytest.raises(ConnectionClosedError):
        plain.describe_subnets()
    faults({"DescribeSubnets": {"fault": "InternalError", "times": 1}})
    with pytest.raises(ClientError, match="InternalError") as failed:
        plain.describe_subnets()
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert moto.faults_left() == {}
    plain.describe_subnets()  # no fault left


def test_every_call_retries_a_5xx_and_a_dropped_connection(moto, faults, aws_env):
    client = api.ec2_client(REGION)
    faults({"DescribeVpcs": {"fault": "drop", "times": 2}, "DescribeSubnets": {"fault": "Unavailable", "times": 3}})
    sleeps: list[float] = []
    assert "Vpcs" in api.call(client.describe_vpcs, sleep=sleeps.append)
    assert "Subnets" in api.call(client.describe_subnets, sleep=sleeps.append)
    assert len(sleeps) == 5 and moto.faults_left() == {}


def test_cluster_up_and_down_ride_out_a_fault_on_each_api_they_call(moto, network, tmp_path, faults):
    """The first call of every action `cluster up` and `cluster down` make fails once: a dropped connection, a
    5xx or throttling, the actions taking the three in turn (each kind's retry: the test above)."""
    write_aws_record(StateDir(tmp_path), network.ami_id, REGION)
    name = "flaky"
    config = small_config(network, name, "c7i.large")
    every = {"*": {"faults": ["drop", "InternalError", "RequestLimitExceeded"], "times": 1}}
    faults(every)
    up = run_cb(moto, tmp_path, config, "cluster", "up", "--provision-only", timeout=300)
    hit = sorted(moto.faults_left()["*"]["seen"])
    assert {"RunInstances", "CreateSecurityGroup", "CreateLaunchTemplate", "CreateRole"} <= set(hit), hit
    assert len(hit) >= 9, hit  # each kind on several actions
    assert len(live_instances(moto.ec2(), name)) == 2, up.stderr  # head and cpu-1
    faults(every)
    run_cb(moto, tmp_path, config, "cluster", "down", timeout=300)
    assert {"TerminateInstances", "DeleteSecurityGroup"} <= set(moto.faults_left()["*"]["seen"])
    assert live_instances(moto.ec2(), name) == []


def test_a_nodes_bundle_fetch_rides_out_dropped_connections_and_5xx(moto, faults, aws_env, capsys):
    """realcloud review C1: the node's boot program keeps trying Secrets Manager when it does not
    answer (botocore's own 5 attempts used up), logging why each time, instead of giving up."""
    # Not the name the cluster test above makes and force-deletes: the twin holds a deleted name a while.
    moto.client("secretsmanager").create_secret(Name="clusterbake/flakyboot/join/cpu", SecretString='{"bundle": 1}')
    boot = programs.load_program(
        "clusterbake_node_boot", REPO / "roles" / "cloud_boot" / "files" / "clusterbake-node-boot"
    )
    source = {"secret_id": "clusterbake/flakyboot/join/cpu", "region": REGION, "endpoint_url": moto.url}
    faults({"GetSecretValue": {"fault": "drop", "times": 7}})
    assert boot.aws_secret(source, metadata=None) == '{"bundle": 1}'
    faults({"GetSecretValue": {"fault": "InternalError", "times": 6}})
    assert boot.aws_secret(source, metadata=None) == '{"bundle": 1}'
    assert moto.faults_left() == {}
    err = capsys.readouterr().err
    assert "waiting for Secrets Manager (secret clusterbake/flakyboot/join/cpu): Connection was closed" in err
    assert "waiting for Secrets Manager (secret clusterbake/flakyboot/join/cpu): InternalError" in err


def _node_at(ec2, network, address: str, name: str) -> NodeLaunch:
    template = ec2.create_launch_template(
        LaunchTemplateName=f"held-{name}", LaunchTemplateData={"ImageId": network.ami_id, "InstanceType": "c7i.large"}
    )["LaunchTemplate"]["LaunchTemplateId"]
    interfaces = [
        {"DeviceIndex": 0, "SubnetId": network.subnet_id, "PrivateIpAddress": address, "DeleteOnTermination": True}
    ]
    return NodeLaunch(name, template, "1", "#cloud-config\n", {"clusterbake:name": name}, interfaces)


def test_a_terminated_instances_address_is_held_a_while_and_the_launch_waits_it_out(moto, network, aws_env):
    """realcloud review A5: EC2 releases an instance's interface only once it has shut down; a
    node's replacement at its address (after a rollback, a replaced node) waits for it."""
    ec2 = moto.ec2()
    address = "10.50.15.201"
    # As clusterbake launches: the interface goes with the instance.
    interface = {
        "DeviceIndex": 0,
        "SubnetId": network.subnet_id,
        "PrivateIpAddress": address,
        "DeleteOnTermination": True,
    }
    launch_at = {"ImageId": network.ami_id, "MinCount": 1, "MaxCount": 1, "NetworkInterfaces": [interface]}
    first = ec2.run_instances(**launch_at)["Instances"][0]["InstanceId"]
    ec2.terminate_instances(InstanceIds=[first])
    with pytest.raises(ClientError, match=r"InvalidIPAddress\.InUse"):
        ec2.run_instances(**launch_at)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)

    instance = launch._run_one(api.ec2_client(REGION), _node_at(ec2, network, address, "held-1"), "t1", sleep=sleep)
    assert instance["PrivateIpAddress"] == address and sleeps  # it waited
    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])


def test_an_address_another_interface_holds_fails_at_once_naming_it(moto, network, aws_env):
    """Every interface's address counts (an EFS mount target's, any ENI's), and one that is not an
    instance going away is not waited for."""
    ec2 = moto.ec2()
    address = "10.50.15.202"
    eni = ec2.create_network_interface(SubnetId=network.subnet_id, PrivateIpAddress=address, Description="someone's")
    eni_id = eni["NetworkInterface"]["NetworkInterfaceId"]
    try:
        with pytest.raises(ClusterbakeError, match=f"held-2: its planned address {address} is taken by {eni_id}"):
            launch._run_one(api.ec2_client(REGION), _node_at(ec2, network, address, "held-2"), "t2", sleep=pytest.fail)
    finally:
        ec2.delete_network_interface(NetworkInterfaceId=eni_id)
