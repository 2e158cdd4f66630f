"""The ops playbooks of ansible/ops on a live cluster with a job running: the job survives each
(replace a node, users, the munge key, a slurm.conf change, a rolling image update), and what the
playbook changed is consistent with the config: a second `cluster up` finds nothing to do.

The cluster (tests/integration/ops.yaml) boots the suite's image; the rolling update moves it to a
second image (the same config with a package pin), whose build starts in the background as the
module starts, so that it runs while the other tests wait on their jobs and nodes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from localtest import CB, REPO, cb, on, run
from polling import wait_for
from timetable import boots_cluster

from clusterbake.config import load_config
from clusterbake.state import StateDir

CONFIG = REPO / "tests" / "integration" / "ops.yaml"
CLUSTER_DIR = StateDir.for_config(load_config(CONFIG)).cluster("opstest")
MEMORY = "64M"
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


@pytest.fixture(scope="module")
@boots_cluster("local 1+2 (ops.yaml)")
def ops_cluster():
    cb("image", "build", config=CONFIG, timeout=1800)
    up = cb("cluster", "up", config=CONFIG, timeout=600)
    yield up
    cb("cluster", "down", config=CONFIG, timeout=300)


@dataclass
class NewerImage:
    config: Path  # ops.yaml with `less` pinned to the version the cluster's image has
    build: subprocess.Popen  # `clusterbake image build` of it


@pytest.fixture(scope="module", autouse=True)
def newer_image(ops_cluster, tmp_path_factory):
    """The rolling update's newer image, built in the background from the module's start on."""
    current = json.loads(cb("cluster", "status", "--json", config=CONFIG).stdout)
    less = json.loads((Path(current_image_dir(current)) / "manifest.json").read_text())["versions"]["packages"]["less"]
    image = {**yaml.safe_load(CONFIG.read_text())["image"], "package_pins": {"less": less}}
    config = config_with(tmp_path_factory.mktemp("newer"), "newer.yaml", image=image)
    build = subprocess.Popen(
        [*CB, "--config", str(config), "image", "build"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    yield NewerImage(config, build)
    if build.poll() is None:  # the module ended early: stop the build (SIGINT: it removes its leftovers)
        build.send_signal(signal.SIGINT)
        build.communicate(timeout=120)


def ops(name: str, *args: str, config: Path = CONFIG, check: bool = True):
    return cb("ops", name, *args, config=config, check=check, timeout=900)


def head(command: str, config: Path = CONFIG, **kwargs):
    return on("head", command, config=config, **kwargs)


def config_with(tmp_path: Path, name: str, **changes) -> Path:
    data = yaml.safe_load(CONFIG.read_text())
    data.update(changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def submit(command: str, user: str = "researcher", nodes: str = "cpu-1", output: str = "/dev/null") -> str:
    """A job on `nodes` (a little memory: without --mem a job takes all of a node's, and no other
    job could share it)."""
    job = head(f"runuser -u {user} -- sbatch --parsable --mem={MEMORY} -D /tmp -w {nodes} -N{nodes.count(',') + 1} "
               f"-o {output} "
               f"--wrap {json.dumps(command)}").stdout.strip()  # fmt: skip
    wait_for(f"job {job} running", lambda: job_state(job) == "RUNNING", 60, lambda: job_state(job))
    return job


def job_state(job: str) -> str:
    found = re.search(r"JobState=(\S+)", head(f"scontrol show job {job}", check=False).stdout)
    return found.group(1) if found else "unknown"


def job_result(job: str, timeout: float = 180) -> str:
    """The job's end state and exit code once it ended, e.g. COMPLETED 0:0."""
    wait_for(f"job {job} ended", lambda: job_state(job) in ENDED, timeout, lambda: job_state(job))
    exit_code = re.search(r" ExitCode=(\S+)", head(f"scontrol show job {job}").stdout).group(1)
    return f"{job_state(job)} {exit_code}"


