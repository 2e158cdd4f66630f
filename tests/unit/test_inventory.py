"""Inventory shape (docs/architecture.md): groups, hostvars, Slurm specs, group vars."""

import json
import subprocess

from clusterbake.config import ClusterConfig, LoginNodes
from clusterbake.inventory import build_inventory
from clusterbake.plan import address_pool, assign_addresses, plan_nodes

CONFIG = ClusterConfig.model_validate(
    {
        "cluster_name": "demo",
        "node_groups": [
            {"name": "cpu", "count": 2, "cpus": 4, "sockets": 2, "memory_mb": 8000},
            {"name": "gpu-h100", "count": 1, "cpus": 8, "features": ["cuda"], "gres": ["gpu:h100:8"]},
        ],
        "partitions": [{"name": "batch", "node_groups": ["cpu", "gpu-h100"]}],
        "users": [{"name": "alice", "uid": 2001}],
    }
)


def inventory():
    nodes = plan_nodes(CONFIG)
    names = [n.name for n in nodes]
    addresses = assign_addresses(names, address_pool("10.77.0.0/24", skip_first=9), {}, "local.subnet")
    return build_inventory(CONFIG, nodes, addresses)


def test_node_names_and_addresses():
    inv = inventory()
    hostvars = inv["_meta"]["hostvars"]
    assert list(hostvars) == ["head", "cpu-1", "cpu-2", "gpu-h100-1"]
    assert [hostvars[h]["ansible_host"] for h in hostvars] == [
        "10.77.0.10",
        "10.77.0.11",
        "10.77.0.12",
        "10.77.0.13",
    ]


def test_groups_are_feature_switches():
    inv = inventory()
    assert inv["slurm_head"]["hosts"] == ["head"]
    assert inv["slurm_compute"]["hosts"] == ["cpu-1", "cpu-2", "gpu-h100-1"]
    assert inv["nodegroup_cpu"]["hosts"] == ["cpu-1", "cpu-2"]
    assert inv["nodegroup_gpu_h100"]["hosts"] == ["gpu-h100-1"]
    assert inv["cuda"]["hosts"] == ["gpu-h100-1"]
    assert set(inv["all"]["children"]) >= {"slurm_head", "slurm_compute", "nodegroup_cpu", "cuda"}
    # No group is named like a host.
    assert not set(inv) & set(inv["_meta"]["hostvars"])


def test_one_host_per_node_group_renders_the_bundles_of_self_joining_nodes():
    nodes = plan_nodes(CONFIG)
    addresses = assign_addresses([n.name for n in nodes], address_pool("10.77.0.0/24", skip_first=9), {}, "x")
    joined_by_ansible = build_inventory(CONFIG, nodes, addresses)
    assert joined_by_ansible["join_bundle_hosts"]["hosts"] == ["cpu-1", "cpu-2", "gpu-h100-1"]
    # Joined by Ansible: slurmd starts in the join, so after the controller's play.
    assert joined_by_ansible["join_with_head"]["hosts"] == []
    assert joined_by_ansible["join_after_controller"]["hosts"] == ["cpu-1", "cpu-2", "gpu-h100-1"]
    self_joining = build_inventory(CONFIG, nodes, addresses, extra_vars={"node_join_self_join": True})
    assert self_joining["join_bundle_hosts"]["hosts"] == ["cpu-1", "gpu-h100-1"]
    assert self_joining["join_with_head"]["hosts"] == ["cpu-1", "gpu-h100-1"]
    assert self_joining["join_after_controller"]["hosts"] == []
    assert self_joining["slurm_compute"]["hosts"] == ["cpu-1", "cpu-2", "gpu-h100-1"]


def test_slurm_spec_hostvars():
    hostvars = inventory()["_meta"]["hostvars"]
    assert hostvars["cpu-1"]["clusterbake_slurm_node"] == {
        "cpus": 4,
        "sockets": 2,
        "cores_per_socket": 2,
        "threads_per_core": 1,
        "real_memory": 8000,
        "gres": [],
        "features": ["cpu"],
    }
    gpu = hostvars["gpu-h100-1"]["clusterbake_slurm_node"]
    assert gpu["gres"] == ["gpu:h100:8"] and gpu["features"] == ["gpu-h100", "cuda"]
    assert hostvars["head"]["clusterbake_node_role"] == "head"
    assert hostvars["cpu-2"]["clusterbake_nodegroup"] == "cpu"


def test_group_vars_from_config():
    variables = inventory()["all"]["vars"]
    assert variables["clusterbake_cluster_name"] == "demo"
    assert variables["clusterbake_partitions"] == [
        {
            "name": "batch",
            "nodegroups": ["cpu", "gpu-h100"],
            "default": True,
            "max_time": "INFINITE",
            "max_nodes": None,
            "state": "UP",
        }
    ]
    assert variables["clusterbake_users"][0]["gid"] == 2001
    assert variables["slurm_proctrack_type"] == "proctrack/linuxproc"
    assert variables["slurm_cgroup_enabled"] is False


def test_inventory_script_protocol(repo, tmp_path):
    """The executable script answers --list and --host: every planned node, none of them running."""
    config = tmp_path / "c.yaml"
    config.write_text("cluster_name: inv-test\nnode_groups: [{name: cpu, count: 1}]\n")
    env = {"PATH": "/usr/bin:/bin", "CLUSTERBAKE_CONFIG": str(config), "CLUSTERBAKE_STATE_DIR": str(tmp_path)}
    listing = subprocess.run([repo / "inventories/local.py", "--list"], capture_output=True, text=True, env=env)
    assert listing.returncode == 0, listing.stderr
    data = json.loads(listing.stdout)
    assert data["slurm_head"] == {"hosts": ["head"]} and data["slurm_compute"] == {"hosts": ["cpu-1"]}
    hostvars = data["_meta"]["hostvars"]
    assert {h: (v["ansible_host"], v["clusterbake_running"]) for h, v in hostvars.items()} == {
        "head": ("10.77.0.10", False),
        "cpu-1": ("10.77.0.11", False),
    }
    assert data["all"]["vars"]["clusterbake_cluster_name"] == "inv-test"
    host = subprocess.run([repo / "inventories/local.py", "--host", "head"], capture_output=True, text=True, env=env)
    assert host.returncode == 0 and json.loads(host.stdout) == hostvars["head"]


def test_inventory_script_bad_config_exits_2(repo, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("cluster_name: x\n")
    env = {"PATH": "/usr/bin:/bin", "CLUSTERBAKE_CONFIG": str(config)}
    result = subprocess.run([repo / "inventories/local.py", "--list"], capture_output=True, text=True, env=env)
    assert result.returncode == 2 and "node_groups: required" in result.stderr


def test_login_nodes_join_by_themselves_from_one_bundle_like_a_node_group():
    config = CONFIG.model_copy(update={"login_nodes": LoginNodes()})
    nodes = plan_nodes(config)
    addresses = {n.name: f"10.77.0.{i}" for i, n in enumerate(nodes, start=10)}
    alone = build_inventory(config, nodes, addresses, extra_vars={"node_join_self_join": True})
    assert alone["join_bundle_hosts"]["hosts"] == ["login-1", "cpu-1", "gpu-h100-1"]
    assert alone["join_with_head"]["hosts"] == ["login-1", "cpu-1", "gpu-h100-1"]
    joined = build_inventory(config, nodes, addresses)
    assert joined["join_after_controller"]["hosts"] == ["login-1", "cpu-1", "cpu-2", "gpu-h100-1"]
    assert alone["_meta"]["hostvars"]["login-1"]["clusterbake_node_role"] == "login"
