"""The saved DescribeInstanceTypes data (tests/unit/data/aws-instance-types.json) is moto's."""

from __future__ import annotations

import json
from pathlib import Path

from clusterbake.gpu_systems import has_nvswitch
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


def test_nvswitch_types_by_exact_name(moto):
    """NVSwitch systems need the fabric manager (clusterbake.gpu_systems): by exact type, since
    p5.4xlarge (one H100) has none; every listed AWS type exists with 8 GPUs in moto's data."""
    nvswitch = ["p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge"]
    infos = Catalogue(moto.ec2()).get([*nvswitch, "p5.4xlarge", "g5.48xlarge", "g6e.48xlarge", "c7i.large"])
    assert [name for name, info in infos.items() if info.nvswitch] == nvswitch
    assert all(sum(count for _, count in infos[name].gpus) == 8 for name in nvswitch)
    assert has_nvswitch("azure", "Standard_ND96isr_H100_v5") and not has_nvswitch("azure", "Standard_NC24ads_A100_v4")
    assert not has_nvswitch("aws", "Standard_ND96isr_H100_v5")