def node_states() -> dict[str, str]:
    out = head("sinfo -h -N -o '%N %t'").stdout
    return dict(line.split() for line in out.splitlines())


def second_up_skips(config: Path = CONFIG) -> None:
    again = cb("cluster", "up", config=config, timeout=600)
    assert "nothing changed since the last configure" in again.stderr, again.stderr[-3000:]
    assert "join bundle applied" not in again.stderr


def sha256_on(node: str, path: str) -> str:
    return on(node, f"sha256sum {path}", config=CONFIG).stdout.split()[0]


def test_replace_waits_for_the_job_then_gives_the_node_a_new_disk(ops_cluster):
    machine_id = on("cpu-1", "cat /etc/machine-id", config=CONFIG).stdout.strip()
    job = submit("sleep 25")
    check = ops("replace", "-e", "node=cpu-1", "--check")
    assert "0 changed (check mode)" in check.stdout
    assert node_states()["cpu-1"] in ("alloc", "mix")  # not drained

    started = time.monotonic()
    ops("replace", "-e", "node=cpu-1")
    assert time.monotonic() - started > 10, "the node was replaced before its job ended"
    assert job_result(job) == "COMPLETED 0:0"  # the job ran to its end
    assert on("cpu-1", "cat /etc/machine-id", config=CONFIG).stdout.strip() != machine_id  # a new disk
    # Resumed; a new node is "idle*" (not responding) until slurmctld's next ping: wait for that.
    wait_for("cpu-1 idle", lambda: node_states()["cpu-1"] == "idle", 60, node_states)
    assert on("cpu-1", "id -u researcher", config=CONFIG).stdout.strip() == "2001"  # joined by itself
    assert sorted(head("srun -N2 hostname").stdout.split()) == ["cpu-1", "cpu-2"]

    # A node whose job outlasts the timeout: nothing replaced, the job runs on, the node stays drained.
    job = submit("sleep 900", nodes="cpu-2")
    machine_id = on("cpu-2", "cat /etc/machine-id", config=CONFIG).stdout.strip()
    late = ops("replace", "-e", "node=cpu-2", "-e", "drain_timeout=5", check=False)
    assert late.returncode == 1
    assert "cpu-2 still run job(s) after 5 s" in late.stderr and "no job was stopped" in late.stderr
    assert job_state(job) == "RUNNING" and node_states()["cpu-2"] == "drng"
    assert on("cpu-2", "cat /etc/machine-id", config=CONFIG).stdout.strip() == machine_id
    head(f"scancel {job}")
    ops("resume", "-e", "nodes=cpu-2")
    # By hand, a node in service is refused: Slurm could start a job there.
    wait_for("cpu-2 idle", lambda: node_states()["cpu-2"] == "idle", 60, node_states)
    refused = cb("node", "replace", "cpu-2", config=CONFIG, check=False)
    assert refused.returncode == 1 and "cpu-2 is idle in Slurm, not drained" in refused.stderr
    second_up_skips()


