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
            group_ids=["sg-0123456789abcdef0"],
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
        group_ids=["sg-0123456789abcdef0"],
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


def _type(name: str, cards: list[list[str]] | None, max_cards: int, max_efa: int) -> dict:
    """A DescribeInstanceTypes entry with the fields network_interfaces reads."""
    network = {"EfaSupported": True, "EfaInfo": {"MaximumEfaInterfaces": max_efa}, "MaximumNetworkCards": max_cards}
    if cards is not None:
        network["NetworkCards"] = [{"NetworkCardIndex": i, "InterfaceTypes": kinds} for i, kinds in enumerate(cards)]
    return {
        "InstanceType": name,
        "VCpuInfo": {"DefaultVCpus": 192},
        "MemoryInfo": {"SizeInMiB": 2_097_152},
        "NetworkInfo": network,
    }


def _layout(info, efa=True) -> list[tuple]:
    interfaces = resources.network_interfaces(info, efa, "subnet-0123456789abcdef0", ["sg-0123456789abcdef0"])
    assert all(i["SubnetId"] == "subnet-0123456789abcdef0" and i["DeleteOnTermination"] for i in interfaces)
    return [(i.get("NetworkCardIndex"), i["DeviceIndex"], i.get("InterfaceType")) for i in interfaces]


def test_efa_layout_follows_the_ec2_guide():
    """AWS EC2 user guide, "Maximize network bandwidth ... multiple network cards": ENA primary
    (card 0, device 0), EFA-only on card 0 device 1 and on every other EFA card at device 0."""
    assert _layout(P5) == [(0, 0, None), (0, 1, "efa-only")] + [(c, 0, "efa-only") for c in range(1, 32)]
    assert _layout(P5, efa=False) == [(None, 0, None)]
    efa = ["interface", "efa", "efa-only"]
    # P6-B300: the primary card takes no EFA; cards 1-16 each get an EFA-only interface.
    b300 = Catalogue.from_response({"InstanceTypes": [_type("p6-b300.48xlarge", [["interface"]] + [efa] * 16, 17, 16)]})
    b300 = b300["p6-b300.48xlarge"]
    assert _layout(b300) == [(0, 0, None)] + [(c, 0, "efa-only") for c in range(1, 17)]
    # No more EFA interfaces than the type allows; no InterfaceTypes in the answer: every card takes EFA.
    capped = Catalogue.from_response(
        {"InstanceTypes": [_type("x.large", [efa] * 4, 4, 2), _type("y.large", None, 2, 2)]}
    )
    assert _layout(capped["x.large"]) == [(0, 0, None), (0, 1, "efa-only"), (1, 0, "efa-only")]
    assert _layout(capped["y.large"]) == [(0, 0, None), (0, 1, "efa-only"), (1, 0, "efa-only")]
