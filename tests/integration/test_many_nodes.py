"""Many nodes on one host (issue 13): host limits raised from Debian's defaults, a failed boot
that keeps its evidence through the rollback, and teardown of all nodes at once.

The 1+32 cluster takes a minute or two on 2 cores; bench/bringup.py measures the times
(nothing here asserts a duration).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from localtest import CONFIG, cb, on

from clusterbake.config import load_config
from clusterbake.nspawn import machines
from clusterbake.state import StateDir

pytestmark = pytest.mark.integration
INOTIFY = Path("/proc/sys/fs/inotify/max_user_instances")
DEBIAN_DEFAULT = 128


def _config(tmp_path: Path, name: str, subnet: str, count: int, **local) -> Path:
    """tests/integration/cluster.yaml (its image) as another cluster, with `count` small compute nodes."""
    config = yaml.safe_load(CONFIG.read_text())
    # Compute nodes at scale: no login node, and no directory (the shared cluster's server is not up here).
    for section in ("login_nodes", "directory"):
        config.pop(section, None)
    config["cluster_name"] = name
    config["local"] = {"subnet": subnet, **local}
    config["head"] = {"cpus": 1, "memory_mb": 1024}
    config["node_groups"] = [config["node_groups"][0] | {"count": count, "cpus": 1, "memory_mb": 512}]
    config["partitions"] = [p for p in config["partitions"] if p["node_groups"] == ["cpu"]]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _left_on_host(cluster: str) -> list[str]:
    left = [f"node {m}" for m in machines.find_machines(f"cb-{cluster}-")]
    left += [f"netns {p.name}" for p in Path("/run/netns").glob(f"cb-{cluster}-*")]
    left += [f"link {p.name}" for p in Path("/sys/class/net").iterdir() if p.name.startswith(f"cb-{cluster}")]
    mounts = Path("/proc/self/mountinfo").read_text()
    left += [f"mount {line.split()[4]}" for line in mounts.splitlines() if f"/clusters/{cluster}/" in line]
    return left


@pytest.fixture
def debian_limits():
    """fs.inotify.max_user_instances at Debian 12's default for the test; the host's value back after."""
    before = INOTIFY.read_text()
    INOTIFY.write_text(f"{DEBIAN_DEFAULT}\n")
    yield
    INOTIFY.write_text(before)


def test_a_node_that_never_answers_keeps_its_journal_after_the_rollback(image, tmp_path):
    path = _config(tmp_path, "bootfail", "10.75.0.0/24", 1, boot_timeout=10)
    cluster_dir = StateDir.for_config(load_config(path)).cluster("bootfail").root  # CLUSTERBAKE_STATE_DIR too
    (cluster_dir / "inject").mkdir(parents=True, exist_ok=True)
    (cluster_dir / "inject" / "boot-fail").write_text("cpu-1\n")  # its ssh.service masked at boot
    try:
        result = cb("cluster", "up", config=path, check=False, timeout=300)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "cpu-1: injected boot failure (inject/boot-fail)" in result.stderr
        assert "provisioning failed: removing what this run created" in result.stderr
        message = result.stderr.strip().splitlines()[-1]
        assert message.startswith("clusterbake: error: nodes cpu-1 did not answer SSH within 10s")
        kept = [Path(word.rstrip(",")) for word in message.split() if word.startswith(str(cluster_dir))]
        assert [p.name for p in kept] == ["cpu-1.console.log", "cpu-1.journal.txt"]
        assert all(p.is_file() for p in kept), kept  # after the rollback
        journal = kept[1].read_text()
        assert "cpu-1 systemd-journald" in journal and "Reached target" in journal, journal[-2000:]
        assert "Started ssh.service" not in journal
        # The rollback removed everything else: only the logs directory is left of the cluster.
        assert sorted(p.name for p in cluster_dir.iterdir()) == ["logs"]
        assert _left_on_host("bootfail") == []
    finally:
        cb("cluster", "down", config=path, check=False, timeout=300)
    assert not cluster_dir.exists()


# A stand-in network (local.topology): four leaf switches of eight nodes dealt round-robin (a job
# Slurm placed by node name alone would take cpu-[1-8], under all four), two under each spine.
LEAVES = {f"leaf-{k}": [f"cpu-{i}" for i in range(k, 33, 4)] for k in range(1, 5)}
LAYOUT = {f"cpu-[{','.join(n.split('-')[1] for n in nodes)}]": [f"spine-{(k + 1) // 2}", leaf]
          for k, (leaf, nodes) in enumerate(LEAVES.items(), start=1)}  # fmt: skip


def test_one_plus_32_from_debian_defaults_comes_up_and_goes_at_once(image, tmp_path, debian_limits):
    path = _config(tmp_path, "many", "10.74.0.0/24", 32, topology=LAYOUT)
    validate = cb("validate", config=path)
    assert "host limit: fs.inotify.max_user_instances is 128, 33 nodes need about 206" in validate.stdout
    assert "sysctl -w fs.inotify.max_user_instances=1024" in validate.stdout
    try:
        # Inside the try: a `cluster up` that fails (its nodes not idle) leaves 33 nodes running that
        # the lanes after this module would share the machine with (a rehearsal: the whole lanes phase).
        up = cb("cluster", "up", config=path, timeout=900)
        assert "raised fs.inotify.max_user_instances 128 -> 1024 for the running system" in up.stderr
        assert "cluster many is up: 32 compute nodes idle" in up.stdout + up.stderr
        # Raised for the running system, and left so: the nodes still run on it.
        assert INOTIFY.read_text().strip() == "1024"
        assert len(machines.find_machines("cb-many-")) == 33
        # One command on all 32 compute nodes at once: a row each, the full output in the log.
        fan = cb("exec", "--group", "cpu", "--", "hostname; echo second line", config=path, timeout=300)
        rows = [line.split() for line in fan.stdout.splitlines()[1:33]]
        assert rows == [[f"cpu-{i}", "0", f"cpu-{i}"] for i in range(1, 33)]
        assert fan.stdout.splitlines()[33].startswith("32 of 32 nodes exited 0; full output: ")
        log = Path(fan.stdout.split("full output: ")[1].strip())
        assert log.read_text().splitlines().count("second line") == 32  # one per node; the header names the command
        picked = cb("exec", "--nodes", "cpu-[3-4],head", "--", "test $(hostname) != cpu-4", config=path, check=False)
        assert picked.returncode == 1
        assert [line.split()[:2] for line in picked.stdout.splitlines()[1:4]] == [
            ["head", "0"],
            ["cpu-3", "0"],
            ["cpu-4", "1"],
        ]
        # Topology-aware placement: slurmctld has the tree (topology.conf from local.topology, which
        # the configless commands fetch too), and a job that asks for one switch gets one leaf's nodes.
        shown = on("head", "scontrol show topology", config=path).stdout
        assert "SwitchName=root Level=2" in shown and "SwitchName=leaf-2 Level=0" in shown, shown
        job = on("head", "runuser -u researcher -- srun --switches=1 -N 8 hostname", config=path, timeout=120)
        hosts = sorted(job.stdout.split())
        assert len(hosts) == 8 and any(sorted(members) == hosts for members in LEAVES.values()), hosts
    finally:
        down = cb("cluster", "down", config=path, timeout=300)
    assert "removed machine cb-many-cpu-32" in down.stdout + down.stderr
    assert _left_on_host("many") == []