def test_users_are_added_and_removed_across_the_cluster(ops_cluster, tmp_path):
    with_alice = config_with(
        tmp_path, "alice.yaml", users=[{"name": "researcher", "uid": 2001}, {"name": "alice", "uid": 2002}]
    )
    job = submit("sleep 900")
    refused = ops("user_add", "-e", "name=alice", check=False)
    assert refused.returncode == 1 and "alice is not in the config's users list" in refused.stderr

    assert "0 changed (check mode)" in ops("user_add", "-e", "name=alice", "--check", config=with_alice).stdout
    assert head("getent passwd alice", check=False).returncode == 2
    ops("user_add", "-e", "name=alice", config=with_alice)
    for node in ("head", "cpu-1", "cpu-2"):
        assert on(node, "id alice", config=CONFIG).stdout.startswith("uid=2002(alice) gid=2002(alice)"), node
    assert head("stat -c '%u %g' /home/alice").stdout.strip() == "2002 2002"
    bundle = json.loads((CLUSTER_DIR.join_bundles / "cpu.json").read_text())
    assert [u["name"] for u in bundle["users"]] == ["researcher", "alice"]  # a node booted later has alice
    second_up_skips(with_alice)
    head(f"runuser -u alice -- srun --mem={MEMORY} -N2 true")  # while researcher's job runs

    # Removing: never a name that is a path (security review finding 16: `name=..` with remove_home
    # passed every check and removed /home/.., that is /), not while the config has alice, nor while
    # alice has a job.
    climbing = ops("user_remove", "-e", "name=..", "-e", "remove_home=true", check=False)
    assert climbing.returncode != 0 and "not a login name" in climbing.stderr + climbing.stdout
    assert head("test -d /etc && test -d /home/researcher", check=False).returncode == 0
    still = ops("user_remove", "-e", "name=alice", config=with_alice, check=False)
    assert still.returncode == 1 and "alice is still in the config's users list" in still.stderr
    alice_job = submit("sleep 900", user="alice", nodes="cpu-2")
    busy = ops("user_remove", "-e", "name=alice", check=False)
    assert busy.returncode == 1 and f"alice has jobs ({alice_job} RUNNING cpu-2)" in busy.stderr
    assert job_state(alice_job) == "RUNNING"
    head(f"scancel {alice_job}")
    wait_for("alice's job gone", lambda: job_state(alice_job) in ENDED, 60)
    wait_for("alice's processes gone", lambda: on("cpu-2", "pgrep -u 2002", config=CONFIG, check=False).returncode, 30)

    ops("user_remove", "-e", "name=alice", "-e", "remove_home=true")
    for node in ("head", "cpu-1", "cpu-2"):
        assert on(node, "getent passwd alice", config=CONFIG, check=False).returncode == 2, node
        assert on(node, "getent group alice", config=CONFIG, check=False).returncode == 2, node
    assert head("test -e /home/alice", check=False).returncode == 1
    assert job_state(job) == "RUNNING"  # researcher's job never noticed
    head(f"scancel {job}")


def test_munge_key_rotation_keeps_a_running_job(ops_cluster):
    old_key = hashlib.sha256(CLUSTER_DIR.munge_key.read_bytes()).hexdigest()
    head("munge -n > /shared/ops-old.cred")
    # A job with a step before the rotation and one after it, on both nodes.
    head("rm -f /shared/ops-rotated")
    job = submit(
        "srun hostname; while [ ! -e /shared/ops-rotated ]; do sleep 1; done; srun hostname",
        nodes="cpu-1,cpu-2",
        output="/shared/ops-munge-%j.out",
    )
    assert "0 changed (check mode)" in ops("munge_key", "--check").stdout
    assert hashlib.sha256(CLUSTER_DIR.munge_key.read_bytes()).hexdigest() == old_key

    started = time.monotonic()
    ops("munge_key")
    rotated_in = time.monotonic() - started
    new_key = hashlib.sha256(CLUSTER_DIR.munge_key.read_bytes()).hexdigest()
    assert new_key != old_key and CLUSTER_DIR.munge_key.stat().st_mode & 0o777 == 0o600
    for node in ("head", "cpu-1", "cpu-2"):
        assert sha256_on(node, "/etc/munge/munge.key") == new_key, node
    for bundle in CLUSTER_DIR.join_bundles.glob("*.json"):
        files = {f["path"]: f for f in json.loads(bundle.read_text())["files"]}
        assert hashlib.sha256(base64.b64decode(files["/etc/munge/munge.key"]["content_b64"])).hexdigest() == new_key
        assert bundle.stat().st_mode & 0o777 == 0o600
    # Credentials of the new key decode across nodes; one of the old key nowhere.
    head("munge -n > /shared/ops-new.cred")
    on("cpu-1", "munge -n > /shared/ops-new-cpu1.cred", config=CONFIG)
    assert re.match(r"STATUS:\s+Success", on("cpu-2", "unmunge < /shared/ops-new.cred", config=CONFIG).stdout)
    assert re.match(r"STATUS:\s+Success", head("unmunge < /shared/ops-new-cpu1.cred").stdout)
    for node in ("head", "cpu-1"):
        old = on(node, "unmunge < /shared/ops-old.cred", config=CONFIG, check=False)
        assert old.returncode != 0 and "Invalid credential" in old.stderr, (node, old.stderr)

    assert job_state(job) == "RUNNING"
    head("touch /shared/ops-rotated")
    assert job_result(job) == "COMPLETED 0:0"
    # srun's own notes (e.g. "Step creation temporarily disabled, retrying" while a restarted
    # slurmd registers again) share the job's output file; the steps' hostnames are the rest.
    lines = head(f"cat /shared/ops-munge-{job}.out").stdout.splitlines()
    hostnames = [line.strip() for line in lines if line.strip() and not line.startswith("srun:")]
    assert sorted(hostnames) == ["cpu-1", "cpu-1", "cpu-2", "cpu-2"], lines  # both steps ran on both nodes
    assert sorted(head("srun -N2 hostname").stdout.split()) == ["cpu-1", "cpu-2"]  # new jobs run
    starts = [
        float(on(n, "journalctl -u munge -o short-unix --no-pager | grep 'Started munge' | tail -1", config=CONFIG)
              .stdout.split()[0])
        for n in ("head", "cpu-1", "cpu-2")
    ]  # fmt: skip
    print(f"munge key rotated in {rotated_in:.1f}s; munge restarted on 3 nodes within {max(starts) - min(starts):.3f}s")
    second_up_skips()


