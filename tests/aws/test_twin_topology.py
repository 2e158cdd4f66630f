"""The EC2 twin's DescribeInstanceTopology (twins/aws/topology.py), which moto lacks: plain boto3
against moto_server, in the shape of the EC2 API reference and the user guide's prerequisites."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from awstest import ZONE
from botocore.exceptions import ClientError


def _launch(ec2, network, instance_type: str, count: int) -> list[str]:
    launched = ec2.run_instances(
        ImageId=network.ami_id, InstanceType=instance_type, MinCount=count, MaxCount=count, SubnetId=network.subnet_id
    )["Instances"]
    return [i["InstanceId"] for i in launched]


def test_running_instances_of_supported_types_hang_where_the_declared_layout_puts_them(moto, network):
    moto.topology_file.write_text(json.dumps({"per_leaf": 2, "leaves_per_spine": 2}))
    ec2 = moto.ec2()
    p5 = _launch(ec2, network, "p5.48xlarge", 5)
    b200 = _launch(ec2, network, "p6-b200.48xlarge", 1)
    small = _launch(ec2, network, "t3.micro", 1)
    try:
        pages = ec2.get_paginator("describe_instance_topology").paginate(InstanceIds=p5 + b200 + small)
        found = {i["InstanceId"]: i for page in pages for i in page["Instances"]}
        assert set(found) == set(p5 + b200)  # t3 has no topology: left out, no error
        paths = [found[i]["NetworkNodes"] for i in p5]
        assert all(len(p) == 3 and p[0] == paths[0][0] for p in paths)  # one top per zone
        leaves = [p[-1] for p in paths]
        # At most 2 per leaf. Which instance gets a leaf's lone slot depends on the zone's order (one
        # call's instances share a launch time; ids then) and on what ran before on this twin.
        assert sorted(Counter(leaves).values()) == [1, 2, 2], leaves
        assert len(found[b200[0]]["NetworkNodes"]) == 4
        assert found[p5[0]]["AvailabilityZone"] == ZONE and found[p5[0]]["InstanceType"] == "p5.48xlarge"
        assert found[p5[0]]["ZoneId"].startswith("use1-az")
        # The same answer asked again (a place does not move), and by type.
        again = ec2.describe_instance_topology(Filters=[{"Name": "instance-type", "Values": ["p5.48xlarge"]}])
        assert {i["InstanceId"]: i["NetworkNodes"] for i in again["Instances"]} == dict(zip(p5, paths, strict=True))
    finally:
        ec2.terminate_instances(InstanceIds=p5 + b200 + small)
        moto.topology_file.unlink()


def test_more_than_100_ids_or_max_results_with_ids_are_refused(moto):
    ec2 = moto.ec2()
    with pytest.raises(ClientError) as caught:
        ec2.describe_instance_topology(InstanceIds=["i-0123456789abcdef0"], MaxResults=10)
    assert caught.value.response["Error"]["Code"] == "InvalidParameterCombination"
    with pytest.raises(ClientError) as caught:
        ec2.describe_instance_topology(InstanceIds=[f"i-{n:017x}" for n in range(101)])
    assert caught.value.response["Error"]["Code"] == "InvalidParameterValue"
