"""A node group that cannot be launched leaves nothing of the run behind.

The failure is moto-side and real as far as the client can tell: the test server
(moto_ec2_server.py) answers RunInstances with EC2's InsufficientInstanceCapacity
error once an instance type's capacity is used up, so the CLI subprocess gets the
same error response a real Availability Zone sends.
"""

from __future__ import annotations

import pytest
from awstest import REGION, ZONE, live_instances, run_cb, small_config, tag_map

from clusterbake.images.store import write_aws_record
from clusterbake.state import StateDir


@pytest.fixture
def capacity(moto):
    """Allow `extra` more non-terminated instances of a type than the server holds now."""

    def limit(instance_type: str, extra: int) -> None:
        used = sum(
            1
            for r in moto.ec2().describe_instances(
                Filters=[
                    {"Name": "instance-type", "Values": [instance_type]},
                    {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
                ]
            )["Reservations"]
            for _ in r["Instances"]
        )
        moto.limit_capacity({instance_type: used + extra})

    yield limit
    moto.limit_capacity(None)


def _config(network, name, gpu_count):
    gpu = {"name": "gpu", "count": gpu_count, "instance_type": "p4d.24xlarge", "efa": True}
    return small_config(network, name, "c7i.large", gpu)


def test_capacity_error_midway_terminates_everything_this_run_launched(moto, network, tmp_path, capacity):
    write_aws_record(StateDir(tmp_path), network.ami_id, REGION)
    config = _config(network, "capfail", gpu_count=2)
    capacity("p4d.24xlarge", 1)  # gpu-1 fits, gpu-2 does not
    result = run_cb(moto, tmp_path, config, "cluster", "up", "--provision-only", check=False)
    assert result.returncode == 1, result.stderr
    message = result.stderr
    assert f"node group gpu: could not launch 2 x p4d.24xlarge in {ZONE} (1 launched before the failure)" in message
    assert "InsufficientInstanceCapacity" in message
    assert "terminated the 3 instance(s) this run launched" in message  # head, cpu-1, gpu-1
    assert "Traceback" not in message
    ec2 = moto.ec2()
    assert live_instances(ec2, "capfail") == []
    # The group's resources stay for the next try; `cluster down` removes them.
    tagged = [{"Name": "tag:clusterbake:cluster", "Values": ["capfail"]}]
    assert len(ec2.describe_launch_templates(Filters=tagged)["LaunchTemplates"]) == 3
    down = run_cb(moto, tmp_path, config, "cluster", "down")
    assert "removed security group clusterbake-capfail" in down.stderr
    assert ec2.describe_security_groups(Filters=tagged)["SecurityGroups"] == []


def test_a_vcpu_quota_is_said_as_a_capacity_problem_with_what_to_try(moto, network, tmp_path):
    write_aws_record(StateDir(tmp_path), network.ami_id, REGION)
    config = _config(network, "quota", gpu_count=1)
    moto.limit_capacity({"p4d.24xlarge": {"count": 0, "code": "VcpuLimitExceeded"}})
    try:
        result = run_cb(moto, tmp_path, config, "cluster", "up", "--provision-only", check=False)
    finally:
        moto.limit_capacity(None)
    assert result.returncode == 1
    assert "VcpuLimitExceeded: You have requested more vCPU capacity than your current vCPU limit" in result.stderr
    assert "try again later, another subnet (Availability Zone), a capacity reservation" in result.stderr
    assert live_instances(moto.ec2(), "quota") == []
    run_cb(moto, tmp_path, config, "cluster", "down")


def test_failed_growth_keeps_the_nodes_that_existed_before(moto, network, tmp_path, capacity):
    write_aws_record(StateDir(tmp_path), network.ami_id, REGION)
    run_cb(moto, tmp_path, _config(network, "grow", gpu_count=1), "cluster", "up", "--provision-only")
    ec2 = moto.ec2()
    before = {tag_map(i)["clusterbake:name"]: i["InstanceId"] for i in live_instances(ec2, "grow")}
    assert sorted(before) == ["cpu-1", "gpu-1", "head"]

    capacity("p4d.24xlarge", 1)  # gpu-2 fits, gpu-3 does not
    grown = _config(network, "grow", gpu_count=3)
    result = run_cb(moto, tmp_path, grown, "cluster", "up", "--provision-only", check=False)
    assert result.returncode == 1
    assert "could not launch 2 x p4d.24xlarge" in result.stderr and "(1 launched before the failure)" in result.stderr
    assert "terminated the 1 instance(s) this run launched" in result.stderr
    after = {tag_map(i)["clusterbake:name"]: i["InstanceId"] for i in live_instances(ec2, "grow")}
    assert after == before
    run_cb(moto, tmp_path, grown, "cluster", "down")
    assert live_instances(ec2, "grow") == []