def _log_of(result) -> str:
    """The ops run's ansible log (the CLI names it on stderr): the playbook's debug messages."""
    log = re.search(r"log: (\S+)", result.stderr).group(1)
    return Path(log).read_text()


def test_db_password_rotation_keeps_accounting_and_retires_the_old_password(ops_cluster):
    """Security finding 14: the accounting database's password could not be rotated. A job that ends
    while MariaDB and slurmdbd restart keeps its record."""
    password_file = CLUSTER_DIR.db_password
    old = hashlib.sha256(password_file.read_bytes()).hexdigest()
    job = submit("sleep 20", output="/dev/null")
    assert "0 changed (check mode)" in ops("db_password", "--check").stdout
    assert hashlib.sha256(password_file.read_bytes()).hexdigest() == old

    rotated = ops("db_password")
    new = password_file.read_bytes()
    assert hashlib.sha256(new).hexdigest() != old and password_file.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in password_file.parent.iterdir() if "password" in p.name) == [password_file.name]
    assert new.decode().strip() not in rotated.stdout + rotated.stderr  # never printed
    # The head's slurmdbd.conf has it (compared by digest, not printed), and slurmdbd works with it.
    conf = head("sed -n 's/^StoragePass=//p' /etc/slurm/slurmdbd.conf | tr -d '\\n' | sha256sum").stdout.split()[0]
    assert conf == hashlib.sha256(new.strip()).hexdigest()
    assert job_result(job) == "COMPLETED 0:0"
    wait_for(
        f"job {job} in the accounting database",
        lambda: "COMPLETED" in head(f"sacct -n -X -j {job} -o State").stdout,
        timeout=120,
    )
    second_up_skips()


