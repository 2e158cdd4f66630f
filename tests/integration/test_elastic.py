"""Elastic node groups on the local provider: Slurm powers nodes up for jobs and down when idle.

The cluster of tests/integration/elastic.yaml has no static compute node and up to 4
elastic ones. Slurm's ResumeProgram and SuspendProgram on the head (role slurm_power)
ask the host's power agent to start and stop them; the reconcile loop on the head
(every 10 s here) stops machines running behind powered-down nodes and returns nodes left
DOWN by a failed resume. The tests run in order on one cluster.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from localtest import REPO, cb, on, run
from polling import submit_and_time_the_start, wait_for
from timetable import boots_cluster

from clusterbake.config import load_config
from clusterbake.state import StateDir

pytestmark = pytest.mark.integration
CONFIG = REPO / "tests" / "integration" / "elastic.yaml"
STATE = StateDir.for_config(load_config(CONFIG)).cluster("citelastic").root  # CLUSTERBAKE_STATE_DIR too


@pytest.fixture(scope="module")
@boots_cluster("local 1+0..4 elastic (elastic.yaml)")
def elastic(image, tmp_path_factory):
    run(["make", "cluster", f"CONFIG={CONFIG}"], timeout=600)
    yield
    run(["make", "destroy", f"CONFIG={CONFIG}"], timeout=300)


def head(command, **kwargs):
    return on("head", command, config=CONFIG, **kwargs)


def slurm_states() -> dict[str, str]:
    return dict(line.split() for line in head("sinfo --noheader --Node --format='%N %t'").stdout.splitlines())


def machines() -> dict[str, str]:
    report = json.loads(cb("cluster", "status", "--json", config=CONFIG).stdout)
    return {n["name"]: n["state"] for n in report["nodes"] if n["role"] == "compute"}


def test_elastic_nodes_start_powered_down(elastic):
    assert slurm_states() == {f"cpu-{i}": "idle~" for i in range(1, 5)}
    assert set(machines().values()) == {"absent"}


def test_a_job_powers_its_nodes_up_and_runs(elastic):
    job, took = submit_and_time_the_start(
        lambda script, timeout: head(script, timeout=timeout).stdout, "-N4 -o /shared/up.out", "srun hostname; sleep 10"
    )
    print(f"sbatch -N4 on powered-down nodes to RUNNING: {took:.1f}s")
    # Looked at while the job runs: once it ends, idle_time (20 s) may already power them down.
    assert set(machines().values()) == {"running"}
    wait_for(f"job {job} completed", lambda: "JobState=COMPLETED" in head(f"scontrol show job {job}").stdout, 120)
    assert sorted(head("cat /shared/up.out").stdout.split()) == [f"cpu-{i}" for i in range(1, 5)]


AGENT_PROBE = """
import http.client, socket, sys
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect("/run/clusterbake-power-agent/agent.sock")
c = Unix("localhost", timeout=10); c.request("GET", "/nodes"); print(c.getresponse().status)
"""


def test_only_the_head_reaches_the_power_agent_and_only_with_its_token(elastic):
    """Security finding 17: the agent took its bearer token over HTTP on the bridge. Now it listens on a
    Unix socket that only the head has; a request there without the token is refused."""
    assert head("test -S /run/clusterbake-power-agent/agent.sock && echo socket").stdout.strip() == "socket"
    assert head(f"python3 -c {shlex.quote(AGENT_PROBE)}").stdout.strip() == "401"
    assert f"power agent on {STATE}/power-agent/agent.sock" in (STATE / "logs" / "power-agent.log").read_text()
    # Nothing listens on the bridge any more (the agent's old port on the host's address).
    host = load_config(CONFIG).local.subnet.rsplit(".", 1)[0] + ".1"
    probe = f"import socket; print(socket.socket().connect_ex(('{host}', 6820)))"
    assert head(f"python3 -c {shlex.quote(probe)}").stdout.strip() != "0"


def test_idle_nodes_power_down_after_idle_time(elastic):
    # idle_time 20 s, then idle% for at most suspend_timeout (10 s), then idle~.
    wait_for("all idle~", lambda: set(slurm_states().values()) == {"idle~"}, timeout=120)
    wait_for("no machine running", lambda: set(machines().values()) <= {"absent", "stopped"}, timeout=30)
    log = head("cat /var/log/clusterbake/power.log").stdout
    assert "suspend cpu-1,cpu-2,cpu-3,cpu-4 (idle past their idle_time)" in log


def inject(kind: str, node: str):
    """A power agent failure for one node: resume-fail (no capacity) or suspend-fail (the stop call fails)."""
    run(["sh", "-c", f"mkdir -p {STATE}/inject && echo {node} > {STATE}/inject/{kind}"])


def clear_injections():
    run(["rm", "-rf", f"{STATE}/inject"])


def reasons() -> str:
    return head("sinfo -R --noheader --format='%N|%E'").stdout  # the default format cuts reasons at 20


def test_a_failed_resume_requeues_the_job_and_the_node_returns_after_the_cool_down(elastic):
    inject("resume-fail", "cpu-2")
    try:
        job = head("sbatch --parsable --requeue -N1 -w cpu-2 -o /shared/retry.out --wrap hostname").stdout.strip()
        reason = wait_for(
            "cpu-2 down",
            lambda: re.search(r"cpu-2\|clusterbake: resume failed: injected failure", reasons()),
            timeout=60,
        )
        assert reason
        state = head(f"scontrol show job {job}").stdout
        assert "JobState=PENDING" in state  # requeued, not lost
    finally:
        clear_injections()
    # The reconcile loop (every 10 s) returns cpu-2 after failed_node_cooldown (15 s); the
    # requeued job is eligible again after the requeue delay (cred_expire + 1: 31 s).
    wait_for(
        "the requeued job done",
        lambda: "COMPLETED" in head(f"scontrol show job {job}").stdout,
        timeout=300,
        describe=lambda: head(f"scontrol show job {job}; sinfo -N").stdout,
    )
    assert head("cat /shared/retry.out").stdout.strip() == "cpu-2"
    # One requeue per failed resume of cpu-2 (Slurm may try again before the injection is cleared:
    # a loaded host sees two), and the job ran once it was back.
    power_log = head("cat /var/log/clusterbake/power.log").stdout
    failed_resumes = power_log.count("DOWN cpu-2: clusterbake: resume failed: injected failure")
    restarts = int(re.search(r"Restarts=(\d+)", head(f"scontrol show job {job}").stdout).group(1))
    assert 1 <= failed_resumes == restarts, (failed_resumes, restarts)
    assert "cpu-2 down since" in power_log


def test_a_machine_running_behind_a_powered_down_node_is_stopped(elastic):
    # A stop call that fails: Slurm has cpu-3 powered down (idle~), its machine still runs.
    inject("suspend-fail", "cpu-3")
    try:
        head("sbatch --wait -N1 -w cpu-3 -o /dev/null --wrap true", timeout=300)
        wait_for(
            "the failed suspend of cpu-3",
            lambda: "suspend cpu-3 failed: injected failure" in head("cat /var/log/clusterbake/power.log").stdout,
            timeout=120,
        )
        wait_for("cpu-3 idle~", lambda: slurm_states()["cpu-3"] == "idle~", timeout=60)
        assert machines()["cpu-3"] == "running"
    finally:
        clear_injections()
    # The reconcile loop (every 10 s) stops it once it has run orphan_grace (10 s) behind idle~.
    wait_for("cpu-3 stopped by the reconcile loop", lambda: machines()["cpu-3"] != "running", timeout=120)
    assert "cpu-3 runs although Slurm powered it down: stopping it" in head("cat /var/log/clusterbake/power.log").stdout
    assert slurm_states()["cpu-3"] == "idle~"


def test_growing_max_count_keeps_every_address(elastic, tmp_path):
    before = {
        n["name"]: n["address"] for n in json.loads(cb("cluster", "status", "--json", config=CONFIG).stdout)["nodes"]
    }
    grown = yaml.safe_load(CONFIG.read_text())
    grown["node_groups"][0]["max_count"] = 6
    path = tmp_path / "elastic.yaml"
    path.write_text(yaml.safe_dump(grown))
    cb("cluster", "up", config=path, timeout=600)
    after = {
        n["name"]: n["address"] for n in json.loads(cb("cluster", "status", "--json", config=path).stdout)["nodes"]
    }
    assert {name: after[name] for name in before} == before
    assert {"cpu-5", "cpu-6"} <= set(after) and len(set(after.values())) == len(after)
    assert {"cpu-5": "idle~", "cpu-6": "idle~"}.items() <= slurm_states().items()
    # Back to the config the module started with (nodes 5 and 6 leave slurm.conf again).
    cb("cluster", "up", timeout=600, config=CONFIG)


def changed_tasks() -> list[str]:
    """The tasks the latest `cluster up` changed, from its Ansible log."""
    log = max(Path(STATE, "logs").glob("cluster-up-*.log"), key=lambda p: p.stat().st_mtime)
    task, changed = "", []
    for line in log.read_text().splitlines():
        if line.startswith("TASK ["):
            task = line
        elif line.startswith("changed:"):
            changed.append(f"{task} {line}")
    return changed


def test_a_second_cluster_up_changes_nothing(elastic):
    result = cb("cluster", "up", config=CONFIG, timeout=600)
    assert ", 0 changed tasks" in result.stdout, changed_tasks()
