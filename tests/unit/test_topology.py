"""topology.conf's switches from where each node hangs (clusterbake.topology), and the local
provider's declared layout (local.topology) checked before anything is made."""

import re
import textwrap

import pytest

from clusterbake.config import load_config
from clusterbake.errors import ConfigError
from clusterbake.inventory import cluster_vars
from clusterbake.topology import TopologyError, check_paths, leaf_of, switches

# EC2's shape (DescribeInstanceTopology's NetworkNodes, top first): 3 levels.
PATHS = {
    "p5-1": ["nn-a", "nn-b1", "nn-c1"],
    "p5-2": ["nn-a", "nn-b1", "nn-c1"],
    "p5-3": ["nn-a", "nn-b1", "nn-c2"],
    "p5-4": ["nn-a", "nn-b2", "nn-c3"],
}


def test_leaves_hold_their_nodes_compressed_and_each_switch_its_children():
    assert switches(PATHS, [f"p5-{i}" for i in range(1, 5)]) == [
        {"name": "nn-c1", "nodes": "p5-[1-2]"},
        {"name": "nn-c2", "nodes": "p5-3"},
        {"name": "nn-c3", "nodes": "p5-4"},
        {"name": "nn-a", "switches": "nn-b1,nn-b2"},
        {"name": "nn-b1", "switches": "nn-c1,nn-c2"},
        {"name": "nn-b2", "switches": "nn-c3"},
    ]  # one top (nn-a): no root added


def test_nodes_without_a_place_hang_under_a_leaf_of_their_own_below_one_root():
    lines = switches(PATHS, [f"p5-{i}" for i in range(1, 7)])
    assert {"name": "unplaced", "nodes": "p5-[5-6]"} in lines
    assert lines[-1] == {"name": "root", "switches": "nn-a,unplaced"}
    assert leaf_of(lines)["p5-6"] == "unplaced" and leaf_of(lines)["p5-3"] == "nn-c2"


def test_no_known_place_is_no_topology():
    assert switches({}, ["cpu-1"]) == []
    assert switches(PATHS, ["cpu-1"]) == []  # none of the cluster's nodes is placed


def test_clouds_paths_may_differ_in_depth_a_declared_layouts_may_not():
    """EC2 answers 4 network nodes for p6-b200 and 3 for p5, under the same top."""
    mixed = {"p5-1": ["nn-a", "nn-b1", "nn-c1"], "b200-1": ["nn-a", "nn-b2", "nn-c2", "nn-d1"]}
    assert switches(mixed, mixed)[-1] == {"name": "nn-c2", "switches": "nn-d1"}
    with pytest.raises(TopologyError, match="the same number of switches"):
        check_paths(mixed, "local.topology")


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        ({"a": ["s1", "l1"], "b": ["s2", "l1"]}, "'l1' hangs under both 's1' and 's2'"),
        ({"a": ["s1", "l1"], "b": ["l1", "l2"]}, "'l1' is on two levels"),
        ({"a": ["bad name"]}, "switch name 'bad name'"),
        ({"a": ["root"]}, "switch name 'root'"),
    ],
)
def test_paths_that_make_no_tree_are_refused(paths, message):
    with pytest.raises(TopologyError, match=message):
        switches(paths, paths)


def config_with(tmp_path, topology: str) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        textwrap.dedent(
            """
            cluster_name: demo
            node_groups:
              - name: cpu
                count: 4
            local:
              topology:
            """
        )
        + textwrap.indent(textwrap.dedent(topology), "    ")
    )
    return path


def test_the_declared_layout_becomes_the_inventorys_switches(tmp_path):
    config = load_config(config_with(tmp_path, "cpu-[1,3]: [spine, leaf-a]\ncpu-[2,4]: [spine, leaf-b]\n"))
    assert cluster_vars(config)["clusterbake_topology"] == [
        {"name": "leaf-a", "nodes": "cpu-[1,3]"},
        {"name": "leaf-b", "nodes": "cpu-[2,4]"},
        {"name": "spine", "switches": "leaf-a,leaf-b"},
    ]


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("cpu-[1-5]: [leaf]\n", "local.topology: cpu-5 (of 'cpu-[1-5]') is not a compute node"),
        ("cpu-[1-2]: [leaf]\ncpu-2: [leaf]\n", "local.topology: cpu-2 is placed twice"),
        ("cpu-[1-: [leaf]\n", "local.topology: 'cpu-[1-' is not a hostlist"),
        ("cpu-1: [s1, leaf]\ncpu-2: [s2, leaf]\n", "'leaf' hangs under both"),
    ],
)
def test_a_layout_that_does_not_fit_the_cluster_names_what_is_wrong(tmp_path, layout, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(config_with(tmp_path, layout))


def test_nodes_ec2_will_place_once_they_run_are_a_tree_before_any_runs():
    """A p5 group with no instance running yet (all elastic, powered down): every node under `unplaced`,
    so that slurm.conf has TopologyPlugin from the first `cluster up` and the head's reconcile loop
    places them as they start (adding the plugin later would restart slurmctld)."""
    assert switches({}, ["p5-2", "p5-1"], expected=True) == [{"name": "unplaced", "nodes": "p5-[1-2]"}]
    assert switches({}, [], expected=True) == []
    assert switches(PATHS, ["p5-1", "p5-9"], expected=True) == switches(PATHS, ["p5-1", "p5-9"])
