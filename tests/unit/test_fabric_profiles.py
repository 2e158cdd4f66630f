"""Role fabric's profiles as the real join renders them into the bundles (tests/unit/join_run.py).

The hardware review of 33121ef: Azure's `ib` profile exported NCCL_IB_HCA=mlx5_ib, a prefix that
matches none of DOCA-OFED's HCA names (mlx5_0..), so NCCL trained over TCP (item 3); its guard
(`'azure' in group_names`) never held at cluster time, so the bundle's /etc/nccl.conf raced the one
role azure_sku writes per VM size and fabric.env forced ND v5's topology on every IB size (item 5);
UCX_TLS=rc went to every process (item 20); `efa` forced FI_EFA_USE_DEVICE_RDMA=1, which makes
libfabric abort jobs on EFA types without RDMA (item 6).
"""

from __future__ import annotations

import pytest
from join_run import files, host, play
from playbook_run import ANSIBLE_PLAYBOOK

OFF = {"clusterbake_accounting": {"enabled": False}, "clusterbake_monitoring": {"enabled": False}}


def _environment(bundle: dict) -> dict[str, str]:
    text = files(bundle)["/etc/clusterbake/fabric.env"]["text"]
    exports = [line.removeprefix("export ") for line in text.splitlines() if line.startswith("export ")]
    return dict(line.split("=", 1) for line in exports if "=" in line and not line.startswith("NCCL_SOCKET"))


def _joined(tmp_path_factory, provider: str, fabric: str) -> dict:
    """The bundles of a head and a GPU node in feature group `fabric`, joined for `provider`."""
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.fail("ansible-playbook is not in the venv (make venv)")
    hosts = {"head": host("10.0.1.10", "head"), "gpu-1": host("10.0.1.11", "gpu")}
    groups = {"slurm_head": ["head"], "slurm_compute": ["gpu-1"], fabric: ["gpu-1"]}
    return play(tmp_path_factory.mktemp(f"fabric-{provider}"), hosts, groups, {**OFF, "clusterbake_provider": provider})


@pytest.fixture(scope="module")
def azure(tmp_path_factory):
    return _joined(tmp_path_factory, "azure", "ib")


@pytest.fixture(scope="module")
def aws(tmp_path_factory):
    return _joined(tmp_path_factory, "aws", "efa")


def test_on_azure_the_node_owns_nccl_conf_and_fabric_env_does_not_override_it(azure):
    bundle = azure["bundles"]["gpu-1"]
    assert "/etc/nccl.conf" not in files(bundle)  # role azure_sku writes it at boot, per VM size
    environment = _environment(bundle)
    assert environment["CLUSTERBAKE_FABRIC"] == "ib"
    assert not {"NCCL_IB_HCA", "NCCL_TOPO_FILE", "UCX_TLS"} & set(environment), environment
    assert environment["NCCL_IB_PCI_RELAXED_ORDERING"] == "1"
    # InfiniBand or a failed job: no silent fall-back to TCP sockets (NCCL_NET names the transport).
    assert environment["NCCL_NET"] == "IB"


def test_efa_leaves_device_rdma_to_libfabric(aws):
    bundle = aws["bundles"]["gpu-1"]
    environment = _environment(bundle)
    assert environment["CLUSTERBAKE_FABRIC"] == "efa" and environment["FI_PROVIDER"] == "efa"
    assert "FI_EFA_USE_DEVICE_RDMA" not in environment
    assert "FI_EFA_USE_DEVICE_RDMA" not in files(bundle)["/etc/nccl.conf"]["text"]
