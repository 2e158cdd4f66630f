"""Config errors of provider azure found by the schema alone (exit status 2, the field named)."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from azuretest import CB, REPO

from clusterbake.config import load_config
from clusterbake.errors import ConfigError

SUB = "00000000-0000-4000-8000-00000000c1b0"
SUBNET_ID = f"/subscriptions/{SUB}/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/v/subnets/s"


def _config(**changes) -> dict:
    config = yaml.safe_load((REPO / "examples" / "azure-ndv5.yaml").read_text())
    azure = changes.pop("azure", {})
    config.update(changes)
    if azure is None:
        del config["azure"]
        return config
    config["azure"] = {**config["azure"], **azure}
    for key in [k for k, v in config["azure"].items() if v is None]:
        del config["azure"][key]
    return config


def _error(tmp_path, config: dict) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


CASES = {
    "no-section": ({"azure": None}, "azure: required with provider azure"),
    "bad-subscription": ({"azure": {"subscription_id": "my-sub"}}, "azure.subscription_id: String should match"),
    "bad-location": ({"azure": {"location": "East US"}}, "azure.location: String should match"),
    "bad-zone": ({"azure": {"zone": "4"}}, "azure.zone: Input should be '1', '2' or '3'"),
    "no-subnet": (
        {"azure": {"subnet_id": None}},
        "azure.vnet_name: required (the existing subnet: subnet_id, or vnet_name and subnet_name)",
    ),
    "subnet-twice": (
        {"azure": {"vnet_name": "v", "subnet_name": "s"}},
        "azure.subnet_id: give subnet_id or vnet_name + subnet_name, not both",
    ),
    "vnet-without-subnet": ({"azure": {"subnet_id": None, "vnet_name": "v"}}, "azure.subnet_name: required"),
    "bad-subnet-id": ({"azure": {"subnet_id": "/subscriptions/x/subnets/s"}}, "azure.subnet_id: String should match"),
    "bad-cidr": ({"azure": {"ssh_cidrs": ["10.0.0.1/8"]}}, "azure.ssh_cidrs: '10.0.0.1/8' is not a CIDR block"),
    "reserved-admin": (
        {"azure": {"admin_user": "admin"}},
        "azure.admin_user: Azure does not allow 'admin' as a VM's admin user",
    ),
    "bad-image": ({"azure": {"image": "ubuntu-latest"}}, "azure.image: String should match"),
    "unknown-key": ({"azure": {"region": "eastus"}}, "azure.region: unknown key; remove it"),
    "aws-size": (
        {"head": {"instance_type": "m7i.2xlarge"}},
        "head.instance_type: m7i.2xlarge is not an Azure VM size (Standard_<name>",
    ),
    "no-size": ({"head": {}}, "head.instance_type: required with provider azure"),
    "local-sizing": (
        {"node_groups": [{"name": "gpu", "count": 1, "instance_type": "Standard_D4s_v5", "cpus": 4}]},
        "node_groups.0.cpus: only for provider local; on azure CPUs, sockets and memory come from the VM size",
    ),
    "efa": (
        {"node_groups": [{"name": "gpu", "count": 1, "instance_type": "Standard_ND96isr_H100_v5", "efa": True}]},
        "node_groups.0.efa: aws's EFA; Azure's fabric is InfiniBand: use infiniband; remove it",
    ),
    "aws-fallback-type": (
        {"node_groups": [{"name": "gpu", "max_count": 4, "instance_types": ["Standard_D4s_v5", "m7i.xlarge"]}]},
        "node_groups.0.instance_types.1: m7i.xlarge is not an Azure VM size",
    ),
    "debian": ({"image": {"base": "debian-12"}}, "image.base: Azure images are Ubuntu"),
    "storage-efs": (
        {"storage": [{"name": "shared", "mount_point": "/shared", "type": "efs"}]},
        "storage.0.type: efs is not for provider azure; use nfs",
    ),
    "aws-section-too": (
        {"aws": {"region": "us-east-1", "vpc_id": "vpc-0123456789abcdef0", "subnet_id": "subnet-0123456789abcdef0"}},
        "aws: only for provider aws; remove it",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_azure_config_errors_name_the_field(tmp_path, case):
    changes, expected = CASES[case]
    assert expected in _error(tmp_path, _config(**changes))


def test_example_is_valid_and_gets_the_azure_defaults():
    config = load_config(REPO / "examples" / "azure-ndv5.yaml")
    assert config.provider == "azure"
    assert config.image.base == "ubuntu-24.04"
    assert config.azure.subnet_parts == ("net-rg", "hpc-vnet", "nodes")
    assert [m.type for m in config.effective_storage()] == ["nfs", "nfs"]
    assert config.slurm_plugins()["proctrack_type"] == "proctrack/cgroup"


def test_zone_may_be_a_number_and_subnet_names_work(tmp_path):
    config = _config(azure={"zone": 2, "subnet_id": None, "vnet_name": "v", "subnet_name": "s"})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(path)
    assert loaded.azure.zone == "2"
    assert loaded.azure.subnet_parts == ("ndv5demo-rg", "v", "s")


def test_aws_refuses_azure_keys(tmp_path):
    config = yaml.safe_load((REPO / "examples" / "aws-p5.yaml").read_text())
    config["node_groups"][0]["infiniband"] = True
    assert "node_groups.0.infiniband: only for provider azure (on aws: efa)" in _error(tmp_path, config)
    config = yaml.safe_load((REPO / "examples" / "aws-p5.yaml").read_text())
    config["head"]["instance_type"] = "Standard_D4s_v5"
    assert "head.instance_type: Standard_D4s_v5 is not an EC2 instance type" in _error(tmp_path, config)


def test_cli_validate_exits_2_naming_the_field(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(_config(azure={"zone": "7"})))
    result = subprocess.run([*CB, "-c", str(path), "validate"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "azure.zone: Input should be '1', '2' or '3'" in result.stderr
    assert "Traceback" not in result.stderr
