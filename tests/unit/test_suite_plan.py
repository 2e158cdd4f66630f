"""`make test`'s plan (tests/suite.py) and its time table (tests/timetable.py): every node test
module runs in exactly one lane; lanes can run side by side because every test cluster has a name
and subnet of its own; the time table records what each module, fixture and cluster boot cost."""

from __future__ import annotations

import ast
import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import suite
import yaml

REPO = Path(__file__).resolve().parents[2]


def test_every_node_test_module_runs_in_exactly_one_lane():
    lanes, early, solo = suite.plan_lanes(suite.node_modules())
    placed = [m for lane in lanes + early + solo for m in lane.modules]
    assert sorted(placed) == suite.node_modules()
    assert len(placed) == len(set(placed))


def test_the_slow_modules_put_first_are_node_less_modules_that_exist():
    assert all((REPO / m).is_file() and m.startswith(tuple(suite.OFFLINE_TESTS)) for m in suite.SLOW_FIRST)
    assert len(set(suite.SLOW_FIRST)) == len(suite.SLOW_FIRST)


def test_the_early_modules_wait_for_every_image_and_run_in_no_lane():
    """An early module changes the host under every node boot (test_many_nodes: the inotify limit): it
    starts once no image build boots a container any more, and no lane runs beside it."""
    lanes, early, _ = suite.plan_lanes(suite.node_modules())
    assert [lane.modules for lane in early] == [[m] for m in suite.EARLY]
    assert all(lane.images == tuple(suite.IMAGES) for lane in early)
    assert not set(suite.EARLY) & {m for lane in lanes for m in lane.modules}


def test_a_module_no_lane_names_runs_in_the_default_lane():
    lanes, _, _ = suite.plan_lanes([*suite.node_modules(), "tests/integration/test_new.py"])
    assert "tests/integration/test_new.py" in {lane.name: lane for lane in lanes}[suite.DEFAULT_LANE].modules


def test_each_twins_modules_share_one_lane_with_its_image():
    lanes, _, _ = suite.plan_lanes(suite.node_modules())
    for cloud in ("aws", "azure"):
        holding = [lane for lane in lanes if any(m.startswith(f"tests/twin/test_{cloud}") for m in lane.modules)]
        assert len(holding) == 1, cloud
        assert holding[0].images == ("suite", f"{cloud} twin")
    assert all(lane.images == ("suite",) for lane in lanes if "twin" not in lane.name)


def test_the_modules_of_the_shared_local_cluster_share_one_lane():
    """The session fixture `cluster` (tests/integration/cluster.yaml) is one cluster per pytest run."""
    users = set()
    for path in (REPO / "tests" / "integration").glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.FunctionDef)
                and node.name.startswith("test_")
                and "cluster" in [a.arg for a in node.args.args]
            ):
                users.add(str(path.relative_to(REPO)))
    assert len(users) >= 3, users
    lanes, _, _ = suite.plan_lanes(suite.node_modules())
    assert [lane.name for lane in lanes if users & set(lane.modules)] == ["shared"]


def test_test_clusters_have_names_and_subnets_of_their_own():
    """Lanes run clusters side by side: no two may share a bridge (named by the cluster) or a subnet."""
    configs = {p.name: yaml.safe_load(p.read_text()) for p in (REPO / "tests" / "integration").glob("*.yaml")}
    names = [c["cluster_name"] for c in configs.values()]
    assert len(names) == len(set(names)), names
    subnets = [ipaddress.ip_network(c["local"]["subnet"]) for c in configs.values()]
    subnets += [ipaddress.ip_network("10.90.0.0/16"), ipaddress.ip_network("10.91.0.0/16")]  # the twins' networks
    for i, a in enumerate(subnets):
        for b in subnets[i + 1 :]:
            assert not a.overlaps(b), (a, b)


def test_the_time_table_has_each_module_its_fixtures_and_cluster_boots(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "import time, pytest\n"
        "from timetable import boots_cluster\n"
        "@pytest.fixture(scope='module')\n"
        "def base():\n    time.sleep(0.2)\n"
        "@pytest.fixture(scope='module')\n"
        "@boots_cluster('local 1+2')\n"
        "def cluster(base):\n    time.sleep(0.3)\n    yield\n    time.sleep(0.1)\n"
    )
    (tmp_path / "test_a.py").write_text(
        "def test_one(cluster):\n    pass\n\ndef test_two(cluster):\n    assert False\n"
    )
    (tmp_path / "test_b.py").write_text("import time\n\ndef test_slow():\n    time.sleep(0.2)\n")
    table = tmp_path / "times.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "timetable", f"--timetable={table}", "--timetable-name=demo",
         "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr  # test_two fails
    data = json.loads(table.read_text())
    assert data["name"] == "demo" and data["exitstatus"] == 1
    modules = {m["module"]: m for m in data["modules"]}
    a, b = modules["test_a.py"], modules["test_b.py"]
    assert (a["tests"], a["passed"], a["failed"], b["tests"], b["passed"]) == (2, 1, 1, 1, 1)
    # The cluster's own setup time, without the fixture it asked for; its teardown in the module's time.
    [boot] = a["clusters"]
    assert boot["shape"] == "local 1+2" and 0.3 <= boot["seconds"] < 0.45
    assert a["seconds"] >= 0.6 and b["seconds"] >= 0.2
    fixtures = {f["fixture"]: f for f in data["fixtures"]}
    assert fixtures["base"]["setups"] == 1 and 0.2 <= fixtures["base"]["seconds"] < 0.35
