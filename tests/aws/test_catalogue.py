"""The saved DescribeInstanceTypes data (tests/unit/data/aws-instance-types.json) is moto's."""

from __future__ import annotations

import json
from pathlib import Path

from clusterbake.providers.aws.catalogue import Catalogue

DATA = Path(__file__).resolve().parents[1] / "unit" / "data" / "aws-instance-types.json"


def test_saved_instance_types_are_what_moto_returns(moto):
    saved = json.loads(DATA.read_text())["InstanceTypes"]
    names = [t["InstanceType"] for t in saved]
    live = moto.ec2().describe_instance_types(InstanceTypes=names)["InstanceTypes"]
    assert sorted(live, key=lambda t: t["InstanceType"]) == saved


def test_catalogue_from_moto(moto):
    catalogue = Catalogue(moto.ec2())
    infos = catalogue.get(["p5.48xlarge", "p4d.24xlarge", "c7i.large"])
    assert (infos["p5.48xlarge"].efa_interfaces, infos["p4d.24xlarge"].efa_interfaces) == (32, 4)
    assert infos["c7i.large"].efa_interfaces == 0 and infos["c7i.large"].gres == []
    assert infos["p4d.24xlarge"].gres == ["gpu:a100:8"]
