"""Capacity reservations end to end against moto_server with the EC2 twin's reservations (which refuse
launches EC2 refuses): the real CLI as a subprocess, the launch templates, placement groups and
instances read back with boto3.

Hardware review item 15: every EFA group got a new placement group, so an On-Demand Capacity
Reservation made in a cluster placement group (as EC2 recommends for one) could not be used:
EC2 matches a reservation by the instance's placement group too. Realcloud review A1: a
Capacity Block could not be used at all (no MarketType capacity-block), and any `cr-` id was
taken without a look.
"""

from __future__ import annotations

import datetime

import pytest
from awstest import REGION, ZONE, example_config, live_instances, provisioned
from clitest import assert_up_refused

from clusterbake.images.store import write_aws_record
from clusterbake.state import StateDir

CLUSTER = "odcrdemo"
EXISTING = "team-odcr-pg"


def odcr(ec2, instance_type="p5.48xlarge", count=1, placement_group=None, zone=ZONE) -> str:
    """An On-Demand Capacity Reservation (targeted), in `placement_group` when one is named."""
    extra = {"PlacementGroupArn": f"arn:aws:ec2:{REGION}:123456789012:placement-group/{placement_group}"}
    made = ec2.create_capacity_reservation(
        InstanceType=instance_type, InstancePlatform="Linux/UNIX", AvailabilityZone=zone, InstanceCount=count,
        InstanceMatchCriteria="targeted", **(extra if placement_group else {}),
    )  # fmt: skip
    return made["CapacityReservation"]["CapacityReservationId"]


def capacity_block(ec2, instance_type="p5.48xlarge", count=1, **offer) -> dict:
    """A Capacity Block bought the way the User Guide does: an offering in the subnet's zone, purchased."""
    offerings = ec2.describe_capacity_block_offerings(
        InstanceType=instance_type, InstanceCount=count, CapacityDurationHours=24, **offer
    )["CapacityBlockOfferings"]
    offering = next(o for o in offerings if o["AvailabilityZone"] == ZONE)
    return ec2.purchase_capacity_block(
        CapacityBlockOfferingId=offering["CapacityBlockOfferingId"], InstancePlatform="Linux/UNIX"
    )["CapacityReservation"]


@pytest.fixture(scope="module")
def reserved(moto, network, tmp_path_factory):
    ec2 = moto.ec2()
    ec2.create_placement_group(GroupName=EXISTING, Strategy="cluster")  # the user's, made with the reservation
    ids = {"gpu": odcr(ec2, placement_group=EXISTING), "cr": odcr(ec2), "block": capacity_block(ec2, count=2)}
    gpu = {"name": "gpu", "count": 1, "instance_type": "p5.48xlarge", "efa": True,
           "capacity_reservation_id": ids["gpu"], "placement_group": EXISTING}  # fmt: skip
    plain = {"name": "cr", "count": 1, "instance_type": "p5.48xlarge", "efa": True,
             "capacity_reservation_id": ids["cr"]}  # fmt: skip
    block = {"name": "block", "count": 2, "instance_type": "p5.48xlarge", "efa": True,
             "capacity_reservation_id": ids["block"]["CapacityReservationId"]}  # fmt: skip
    config = example_config(network, cluster_name=CLUSTER, node_groups=[gpu, plain, block], partitions=[])
    for made in provisioned(moto, tmp_path_factory.mktemp("state-odcr"), network.ami_id, config):
        yield {**made, "ids": ids}
    assert [g["GroupName"] for g in ec2.describe_placement_groups()["PlacementGroups"] if g["GroupName"] == EXISTING]
    ec2.delete_placement_group(GroupName=EXISTING)
    for name in ("gpu", "cr"):
        ec2.cancel_capacity_reservation(CapacityReservationId=ids[name])


def _template(ec2, name: str) -> dict:
    (template,) = ec2.describe_launch_templates(LaunchTemplateNames=[name])["LaunchTemplates"]
    versions = ec2.describe_launch_template_versions(
        LaunchTemplateId=template["LaunchTemplateId"], Versions=["$Latest"]
    )
    return versions["LaunchTemplateVersions"][0]["LaunchTemplateData"]


def _target(reservation_id: str) -> dict:
    return {"CapacityReservationTarget": {"CapacityReservationId": reservation_id}}


