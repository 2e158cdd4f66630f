"""gres.conf from node specs: the role's real template and filter (test_slurm_conf.py renders it)."""

from __future__ import annotations

import configs
from test_slurm_conf import filters, inventory, node, render

from clusterbake.config import ClusterConfig
from clusterbake.inventory import build_inventory
from clusterbake.plan import plan_nodes


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_one_line_per_gpu_spec_and_none_for_cpu_nodes():
    inv = inventory(
        {
            "gpu": (["gpu-1", "gpu-2", "gpu-10"], node(8, 8192, gres=["gpu:a100:4"])),
            "big": (["big-1"], node(8, 8192, gres=["gpu:h100:8"])),
            "cpu": (["cpu-1"], node(2, 2048)),
        },
        [{"name": "all", "nodegroups": ["gpu", "big", "cpu"], "default": True}],
    )
    assert lines(render("gres.conf.j2", inv)) == [
        "NodeName=big-1 Name=gpu Type=h100 File=/dev/nvidia[0-7]",
        "NodeName=gpu-[1-2,10] Name=gpu Type=a100 File=/dev/nvidia[0-3]",
    ]


def test_untyped_single_and_mixed_gpus_are_numbered_in_order():
    hostvars = {
        "a-1": {"clusterbake_slurm_node": node(2, 1024, gres=["gpu:1"])},
        "b-1": {"clusterbake_slurm_node": node(2, 1024, gres=["gpu:t4:2", "gpu:a10:1", "nic:2"])},
    }
    assert filters.slurm_gres_conf_lines(hostvars, ["a-1", "b-1"]) == [
        "NodeName=a-1 Name=gpu File=/dev/nvidia0",
        "NodeName=b-1 Name=gpu Type=t4 File=/dev/nvidia[0-1]",
        "NodeName=b-1 Name=gpu Type=a10 File=/dev/nvidia2",
    ]


def test_placeholder_gpus_of_a_local_group_become_gres_and_feature_groups():
    config = ClusterConfig.model_validate(
        {
            "cluster_name": "gputest",
            "node_groups": [
                {"name": "gpu", "count": 2, "cpus": 2, "memory_mb": 4096, "gpus": 4, "features": ["train"]},
                {"name": "cpu", "count": 1},
            ],
        }
    )
    nodes = plan_nodes(config)
    addresses = {n.name: f"10.0.0.{i + 10}" for i, n in enumerate(nodes)}
    inv = build_inventory(config, nodes, addresses)
    assert inv["_meta"]["hostvars"]["gpu-1"]["clusterbake_slurm_node"]["gres"] == ["gpu:placeholder:4"]
    assert inv["_meta"]["hostvars"]["cpu-1"]["clusterbake_slurm_node"]["gres"] == []
    assert inv["gpu"]["hosts"] == ["gpu-1", "gpu-2"] and inv["placeholder_gpus"]["hosts"] == ["gpu-1", "gpu-2"]
    template_input = {
        "groups": {name: data["hosts"] for name, data in inv.items() if name not in ("_meta", "all")},
        "hostvars": inv["_meta"]["hostvars"],
        "vars": inv["all"]["vars"],
    }
    assert lines(render("gres.conf.j2", template_input)) == [
        "NodeName=gpu-[1-2] Name=gpu Type=placeholder File=/dev/nvidia[0-3]"
    ]


def test_gpus_are_for_the_local_provider_only():
    import pytest

    with pytest.raises(ValueError, match=r"node_groups\.0\.gpus: only for provider local"):
        ClusterConfig.model_validate(
            configs.aws_cluster(node_groups=[{"name": "g", "count": 1, "instance_type": "p5.48xlarge", "gpus": 8}])
        )
