"""The planned cluster: names, elastic nodes, addresses kept for good, and slurm.conf of an elastic cluster."""

from __future__ import annotations

import os

import pytest
from test_slurm_conf import GOLDEN, LOCAL_PLUGINS, render, render_string

from clusterbake.config import ClusterConfig
from clusterbake.errors import ConfigError
from clusterbake.inventory import build_inventory
from clusterbake.plan import address_pool, assign_addresses, plan_nodes

POOL = address_pool("10.77.0.0/24", skip_first=9)


def config(*groups) -> ClusterConfig:
    return ClusterConfig.model_validate({"cluster_name": "plan", "node_groups": list(groups)})


def test_static_nodes_first_then_elastic_ones():
    nodes = plan_nodes(config({"name": "cpu", "min_count": 1, "max_count": 3}, {"name": "gpu", "count": 1}))
    assert [(n.name, n.elastic) for n in nodes] == [
        ("head", False), ("cpu-1", False), ("cpu-2", True), ("cpu-3", True), ("gpu-1", False),
    ]  # fmt: skip


def test_login_nodes_follow_the_head_with_the_training_environment_only():
    settings = {
        "cluster_name": "plan",
        "login_nodes": {"count": 2, "cpus": 4, "memory_mb": 8192},
        "node_groups": [
            {"name": "gpu", "count": 1, "gpus": 2, "features": ["train", "lustre"]},
            {"name": "cpu", "count": 1},
        ],
    }
    nodes = plan_nodes(ClusterConfig.model_validate(settings))
    assert [(n.name, n.role, n.nodegroup) for n in nodes[:3]] == [
        ("head", "head", "head"), ("login-1", "login", "login"), ("login-2", "login", "login"),
    ]  # fmt: skip
    # What users run before a job does (the training environment), never a device's or a mount's feature.
    assert nodes[1].features == ("train",)
    assert (nodes[1].slurm.cpus, nodes[1].slurm.real_memory) == (4, 8192)
    inventory = build_inventory(ClusterConfig.model_validate(settings), nodes, {n.name: "10.0.0.1" for n in nodes})
    assert inventory["slurm_login"]["hosts"] == ["login-1", "login-2"]
    assert "login-1" not in inventory["slurm_compute"]["hosts"] and "login-1" in inventory["train"]["hosts"]
    del settings["node_groups"][0]["features"]
    assert plan_nodes(ClusterConfig.model_validate(settings))[1].features == ()


@pytest.mark.parametrize(
    "group, message",
    [
        ({"name": "a", "count": 1, "max_count": 2}, "not both"),
        ({"name": "a"}, "count: required"),
        ({"name": "a", "min_count": 3, "max_count": 2}, "min_count: 3 is more than max_count 2"),
    ],
)
def test_count_or_range(group, message):
    with pytest.raises(ValueError, match=message):
        config(group)


def test_growing_a_group_never_moves_another_node():
    before = config({"name": "cpu", "count": 2}, {"name": "gpu", "max_count": 2})
    names = [n.name for n in plan_nodes(before)]
    first = assign_addresses(names, POOL, {}, "local.subnet")
    assert first == {
        "head": "10.77.0.10", "cpu-1": "10.77.0.11", "cpu-2": "10.77.0.12",
        "gpu-1": "10.77.0.13", "gpu-2": "10.77.0.14",
    }  # fmt: skip
    after = config({"name": "cpu", "count": 4}, {"name": "gpu", "max_count": 3})
    second = assign_addresses([n.name for n in plan_nodes(after)], POOL, first, "local.subnet")
    assert {name: second[name] for name in first} == first
    assert (second["cpu-3"], second["cpu-4"], second["gpu-3"]) == ("10.77.0.15", "10.77.0.16", "10.77.0.17")


def test_a_removed_node_frees_its_address_for_the_next_new_one():
    kept = {"head": "10.77.0.10", "cpu-1": "10.77.0.11", "old-1": "10.77.0.12"}
    assert assign_addresses(["head", "cpu-1", "new-1"], POOL, kept, "x") == {
        "head": "10.77.0.10", "cpu-1": "10.77.0.11", "new-1": "10.77.0.12",
    }  # fmt: skip


