"""What moto_server cannot show, with botocore's Stubber (requests checked against the EC2 model).

- Throttling: moto never answers RequestLimitExceeded; the backoff is tested here.
- An instance that dies while starting (EC2 moves it to `terminated` with
  Server.InsufficientInstanceCapacity after RunInstances succeeded): moto's instances
  always run.
- Placement.GroupName and EFA interfaces on a launched instance: moto does not carry
  them over from the launch template, so the inventory's placement_group hostvar is
  checked with a DescribeInstances response in EC2's shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from botocore.stub import ANY, Stubber
from stubbed import ec2_client

from clusterbake.config import ClusterConfig
from clusterbake.providers.aws import api
from clusterbake.providers.aws.catalogue import Catalogue
from clusterbake.providers.aws.launch import GroupLaunch, LaunchError, NodeLaunch, launch_groups
from clusterbake.providers.aws.provider import AwsProvider
from clusterbake.state import StateDir

DATA = Path(__file__).resolve().parents[1] / "unit" / "data" / "aws-instance-types.json"


def _instance(instance_id, state="running", **extra):
    return {"InstanceId": instance_id, "InstanceType": "p5.48xlarge", "State": {"Name": state, "Code": 16}, **extra}


def test_throttling_is_retried_with_growing_waits():
    client = ec2_client()
    sleeps = []
    with Stubber(client) as stub:
        for code in ("RequestLimitExceeded", "Throttling", "RequestLimitExceeded"):
            stub.add_client_error("describe_subnets", code, "slow down")
        stub.add_response("describe_subnets", {"Subnets": []})
        assert api.call(client.describe_subnets, sleep=sleeps.append) == {"Subnets": []}
    bounds = api.backoff_delays()
    assert len(sleeps) == 3
    assert all(bounds[n] / 2 <= s <= bounds[n] for n, s in enumerate(sleeps))
    assert bounds[:4] == [0.5, 1.0, 2.0, 4.0] and max(bounds) <= api.MAX_DELAY


def test_throttling_gives_up_after_the_last_attempt():
    client = ec2_client()
    with Stubber(client) as stub:
        for _ in range(3):
            stub.add_client_error("describe_subnets", "RequestLimitExceeded", "slow down")
        with pytest.raises(ClientError, match="RequestLimitExceeded"):
            api.call(client.describe_subnets, sleep=lambda _: None, attempts=3)


def test_capacity_errors_are_not_retried():
    client = ec2_client()
    with Stubber(client) as stub:
        # EC2 sends InsufficientInstanceCapacity as a 500: a server error, yet not one to retry.
        stub.add_client_error("run_instances", "InsufficientInstanceCapacity", "no p5 here", http_status_code=500)
        with pytest.raises(ClientError, match="InsufficientInstanceCapacity"):
            api.call(client.run_instances, sleep=pytest.fail, MinCount=1, MaxCount=1)


@pytest.mark.parametrize(("code", "status"), [("InternalError", 500), ("Unavailable", 503), ("SomethingNew", 502)])
def test_server_errors_are_retried(code, status):
    client = ec2_client()
    sleeps = []
    with Stubber(client) as stub:
        stub.add_client_error("describe_subnets", code, "try again", http_status_code=status)
        stub.add_response("describe_subnets", {"Subnets": []})
        assert api.call(client.describe_subnets, sleep=sleeps.append) == {"Subnets": []}
    assert len(sleeps) == 1


def test_client_errors_are_not_retried():
    client = ec2_client()
    with Stubber(client) as stub:
        stub.add_client_error("describe_subnets", "InvalidSubnetID.NotFound", "no such subnet", http_status_code=400)
        with pytest.raises(ClientError, match=r"InvalidSubnetID\.NotFound"):
            api.call(client.describe_subnets, sleep=pytest.fail)


def test_instance_that_dies_while_starting_rolls_the_group_back():
    client = ec2_client()
    node = NodeLaunch("gpu-1", "lt-0123456789abcdef0", "1", "#cloud-config\n", {"clusterbake:name": "gpu-1"})
    group = GroupLaunch("gpu", "p5.48xlarge", "us-east-1a", [node])
    died = _instance(
        "i-0123456789abcdef0",
        "terminated",
        StateReason={"Code": "Server.InsufficientInstanceCapacity", "Message": "Insufficient capacity."},
    )
    with Stubber(client) as stub:
        stub.add_client_error("run_instances", "RequestLimitExceeded", "slow down")
        stub.add_response(
            "run_instances",
            {"Instances": [_instance("i-0123456789abcdef0", "pending")]},
            {
                "LaunchTemplate": {"LaunchTemplateId": "lt-0123456789abcdef0", "Version": "1"},
                "MinCount": 1,
                "MaxCount": 1,
                "UserData": ANY,
                "TagSpecifications": [
                    {"ResourceType": "instance", "Tags": [{"Key": "clusterbake:name", "Value": "gpu-1"}]}
                ],
                "ClientToken": ANY,
            },
        )
        stub.add_response("describe_instances", {"Reservations": [{"Instances": [died]}]})
        stub.add_response("terminate_instances", {}, {"InstanceIds": ["i-0123456789abcdef0"]})
        stub.add_response("describe_instances", {"Reservations": [{"Instances": [died]}]})
        with pytest.raises(LaunchError) as info:
            launch_groups(client, [group], sleep=lambda _: None)
        stub.assert_no_pending_responses()
    message = str(info.value)
    assert "node group gpu: could not launch 1 x p5.48xlarge in us-east-1a (1 launched before the failure)" in message
    assert "Insufficient capacity." in message
    assert "terminated the 1 instance(s) this run launched (i-0123456789abcdef0)" in message


def test_inventory_reports_the_instances_placement_group(tmp_path):
    config = ClusterConfig.model_validate(
        {
            "cluster_name": "p5demo",
            "provider": "aws",
            "image": {"base": "ubuntu-22.04"},
            "aws": {"region": "us-east-1", "vpc_id": "vpc-0123456789abcdef0", "subnet_id": "subnet-0123456789abcdef0"},
            "head": {"instance_type": "m7i.2xlarge"},
            "node_groups": [{"name": "gpu", "count": 1, "instance_type": "p5.48xlarge", "efa": True}],
            # Only the calls that find the instances: the head's launch settings (launch templates,
            # security group) are test_elastic_provision.py's, against moto.
            "recovery": {"replace_lost_nodes": False},
        }
    )
    efa = [
        {"InterfaceType": "efa", "Attachment": {"DeviceIndex": 0 if card == 0 else 1, "NetworkCardIndex": card}}
        for card in range(32)
    ]
    instances = [
        _instance(
            "i-0000000000000000a",
            InstanceType="m7i.2xlarge",
            PrivateIpAddress="10.0.0.10",
            Placement={"AvailabilityZone": "us-east-1a", "GroupName": ""},
            Tags=[{"Key": "clusterbake:cluster", "Value": "p5demo"}, {"Key": "clusterbake:name", "Value": "head"}],
        ),
        _instance(
            "i-0000000000000000b",
            PrivateIpAddress="10.0.0.11",
            Placement={"AvailabilityZone": "us-east-1a", "GroupName": "clusterbake-p5demo-gpu"},
            NetworkInterfaces=efa,
            Tags=[{"Key": "clusterbake:cluster", "Value": "p5demo"}, {"Key": "clusterbake:name", "Value": "gpu-1"}],
        ),
    ]
    client = ec2_client()
    provider = AwsProvider(config, StateDir(tmp_path), client=client)
    provider.__dict__["catalogue"] = Catalogue.from_response(json.loads(DATA.read_text()))
    with Stubber(client) as stub:
        stub.add_response(
            "describe_instances",
            {"Reservations": [{"Instances": instances}]},
            {
                "Filters": [
                    {"Name": "tag:clusterbake:cluster", "Values": ["p5demo"]},
                    {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
                ],
                "MaxResults": 1000,
            },
        )
        # Storage defaults to NFS from the head: its exports admit the subnet's range (and the
        # planned addresses come from it).
        stub.add_response(
            "describe_subnets",
            {
                "Subnets": [
                    {
                        "SubnetId": "subnet-0123456789abcdef0",
                        "CidrBlock": "10.0.0.0/24",
                        "VpcId": "vpc-0123456789abcdef0",
                    }
                ]
            },
            {"SubnetIds": ["subnet-0123456789abcdef0"]},
        )
        # The running compute instance's place (the EC2 API reference's response shape): topology.conf.
        stub.add_response(
            "describe_instance_topology",
            {
                "Instances": [
                    {
                        "InstanceId": "i-0000000000000000b",
                        "InstanceType": "p5.48xlarge",
                        "GroupName": "clusterbake-p5demo-gpu",
                        "NetworkNodes": ["nn-1111111111EXAMPLE", "nn-2222222222EXAMPLE", "nn-3333333333EXAMPLE"],
                        "AvailabilityZone": "us-east-1a",
                        "ZoneId": "use1-az1",
                    }
                ]
            },
            {"InstanceIds": ["i-0000000000000000b"]},
        )
        inv = provider.inventory()
    assert inv["all"]["vars"]["clusterbake_topology"] == [
        {"name": "nn-3333333333EXAMPLE", "nodes": "gpu-1"},
        {"name": "nn-1111111111EXAMPLE", "switches": "nn-2222222222EXAMPLE"},
        {"name": "nn-2222222222EXAMPLE", "switches": "nn-3333333333EXAMPLE"},
    ]
    assert inv["all"]["vars"]["clusterbake_subnet_cidr"] == "10.0.0.0/24"
    hostvars = inv["_meta"]["hostvars"]
    assert hostvars["gpu-1"]["clusterbake_placement_group"] == "clusterbake-p5demo-gpu"
    assert hostvars["head"]["clusterbake_placement_group"] is None
    assert inv["efa"]["hosts"] == ["gpu-1"]
