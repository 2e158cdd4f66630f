"""slurm.conf for a p5.48xlarge node group, from the AWS inventory (golden file).

The inventory is built by the aws provider's own code (provider.aws_inventory) from
examples/aws-p5.yaml, two running p5 instances and the head, with the instance types
from tests/unit/data/aws-instance-types.json: moto 5.2.5's DescribeInstanceTypes
answer (tests/aws/test_catalogue.py checks that it still is). No moto, no AWS.
UPDATE_GOLDEN=1 regenerates the golden file, as in test_slurm_conf.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from test_slurm_conf import GOLDEN, render

from clusterbake.config import load_config
from clusterbake.providers.aws.catalogue import Catalogue
from clusterbake.providers.aws.provider import aws_inventory

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data" / "aws-instance-types.json"
CATALOGUE = Catalogue.from_response(json.loads(DATA.read_text()))


def _instance(name: str, instance_type: str, address: str) -> dict:
    return {
        "InstanceId": "i-" + address.replace(".", "").rjust(17, "0"),
        "InstanceType": instance_type,
        "State": {"Name": "running"},
        "PrivateIpAddress": address,
        "Placement": {"AvailabilityZone": "us-east-1a", "GroupName": ""},
        "Tags": [{"Key": "clusterbake:cluster", "Value": "p5demo"}, {"Key": "clusterbake:name", "Value": name}],
    }


def p5_inventory() -> dict:
    config = load_config(REPO / "examples" / "aws-p5.yaml")
    instances = [
        _instance("head", "m7i.2xlarge", "10.0.0.10"),
        _instance("gpu-2", "p5.48xlarge", "10.0.0.12"),
        _instance("gpu-1", "p5.48xlarge", "10.0.0.11"),
    ]
    infos = CATALOGUE.get({i["InstanceType"] for i in instances})
    return aws_inventory(config, instances, infos, extra={})


def as_template_input(inventory: dict) -> dict:
    """`ansible-inventory --list` JSON -> the groups/hostvars/vars the template sees."""
    groups = {name: data["hosts"] for name, data in inventory.items() if name not in ("_meta", "all")}
    groups["all"] = list(inventory["_meta"]["hostvars"])
    return {"groups": groups, "hostvars": inventory["_meta"]["hostvars"], "vars": inventory["all"]["vars"]}


def test_p5_slurm_conf_matches_golden_file():
    rendered = render("slurm.conf.j2", as_template_input(p5_inventory()))
    golden = GOLDEN / "aws-p5.slurm.conf"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert rendered == golden.read_text(), f"{golden.name} differs; UPDATE_GOLDEN=1 regenerates it"


def test_p5_node_line_comes_from_the_instance_type():
    lines = render("slurm.conf.j2", as_template_input(p5_inventory())).splitlines()
    spec = (
        "CPUs=192 Sockets=1 CoresPerSocket=96 ThreadsPerCore=2 RealMemory=1992294 "
        "Gres=gpu:h100:8 Features=gpu,train,efa,p5.48xlarge State=UNKNOWN"
    )
    assert f"NodeName=gpu-[1-2] {spec}" in lines
    assert "GresTypes=gpu" in lines
    assert "SlurmctldHost=head(10.0.0.10)" in lines
    assert "ProctrackType=proctrack/cgroup" in lines
    assert "PartitionName=gpu Nodes=gpu-[1-2] Default=YES MaxTime=2-00:00:00 State=UP" in lines


def test_catalogue_spec_of_p5():
    info = CATALOGUE["p5.48xlarge"]
    assert (info.vcpus, info.cores, info.threads_per_core, info.memory_mib) == (192, 96, 2, 2_097_152)
    assert info.gres == ["gpu:h100:8"]
    assert info.efa_supported and info.efa_interfaces == 32
    spec = info.slurm_spec(features=["gpu", "efa", "gpu"])
    assert spec.real_memory == int(2_097_152 * 0.95) and spec.features == ["gpu", "efa"]
    assert CATALOGUE["m7i.2xlarge"].efa_interfaces == 0 and CATALOGUE["m7i.2xlarge"].gres == []


def test_p5_gres_conf_matches_golden_file():
    """gres.conf(5): `NodeName=... Name=gpu Type=<type> File=<device files>`; NVIDIA's devices are
    /dev/nvidia0..7 on an 8-GPU node (their minor numbers); no AutoDetect (distro Slurm has no NVML)."""
    rendered = render("gres.conf.j2", as_template_input(p5_inventory()))
    golden = GOLDEN / "aws-p5.gres.conf"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert rendered == golden.read_text(), f"{golden.name} differs; UPDATE_GOLDEN=1 regenerates it"
    assert "NodeName=gpu-[1-2] Name=gpu Type=h100 File=/dev/nvidia[0-7]" in rendered.splitlines()
