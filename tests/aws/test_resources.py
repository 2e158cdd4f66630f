"""Security group and launch template upkeep, in-process against the moto_server."""

from __future__ import annotations

import json
from pathlib import Path

from clusterbake.providers.aws import resources, tags
from clusterbake.providers.aws.catalogue import Catalogue

DATA = Path(__file__).resolve().parents[1] / "unit" / "data" / "aws-instance-types.json"
P5 = Catalogue.from_response(json.loads(DATA.read_text()))["p5.48xlarge"]


def _ssh_cidrs(ec2, group_id):
    [group] = ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
    return sorted(
        r.get("CidrIp") or r.get("CidrIpv6")
        for p in group["IpPermissions"]
        if p["IpProtocol"] == "tcp" and p.get("FromPort") == 22
        for r in p.get("IpRanges", []) + p.get("Ipv6Ranges", [])
    )


def test_security_group_follows_ssh_cidrs(moto, network):
    ec2 = moto.ec2()
    group_id, created = resources.ensure_security_group(ec2, "sgtest", network.vpc_id, ["198.51.100.0/24"])
    assert created and _ssh_cidrs(ec2, group_id) == ["198.51.100.0/24"]
    again, created = resources.ensure_security_group(ec2, "sgtest", network.vpc_id, ["203.0.113.7/32", "2001:db8::/32"])
    assert again == group_id and not created
    assert _ssh_cidrs(ec2, group_id) == ["2001:db8::/32", "203.0.113.7/32"]
    resources.delete_security_group(ec2, group_id)


def test_launch_template_gets_a_new_version_when_the_config_changes(moto, network):
    ec2 = moto.ec2()

    def data(**changes):
        return resources.template_data(
            ami_id=network.ami_id,
            info=P5,
            subnet_id=network.subnet_id,
            group_id="sg-0123456789abcdef0",
            node_tags=tags.node_tags("lttest", "compute", "gpu"),
            efa=True,
            placement_group="clusterbake-lttest-gpu",
            **changes,
        )

    first = resources.ensure_launch_template(ec2, "clusterbake-lttest-gpu", data(), "lttest")
    assert first[1:] == ("1", "created")
    assert resources.ensure_launch_template(ec2, "clusterbake-lttest-gpu", data(), "lttest") == (
        first[0],
        "1",
        "unchanged",
    )
    spot = resources.ensure_launch_template(ec2, "clusterbake-lttest-gpu", data(spot=True), "lttest")
    assert spot == (first[0], "2", "updated")
    reserved = resources.ensure_launch_template(
        ec2, "clusterbake-lttest-gpu", data(capacity_reservation_id="cr-0123456789abcdef0"), "lttest"
    )
    assert reserved == (first[0], "3", "updated")
    latest = ec2.describe_launch_template_versions(LaunchTemplateId=first[0], Versions=["$Latest"])
    stored = latest["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    assert stored["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}
    }
    assert "InstanceMarketOptions" not in stored
    resources.delete_launch_template(ec2, first[0])


def test_template_comparison_ignores_what_ec2_adds():
    desired = resources.template_data(
        ami_id="ami-0123456789abcdef0",
        info=P5,
        subnet_id="subnet-0123456789abcdef0",
        group_id="sg-0123456789abcdef0",
        node_tags=tags.node_tags("c", "compute", "gpu"),
        efa=True,
    )
    stored = json.loads(json.dumps(desired))
    stored["MetadataOptions"]["HttpPutResponseHopLimit"] = 1
    stored["NetworkInterfaces"][0]["AssociatePublicIpAddress"] = False
    stored["TagSpecifications"].append({"ResourceType": "launch-template", "Tags": []})
    assert not resources.template_differs(stored, desired)
    stored["Placement"] = {"GroupName": "other"}
    assert resources.template_differs(stored, desired)