def test_the_reservations_own_placement_group_is_used_as_it_is(moto, reserved):
    ec2 = moto.ec2()
    data = _template(ec2, f"clusterbake-{CLUSTER}-gpu")
    assert data["Placement"] == {"GroupName": EXISTING}
    assert data["CapacityReservationSpecification"] == _target(reserved["ids"]["gpu"])
    tagged = ec2.describe_placement_groups(Filters=[{"Name": "tag:clusterbake:cluster", "Values": [CLUSTER]}])
    assert tagged["PlacementGroups"] == []  # none made: not for the named one, not for the reservations' groups


def test_a_reservation_without_a_named_group_launches_outside_any(moto, reserved):
    data = _template(moto.ec2(), f"clusterbake-{CLUSTER}-cr")
    assert "Placement" not in data
    assert data["CapacityReservationSpecification"] == _target(reserved["ids"]["cr"])


def test_a_capacity_blocks_nodes_launch_with_its_market_type_into_it(moto, reserved):
    """The twin refuses a launch into a block without MarketType capacity-block: these instances exist,
    so the template had it."""
    ec2 = moto.ec2()
    block_id = reserved["ids"]["block"]["CapacityReservationId"]
    data = _template(ec2, f"clusterbake-{CLUSTER}-block")
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert "Placement" not in data
    assert data["CapacityReservationSpecification"] == _target(block_id)
    in_block = [i for i in live_instances(ec2, CLUSTER) if i.get("CapacityReservationId") == block_id]
    assert len(in_block) == 2
    assert {i["InstanceLifecycle"] for i in in_block} == {"capacity-block"}
    (seen,) = ec2.describe_capacity_reservations(CapacityReservationIds=[block_id])["CapacityReservations"]
    assert seen["AvailableInstanceCount"] == 0


def _refusal_cases(ec2) -> dict:
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3)
    p5 = {"name": "gpu", "count": 1, "instance_type": "p5.48xlarge"}
    scheduled = capacity_block(ec2, StartDateRange=later)["CapacityReservationId"]
    block = capacity_block(ec2, count=1)["CapacityReservationId"]
    in_group = odcr(ec2, placement_group=EXISTING)
    return {
        "unknown": ({**p5, "capacity_reservation_id": "cr-0123456789abcdef0"},
                    "node_groups.0.capacity_reservation_id: no capacity reservation cr-0123456789abcdef0"),
        "other-type": ({**p5, "capacity_reservation_id": odcr(ec2, "p4d.24xlarge")}, "holds p4d.24xlarge, not the"),
        "other-zone": ({**p5, "capacity_reservation_id": odcr(ec2, zone="us-east-1b")},
                       "is in us-east-1b, but aws.subnet_id is in us-east-1a"),
        "too-small": ({**p5, "count": 2, "capacity_reservation_id": odcr(ec2)}, "holds 1 instances; the group has 2"),
        "scheduled": ({**p5, "capacity_reservation_id": scheduled}, f"{scheduled} starts at"),
        "elastic-block": ({"name": "gpu", "min_count": 0, "max_count": 1, "instance_type": "p5.48xlarge",
                           "capacity_reservation_id": block}, "is a Capacity Block, paid for the whole block"),
        "block-in-our-group": ({**p5, "placement_group": True, "capacity_reservation_id": block},
                               "node_groups.0.placement_group: EC2 places a Capacity Block's instances itself"),
        "outside-its-group": ({**p5, "capacity_reservation_id": in_group},
                              f"is in placement group {EXISTING}; instances outside it do not match"),
    }  # fmt: skip


def test_a_reservation_ec2_would_not_launch_into_is_refused_before_anything_is_made(
    moto, network, tmp_path, monkeypatch, reserved
):
    """Each refusal names the field and what to do; nothing of the cluster exists afterwards."""
    ec2 = moto.ec2()
    for case, (group, expected) in _refusal_cases(ec2).items():
        name = "cr" + "".join(c for c in case if c.isalpha())[:20]
        state = tmp_path / case
        write_aws_record(StateDir(state), network.ami_id, REGION)
        config = example_config(network, cluster_name=name, node_groups=[group], partitions=[])
        assert_up_refused(moto.env, state, config, 2, expected, monkeypatch, in_subprocess=False, timeout=120)
        tagged = [{"Name": "tag:clusterbake:cluster", "Values": [name]}]
        assert ec2.describe_launch_templates(Filters=tagged)["LaunchTemplates"] == [], case
        assert ec2.describe_instances(Filters=tagged)["Reservations"] == [], case
