"""Replacing nodes: when Slurm lets a node go, the local provider's record of each disk's image,
moving the cluster to another image, and what `cluster status` shows of it."""

from __future__ import annotations

import json

import pytest

from clusterbake import cli
from clusterbake import cluster as cluster_module
from clusterbake.config import load_config
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.providers.base import NodeStatus
from clusterbake.providers.local.provider import LocalProvider
from clusterbake.replace import SlurmNode, refusal, replace
from clusterbake.state import StateDir

CONFIG = """cluster_name: demo
node_groups:
  - name: cpu
    count: 2
  - name: burst
    max_count: 2
"""


@pytest.mark.parametrize(
    ("state", "jobs", "why"),
    [
        ("drain", [], None),
        ("drain*", [], None),  # drained and not responding: a broken node, the one to replace
        ("down*", [], None),
        ("idle~", [], None),  # powered down (elastic): nothing runs there
        ("", [], None),  # not in Slurm (yet)
        ("drng", ["12"], "cpu-1 runs job(s) 12"),
        ("idle", [], "cpu-1 is idle in Slurm, not drained: a job could start on it"),
        ("mix", ["3", "4"], "cpu-1 runs job(s) 3, 4"),
    ],
)
def test_a_node_is_replaced_only_when_slurm_runs_nothing_there(state, jobs, why):
    assert refusal("cpu-1", SlurmNode(state, jobs, "2026-12-01T10:00:00")) == why


