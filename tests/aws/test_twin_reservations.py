"""The EC2 twin's capacity reservations refuse what EC2 refuses (realcloud review A1, D1).

Plain boto3 against moto_server with the twin's additions (twins/aws/reservations.py), the
way EC2's user guide launches into an On-Demand Capacity Reservation and a Capacity Block.
moto alone launched into any `cr-` id, of any type, without the Capacity Block market type.
"""

from __future__ import annotations

import datetime

import pytest
from awstest import ZONE
from botocore.exceptions import ClientError

BLOCK_MARKET = {"MarketType": "capacity-block"}


def _target(reservation_id: str) -> dict:
    return {"CapacityReservationTarget": {"CapacityReservationId": reservation_id}}


def _block(ec2, instance_type="p5.48xlarge", count=1, zone=ZONE, **offer) -> dict:
    offerings = ec2.describe_capacity_block_offerings(
        InstanceType=instance_type, InstanceCount=count, CapacityDurationHours=24, **offer
    )["CapacityBlockOfferings"]
    offering = next(o for o in offerings if o["AvailabilityZone"] == zone)
    bought = ec2.purchase_capacity_block(CapacityBlockOfferingId=offering["CapacityBlockOfferingId"],
                                         InstancePlatform="Linux/UNIX")  # fmt: skip
    return bought["CapacityReservation"]


def _launch(ec2, network, reservation_id, instance_type="p5.48xlarge", **extra):
    return ec2.run_instances(
        ImageId=network.ami_id,
        InstanceType=instance_type,
        MinCount=1,
        MaxCount=1,
        SubnetId=network.subnet_id,
        CapacityReservationSpecification=_target(reservation_id),
        **extra,
    )["Instances"][0]


def _refused(call, code: str) -> str:
    with pytest.raises(ClientError) as caught:
        call()
    assert caught.value.response["Error"]["Code"] == code, caught.value.response["Error"]
    return caught.value.response["Error"]["Message"]


def test_a_capacity_block_launches_only_with_its_market_type_and_only_as_many_as_it_holds(moto, network):
    ec2 = moto.ec2()
    block = _block(ec2)
    assert (block["ReservationType"], block["State"], block["InstanceMatchCriteria"]) == (
        "capacity-block", "active", "targeted")  # fmt: skip
    block_id = block["CapacityReservationId"]
    message = _refused(lambda: _launch(ec2, network, block_id), "InvalidParameterCombination")
    assert "MarketType capacity-block" in message
    instance = _launch(ec2, network, block_id, InstanceMarketOptions=BLOCK_MARKET)
    described = ec2.describe_instances(InstanceIds=[instance["InstanceId"]])["Reservations"][0]["Instances"][0]
    assert described["InstanceLifecycle"] == "capacity-block"
    assert described["CapacityReservationId"] == block_id
    (seen,) = ec2.describe_capacity_reservations(CapacityReservationIds=[block_id])["CapacityReservations"]
    assert seen["AvailableInstanceCount"] == 0
    _refused(lambda: _launch(ec2, network, block_id, InstanceMarketOptions=BLOCK_MARKET), "ReservationCapacityExceeded")
    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])


def test_a_reservation_refuses_another_type_zone_or_placement(moto, network):
    ec2 = moto.ec2()
    ec2.create_placement_group(GroupName="twin-odcr-pg", Strategy="cluster")
    arn = "arn:aws:ec2:us-east-1:123456789012:placement-group/twin-odcr-pg"
    odcr = ec2.create_capacity_reservation(InstanceType="p4d.24xlarge", InstancePlatform="Linux/UNIX",
                                           AvailabilityZone=ZONE, InstanceCount=2, InstanceMatchCriteria="targeted",
                                           PlacementGroupArn=arn)["CapacityReservation"]  # fmt: skip
    odcr_id = odcr["CapacityReservationId"]
    _refused(lambda: _launch(ec2, network, odcr_id, "p5.48xlarge", Placement={"GroupName": "twin-odcr-pg"}),
             "InvalidParameterCombination")  # fmt: skip
    assert "placement group twin-odcr-pg" in _refused(
        lambda: _launch(ec2, network, odcr_id, "p4d.24xlarge"), "InvalidParameterCombination"
    )
    _refused(lambda: _launch(ec2, network, odcr_id, "p4d.24xlarge", InstanceMarketOptions=BLOCK_MARKET),
             "InvalidParameterCombination")  # fmt: skip
    other_zone = ec2.create_capacity_reservation(InstanceType="p4d.24xlarge", InstancePlatform="Linux/UNIX",
                                                 AvailabilityZone="us-east-1b", InstanceCount=1,
                                                 InstanceMatchCriteria="targeted")["CapacityReservation"]  # fmt: skip
    assert "us-east-1b" in _refused(
        lambda: _launch(ec2, network, other_zone["CapacityReservationId"], "p4d.24xlarge"),
        "InvalidParameterCombination",
    )
    instance = _launch(ec2, network, odcr_id, "p4d.24xlarge", Placement={"GroupName": "twin-odcr-pg"})
    assert "InstanceLifecycle" not in ec2.describe_instances(InstanceIds=[instance["InstanceId"]])["Reservations"][0][
        "Instances"][0]  # fmt: skip
    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    for reservation in (odcr_id, other_zone["CapacityReservationId"]):
        ec2.cancel_capacity_reservation(CapacityReservationId=reservation)
    _refused(lambda: _launch(ec2, network, odcr_id, "p4d.24xlarge", Placement={"GroupName": "twin-odcr-pg"}),
             "InvalidParameterValue")  # fmt: skip
    ec2.delete_placement_group(GroupName="twin-odcr-pg")


def test_an_unknown_or_not_yet_started_reservation_launches_nothing(moto, network):
    ec2 = moto.ec2()
    _refused(lambda: _launch(ec2, network, "cr-0123456789abcdef0"), "InvalidCapacityReservationId.NotFound")
    _refused(lambda: ec2.describe_capacity_reservations(CapacityReservationIds=["cr-0123456789abcdef0"]),
             "InvalidCapacityReservationId.NotFound")  # fmt: skip
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=2)
    block = _block(ec2, StartDateRange=later)
    assert block["State"] == "scheduled"
    assert "scheduled" in _refused(
        lambda: _launch(ec2, network, block["CapacityReservationId"], InstanceMarketOptions=BLOCK_MARKET),
        "InvalidParameterValue",
    )
    without_a_block = {"ImageId": network.ami_id, "InstanceType": "p5.48xlarge", "MinCount": 1, "MaxCount": 1,
                       "SubnetId": network.subnet_id, "InstanceMarketOptions": BLOCK_MARKET}  # fmt: skip
    _refused(lambda: ec2.run_instances(**without_a_block), "InvalidParameterCombination")
