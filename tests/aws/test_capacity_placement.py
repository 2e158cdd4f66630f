"""A capacity reservation in a cluster placement group of the user's own, end to end against moto_server:
the real CLI as a subprocess, the launch templates and placement groups read back with boto3.

Hardware review item 15: every EFA group got a new placement group, so an On-Demand Capacity
Reservation made in a cluster placement group (as EC2 recommends for one) could not be used:
EC2 matches a reservation by the instance's placement group too.
"""

from __future__ import annotations

import pytest
from awstest import example_config, provisioned

CLUSTER = "odcrdemo"
EXISTING = "team-odcr-pg"


@pytest.fixture(scope="module")
def odcr(moto, network, tmp_path_factory):
    ec2 = moto.ec2()
    ec2.create_placement_group(GroupName=EXISTING, Strategy="cluster")  # the user's, made with the reservation
    gpu = {"name": "gpu", "count": 1, "instance_type": "p5.48xlarge", "efa": True,
           "capacity_reservation_id": "cr-0123456789abcdef0", "placement_group": EXISTING}  # fmt: skip
    plain = {"name": "cr", "count": 1, "instance_type": "p5.48xlarge", "efa": True,
             "capacity_reservation_id": "cr-0fedcba9876543210"}  # fmt: skip
    config = example_config(network, cluster_name=CLUSTER, node_groups=[gpu, plain], partitions=[])
    yield from provisioned(moto, tmp_path_factory.mktemp("state-odcr"), network.ami_id, config)
    assert [g["GroupName"] for g in ec2.describe_placement_groups()["PlacementGroups"] if g["GroupName"] == EXISTING]
    ec2.delete_placement_group(GroupName=EXISTING)


def _template(ec2, name: str) -> dict:
    (template,) = ec2.describe_launch_templates(LaunchTemplateNames=[name])["LaunchTemplates"]
    versions = ec2.describe_launch_template_versions(
        LaunchTemplateId=template["LaunchTemplateId"], Versions=["$Latest"]
    )
    return versions["LaunchTemplateVersions"][0]["LaunchTemplateData"]


def test_the_reservations_own_placement_group_is_used_as_it_is(moto, odcr):
    ec2 = moto.ec2()
    data = _template(ec2, f"clusterbake-{CLUSTER}-gpu")
    assert data["Placement"] == {"GroupName": EXISTING}
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}
    }
    tagged = ec2.describe_placement_groups(Filters=[{"Name": "tag:clusterbake:cluster", "Values": [CLUSTER]}])
    assert tagged["PlacementGroups"] == []  # none made: not for the named one, not for the reservation's group


def test_a_reservation_without_a_named_group_launches_outside_any(moto, odcr):
    data = _template(moto.ec2(), f"clusterbake-{CLUSTER}-cr")
    assert "Placement" not in data
    assert data["CapacityReservationSpecification"]["CapacityReservationTarget"]["CapacityReservationId"] == (
        "cr-0fedcba9876543210"
    )