def test_a_pool_too_small_names_the_field():
    with pytest.raises(ConfigError, match=r"local\.subnet: room for 3 nodes, the config plans 4"):
        assign_addresses(["a", "b", "c", "d"], POOL[:3], {}, "local.subnet")


def test_cloud_pools_are_taken_from_the_top():
    assert address_pool("10.90.0.0/24", skip_first=3, from_top=True)[:2] == ["10.90.0.254", "10.90.0.253"]


def planned_inventory(settings: dict) -> dict:
    """The inventory of a config as every provider builds it, in render()'s shape."""
    cfg = ClusterConfig.model_validate(settings)
    nodes = plan_nodes(cfg)
    addresses = assign_addresses([n.name for n in nodes], POOL, {}, "local.subnet")
    inventory = build_inventory(
        cfg, nodes, addresses, extra_vars={**LOCAL_PLUGINS, "clusterbake_extra_ca_certificates": []}
    )
    return {
        "groups": {name: data["hosts"] for name, data in inventory.items() if name not in ("_meta", "all")},
        "hostvars": inventory["_meta"]["hostvars"],
        "vars": inventory["all"]["vars"],
    }


def elastic_inventory() -> dict:
    return planned_inventory(
        {
            "cluster_name": "elastic",
            "node_groups": [
                {"name": "cpu", "count": 2},
                {"name": "burst", "min_count": 1, "max_count": 4, "idle_time": 300},
                {"name": "big", "max_count": 2, "idle_time": 120, "cpus": 2, "memory_mb": 8192},
            ],
            "partitions": [
                {"name": "cpu", "node_groups": ["cpu", "burst"], "default": True},
                {"name": "big", "node_groups": ["big"]},
            ],
            "power": {"resume_timeout": 300},
        }
    )


def test_elastic_slurm_conf_matches_golden_file():
    """slurm.conf(5) and Slurm's power saving guide: elastic nodes State=CLOUD, the power programs,
    SuspendTime (the shortest idle_time; per partition its own), static nodes in SuspendExcNodes."""
    rendered = render("slurm.conf.j2", elastic_inventory())
    golden = GOLDEN / "elastic.slurm.conf"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert rendered == golden.read_text(), f"{golden.name} differs; UPDATE_GOLDEN=1 regenerates it"
    lines = rendered.splitlines()
    spec = "CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=2048 Features=burst"
    assert f"NodeName=burst-1 {spec} State=UNKNOWN" in lines
    assert f"NodeName=burst-[2-4] {spec} State=CLOUD" in lines
    assert "SuspendExcNodes=burst-1,cpu-[1-2]" in lines
    assert "SuspendTime=120" in lines and "ResumeTimeout=300" in lines
    assert "ResumeProgram=/usr/local/sbin/clusterbake-resume" in lines
    assert "SlurmctldParameters=enable_configless,idle_on_node_suspend" in lines
    assert any(line.startswith("PartitionName=cpu ") and " SuspendTime=300 " in line for line in lines)
    assert any(line.startswith("PartitionName=big ") and " SuspendTime=120 " in line for line in lines)


def test_a_static_cluster_has_no_power_settings():
    cfg = config({"name": "cpu", "count": 2})
    nodes = plan_nodes(cfg)
    addresses = assign_addresses([n.name for n in nodes], POOL, {}, "x")
    inventory = build_inventory(cfg, nodes, addresses, extra_vars={"clusterbake_extra_ca_certificates": []})
    rendered = render(
        "slurm.conf.j2",
        {
            "groups": {n: d["hosts"] for n, d in inventory.items() if n not in ("_meta", "all")},
            "hostvars": inventory["_meta"]["hostvars"],
            "vars": inventory["all"]["vars"],
        },
    )
    assert "ResumeProgram" not in rendered and "State=CLOUD" not in rendered and "SuspendTime" not in rendered