def test_rolling_image_update_moves_each_group_and_keeps_jobs(ops_cluster, newer_image):
    current = json.loads(cb("cluster", "status", "--json", config=CONFIG).stdout)
    built, _ = newer_image.build.communicate(timeout=1800)
    assert newer_image.build.returncode == 0, built[-4000:]
    newer = newer_image.config
    status = json.loads(cb("cluster", "status", "--json", config=newer).stdout)
    assert status["newest_image"] != status["image"], status
    target = status["newest_image"]

    job = submit("sleep 25")
    ops("drain", "-e", "nodes=cpu-2", "-e", "reason=bad DIMM")  # an operator's drain: it stays
    check = ops("image_update", "--check", config=newer)
    assert "0 changed (check mode)" in check.stdout
    assert f"newest image {target}" in _log_of(check) and "batches, one after the other: cpu-1, cpu-2" in _log_of(check)
    ops("image_update", config=newer)
    assert job_result(job) == "COMPLETED 0:0"
    status = json.loads(cb("cluster", "status", "--json", config=newer).stdout)
    assert status["image"] == target
    assert {n["name"]: n["image"] for n in status["nodes"]} == {
        "head": current["image"],  # the head keeps Slurm's state: never replaced
        "cpu-1": target,
        "cpu-2": target,
    }
    wait_for("cpu-1 idle, cpu-2 drained", lambda: node_states() == {"cpu-1": "idle", "cpu-2": "drain"}, 60, node_states)
    assert "bad DIMM" in head("sinfo -h -N -n cpu-2 -o %E").stdout
    ops("resume", "-e", "nodes=cpu-2")
    for node in ("cpu-1", "cpu-2"):
        assert "Package: less" in on(node, "cat /etc/apt/preferences.d/clusterbake", config=CONFIG).stdout
    assert ", 0 changed" in ops("image_update", config=newer).stdout  # every node is on it: nothing to do
    assert sorted(head("srun -N2 hostname").stdout.split()) == ["cpu-1", "cpu-2"]
    second_up_skips(newer)


def current_image_dir(report: dict) -> Path:
    return StateDir.for_config(load_config(CONFIG)).images / report["image"]


def test_slurm_conf_changes_reconfigure_or_restart_as_cluster_up_decides(ops_cluster, tmp_path):
    """Last: it leaves the cluster with another task plugin (the module's teardown removes it)."""

    def pids() -> dict[str, str]:
        return {
            "slurmctld": head("pidof slurmctld").stdout.strip(),
            **{n: on(n, "pidof slurmd", config=CONFIG).stdout.strip() for n in ("cpu-1", "cpu-2")},
        }

    partitions = [{"name": "cpu", "node_groups": ["cpu"], "default": True, "max_time": "30"}]
    limited = config_with(tmp_path, "limited.yaml", partitions=partitions)
    plugin = config_with(tmp_path, "plugin.yaml", partitions=partitions, slurm={"task_plugin": "task/none"})
    job = submit("sleep 900", nodes="cpu-1,cpu-2")
    before = pids()

    check = ops("slurm_conf", "--check", config=limited)
    assert "scontrol reconfigure (no daemon restarted) (check mode: nothing changed)" in _log_of(check)
    assert "MaxTime=UNLIMITED" in head("scontrol show partition cpu").stdout
    applied = ops("slurm_conf", config=limited)
    assert "scontrol reconfigure (no daemon restarted)" in _log_of(applied)
    assert "MaxTime=00:30:00" in head("scontrol show partition cpu").stdout
    assert pids() == before
    second_up_skips(limited)

    restarted = ops("slurm_conf", config=plugin)
    assert "restart: slurmctld, and slurmd on every compute node through its join bundle" in _log_of(restarted)
    assert "TaskPlugin              = task/none" in head("scontrol show config").stdout
    after = pids()
    assert all(after[k] != before[k] for k in before), (before, after)
    assert job_state(job) == "RUNNING"
    head(f"scancel {job}")


def test_ops_playbooks_run_with_plain_ansible_playbook(ops_cluster):
    result = run(
        [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", "inventories/local.py",
         "ansible/ops/replace.yml", "-e", "node=cpu-2", "--check"],
        env={"CLUSTERBAKE_CONFIG": str(CONFIG)},
    )  # fmt: skip
    assert "would replace cpu-2 from the current image" in result.stdout