@pytest.fixture
def provider(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(CONFIG)
    provider = LocalProvider(load_config(path), StateDir(tmp_path / "state"))
    for name in ("old", "new"):
        (tmp_path / "images" / name / "rootfs").mkdir(parents=True)
    provider.cluster.write_state({"image": str(tmp_path / "images" / "old"), "nodes": {}})
    return provider


def test_each_disk_keeps_the_image_it_was_made_from(provider, tmp_path):
    old, new = tmp_path / "images" / "old", tmp_path / "images" / "new"
    provider.cluster.node("cpu-1").joinpath("upper").mkdir(parents=True)  # a disk from before the record
    assert provider.disk_image("cpu-1") == old
    assert provider.disk_image("cpu-2") is None  # no disk
    assert provider.use_image(new) is True
    assert provider.cluster_image == new
    assert provider.disk_image("cpu-1") == old  # recorded before the cluster moved
    assert provider.use_image(new) is False  # already
    with pytest.raises(ClusterbakeError, match="has no rootfs"):
        provider.use_image(tmp_path / "images" / "missing")
    shown = {s.name: s.image for s in provider.status()}
    assert shown == {"head": None, "cpu-1": "old", "cpu-2": None, "burst-1": None, "burst-2": None}


def test_the_head_is_never_replaced(provider):
    with pytest.raises(ConfigError, match="only compute nodes are replaced"):
        provider.replace_node("head")
    with pytest.raises(ConfigError, match="is the head"):
        replace(provider, ["head"])


def test_a_node_with_a_job_is_refused_and_nothing_is_replaced(provider, monkeypatch):
    views = {"cpu-1": SlurmNode("drng", ["7"], "t"), "cpu-2": SlurmNode("idle", [], "t")}
    monkeypatch.setattr("clusterbake.replace.slurm_view", lambda provider, names: views)
    replaced = []
    monkeypatch.setattr(provider, "replace_node", lambda name, image=None: replaced.append(name))
    with pytest.raises(ClusterbakeError) as error:
        replace(provider, ["cpu-1", "cpu-2"])
    assert str(error.value).startswith("cpu-1 runs job(s) 7; cpu-2 is idle in Slurm, not drained")
    assert "ops replace -e node=NAME" in str(error.value)
    assert replaced == []


def test_node_replace_takes_several_nodes_start_and_stop_one(capsys, tmp_path):
    args = cli.build_parser().parse_args(["node", "replace", "cpu-1", "cpu-2", "--image", "newest"])
    assert (args.action, args.names, args.image, args.force) == ("replace", ["cpu-1", "cpu-2"], "newest", False)
    path = tmp_path / "cluster.yaml"
    path.write_text(CONFIG)
    assert cli.main(["-c", str(path), "node", "start", "cpu-1", "cpu-2"]) == 2
    assert "node start: give one node, not 2" in capsys.readouterr().err


NODE_KEYS = ("name", "role", "nodegroup", "address", "state", "image", "slurm_state")


def test_status_shows_each_nodes_image_and_the_newest(tmp_path, monkeypatch, capsys):
    report = {
        "cluster": "demo",
        "provider": "local",
        "image": "img-1",
        "newest_image": "img-2",
        "nodes": [
            dict(zip(NODE_KEYS, ("head", "head", "head", "10.0.0.10", "running", "img-1", None), strict=True)),
            dict(zip(NODE_KEYS, ("cpu-1", "compute", "cpu", "10.0.0.11", "running", "img-2", "idle"), strict=True)),
        ],
        "slurm_error": None,
        "summary": cluster_module.node_counts([NodeStatus("head", "head", "head", None, "running")], {}),
        "cost": None,
    }
    monkeypatch.setattr(cluster_module, "status", lambda config: report)
    path = tmp_path / "cluster.yaml"
    path.write_text(CONFIG)
    assert cli.main(["-c", str(path), "cluster", "status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "cluster demo (local), image img-1 (newest built: img-2; `clusterbake ops image_update` moves the nodes)"
    )
    assert lines[1].split() == ["NODE", "ROLE", "GROUP", "ADDRESS", "STATE", "IMAGE", "SLURM"]
    assert lines[3].split() == ["cpu-1", "compute", "cpu", "10.0.0.11", "running", "img-2", "idle"]
    assert cli.main(["-c", str(path), "cluster", "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"][1]["image"] == "img-2"


def test_image_names_are_shown_short_for_local_images_only():
    assert cluster_module.image_name("/var/lib/clusterbake/images/clusterbake-debian-12-x") == "clusterbake-debian-12-x"
    assert cluster_module.image_name("ami-0123456789abcdef0") == "ami-0123456789abcdef0"
    azure = "/subscriptions/0/resourceGroups/rg/providers/Microsoft.Compute/images/clusterbake-x"
    assert cluster_module.image_name(azure) == azure


def test_ops_says_why_its_playbook_stopped():
    lines = [
        "TASK [Refuse a user the config does not have] ***",
        'fatal: [head]: FAILED! => {"changed": false, "msg": "alice is not in the config\'s users list:\\n add it"}',
        'fatal: [head -> localhost]: FAILED! => {"changed": true, "cmd": ["x"], "rc": 1, "stderr": "no such node"}',
        'failed: [head] (item=cpu-1) => {"ansible_loop_var": "item", "msg": "a loop\'s item"}',
        "fatal: [head]: UNREACHABLE! => {}",
        "PLAY RECAP ***",
    ]
    assert cli.failure_messages(lines) == [
        "head: alice is not in the config's users list: add it",
        "head -> localhost: no such node",
        "head: a loop's item",
    ]


@pytest.fixture
def booted(provider, monkeypatch):
    """LocalProvider._start with the host side (network, overlay mount, nspawn) recorded, not run:
    returns the (node, image root) pairs it mounted."""
    mounted = []
    monkeypatch.setattr("clusterbake.nspawn.network.ensure_node_network", lambda *a, **k: "netns")
    monkeypatch.setattr(
        "clusterbake.nspawn.machines.mount_overlay",
        lambda image_root, paths: (paths.upper.mkdir(parents=True, exist_ok=True), mounted.append(image_root)),
    )
    monkeypatch.setattr("clusterbake.nspawn.machines.spawn", lambda *a, **kw: 1)
    monkeypatch.setattr("clusterbake.nspawn.machines.unmount_tree", lambda path: None)
    monkeypatch.setattr(provider, "_personalize", lambda name, root: None)
    return mounted


def test_a_powered_down_elastic_node_boots_the_clusters_new_image(provider, booted, tmp_path):
    old, new = tmp_path / "images" / "old", tmp_path / "images" / "new"
    for name in ("cpu-1", "burst-1"):
        provider._start(name)
    assert booted == [old / "rootfs", old / "rootfs"]
    provider.use_image(new)
    provider._start("cpu-1")  # a static node keeps its disk, and its image
    provider._start("burst-1")  # an elastic one gets a new disk of the cluster's image
    assert booted[2:] == [old / "rootfs", new / "rootfs"]
    assert (provider.disk_image("cpu-1"), provider.disk_image("burst-1")) == (old, new)