@pytest.mark.parametrize(
    "features, configured, expected",
    [
        ((), None, 600),
        (("gpu",), None, 1800),  # p5 / ND v5 boots take minutes (hardware review item 14)
        (("efa",), None, 1800),
        (("ib",), None, 1800),
        (("gpu",), 900, 900),  # the config's value wins
    ],
)
def test_resume_timeout_defaults_to_30_minutes_for_gpu_and_fabric_nodes(features, configured, expected):
    import dataclasses

    cfg = ClusterConfig.model_validate(
        {
            "cluster_name": "resume",
            "node_groups": [{"name": "cpu", "count": 1}, {"name": "gpu", "max_count": 2, "idle_time": 300}],
            **({"power": {"resume_timeout": configured}} if configured else {}),
        }
    )
    nodes = [dataclasses.replace(n, features=features) if n.nodegroup == "gpu" else n for n in plan_nodes(cfg)]
    addresses = assign_addresses([n.name for n in nodes], POOL, {}, "local.subnet")
    inventory = build_inventory(cfg, nodes, addresses, extra_vars={"clusterbake_extra_ca_certificates": []})
    assert inventory["all"]["vars"]["clusterbake_power"]["resume_timeout"] == expected


HA = {"cluster_name": "ha", "head": {"count": 2}, "node_groups": [{"name": "cpu", "count": 2}]}


def test_a_backup_controller_is_head_2_listed_after_the_primary_with_its_state_on_shared_storage():
    """slurm.conf(5) SlurmctldHost: "If specified more than once, the first hostname named will be where
    the daemon runs. If the first specified host fails, the daemon will execute on the second host";
    StateSaveLocation on storage both see (the local provider binds one host directory into both)."""
    nodes = plan_nodes(ClusterConfig.model_validate(HA))
    assert [(n.name, n.role) for n in nodes] == [
        ("head", "head"),
        ("head-2", "head"),
        ("cpu-1", "compute"),
        ("cpu-2", "compute"),
    ]
    inventory = planned_inventory(HA)
    # The primary alone in slurm_head (what runs once: slurmdbd, Prometheus, NFS, the ops plays).
    assert (inventory["groups"]["slurm_head"], inventory["groups"]["slurm_backup_head"]) == (["head"], ["head-2"])
    lines = render("slurm.conf.j2", inventory).splitlines()
    controllers = [line for line in lines if line.startswith("SlurmctldHost=")]
    assert controllers == ["SlurmctldHost=head(10.77.0.10)", "SlurmctldHost=head-2(10.77.0.11)"]
    assert "StateSaveLocation=/srv/clusterbake/controller/slurmctld" in lines
    # One head: one SlurmctldHost, the state on the head's own disk, no backup group members.
    single = planned_inventory({**HA, "head": {}})
    single_lines = render("slurm.conf.j2", single).splitlines()
    assert [line for line in single_lines if line.startswith("SlurmctldHost=")] == ["SlurmctldHost=head(10.77.0.10)"]
    assert "StateSaveLocation=/var/spool/slurmctld" in single_lines
    assert single["groups"]["slurm_backup_head"] == []


def test_only_the_local_provider_takes_a_backup_controller_so_far():
    from configs import aws_cluster

    with pytest.raises(ValueError, match=r"head\.count: a backup controller is built on the local provider only"):
        ClusterConfig.model_validate(aws_cluster(head={"instance_type": "m7i.2xlarge", "count": 2}))
    with pytest.raises(ValueError, match=r"head\.count"):
        ClusterConfig.model_validate({**HA, "head": {"count": 3}})


def test_configless_clients_fetch_from_every_controller_the_primary_first():
    """slurmd(8) --conf-server: "Comma-separated list of controllers, the first being the primary
    slurmctld"; login nodes' SLURM_CONF_SERVER takes the same list."""
    import yaml
    from test_slurm_conf import ROLE

    inventory = planned_inventory(HA)
    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    context = {
        "slurm_controller_host": "head",
        "slurm_backup_controller_hosts": inventory["groups"]["slurm_backup_head"],
        "slurm_slurmctld_port": 6817,
    }
    for name in ("__slurm_controllers", "__slurm_conf_servers"):
        context[name] = render_string(role_vars[name], context)
    assert context["__slurm_conf_servers"] == "head:6817,head-2:6817"
    default = render("slurmd.default.j2", inventory, inventory_hostname="cpu-1", extra=context)
    assert 'SLURMD_OPTIONS="--conf-server head:6817,head-2:6817"' in default
