"""Faults on a real cluster (tests/integration/faults.yaml: 1 head + 3 compute, health checks
and the reconcile loop every 10 s, a 30 s requeue delay): health checks that drain bad nodes
and return them when fixed, a spot reclaim rehearsed with `clusterbake node interrupt`, a node
killed mid-training, the head restarted mid-job. Real Slurm 22.05, munge, DeepSpeed on CPU.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from localtest import CB, REPO, cb, on, up_for_the_module
from polling import drained_by_the_poll_that_saw_the_notice, notice_log_after_the_drain, poll
from timetable import boots_cluster

from clusterbake.cluster import wait_idle
from clusterbake.config import load_config
from clusterbake.errors import ClusterbakeError
from clusterbake.job_report import events
from clusterbake.nspawn import machines
from clusterbake.nspawn.machines import MachinePaths
from clusterbake.providers import get_provider
from clusterbake.state import StateDir

CONFIG = Path(__file__).with_name("faults.yaml")
TRAIN = ["deepspeed/train.py", "--deepspeed_config", "deepspeed/ds_config.json"]
RECORDED = REPO / "tests" / "unit" / "data" / "health"


def fcb(*args, **kwargs):
    return cb(*args, config=CONFIG, **kwargs)


def fon(node, command, **kwargs):
    return on(node, command, config=CONFIG, **kwargs)


@pytest.fixture(scope="module")
@boots_cluster("local 1+3 health (faults.yaml)")
def faults_cluster(image):
    yield from up_for_the_module(CONFIG)


def node_state(node: str) -> tuple[str, str]:
    line = fon("head", f"sinfo --noheader --Node --nodes {node} --format='%T|%E'").stdout.strip()
    state, reason = line.split("|", 1)
    return state, reason


def wait_drained(node: str, reason: str, timeout: float = 60) -> tuple[str, str]:
    found = poll(lambda: node_state(node)[1] == reason and node_state(node), timeout)
    assert found, f"{node} not drained with {reason!r}: {node_state(node)}"
    return found


def wait_back(node: str, timeout: float = 60) -> None:
    assert poll(lambda: node_state(node) == ("idle", "none"), timeout), node_state(node)


def test_every_node_passes_its_health_checks(faults_cluster):
    conf = fon("head", "cat /etc/slurm/slurm.conf").stdout
    assert "HealthCheckProgram=/usr/local/sbin/clusterbake-health" in conf
    assert "HealthCheckInterval=10" in conf and "AuthInfo=cred_expire=30" in conf
    report = fon("cpu-1", "clusterbake-health --report").stdout
    assert report.split() == [w for line in ("mounts", "munge", "slurmd", "restarts", "clock", "disk", "memory")
                              for w in ("ok", line)]  # fmt: skip
    assert fon("cpu-1", "systemctl is-active clusterbake-health.timer clusterbake-notice-agent").stdout.split() == [
        "active",
        "active",
    ]


def test_a_full_disk_drains_the_node_until_space_is_freed(faults_cluster):
    fon(
        "cpu-1",
        "mount -t tmpfs -o size=16m tmpfs /tmp && dd if=/dev/zero of=/tmp/fill bs=1M count=16 status=none",
        check=False,
    )  # fmt: skip  (dd fails with ENOSPC: the point)
    try:
        wait_drained("cpu-1", "clusterbake-health: /tmp has 0 MiB free (needs 64)")
        fon("cpu-1", "umount /tmp")
        wait_back("cpu-1")
    finally:
        fon("cpu-1", "mountpoint -q /tmp && umount /tmp || true")


def test_a_read_only_shared_file_system_drains_the_node(faults_cluster):
    fon("cpu-2", "mount -o remount,bind,ro /shared")
    try:
        wait_drained("cpu-2", "clusterbake-health: /shared is not writable (Read-only file system)")
        fon("cpu-2", "mount -o remount,bind,rw /shared")
        wait_back("cpu-2")
    finally:
        fon("cpu-2", "mount -o remount,bind,rw /shared", check=False)


def test_munge_stopped_drains_through_a_private_munged_and_the_node_returns(faults_cluster):
    # With munge down the node cannot talk to slurmctld (nor can Slurm reach it to run its
    # health check): the node's own timer runs the check and drains through a private munged.
    fon("cpu-3", "systemctl stop munge")
    try:
        state, _ = wait_drained("cpu-3", "clusterbake-health: munge is not running (systemctl status munge)")
        assert state.startswith("drain")
        # `cluster up` that finds a node not idle says Slurm's reason for it.
        with pytest.raises(ClusterbakeError) as not_idle:
            wait_idle(get_provider(load_config(CONFIG)), timeout=1)
        assert "Slurm's reasons: cpu-3: clusterbake-health: munge is not running" in str(not_idle.value)
        assert "through a private munged" in fon("cpu-3", "cat /var/log/clusterbake/health.log").stdout
    finally:
        fon("cpu-3", "systemctl start munge")
    wait_back("cpu-3")


def test_munge_that_dies_is_restarted_and_one_that_keeps_dying_drains(faults_cluster):
    pid = fon("cpu-1", "pidof munged").stdout.strip()
    fon("cpu-1", "kill -9 $(pidof munged)")
    assert poll(lambda: fon("cpu-1", "pidof munged", check=False).stdout.strip() not in ("", pid), 15)
    for _ in range(3):
        before = fon("cpu-1", "pidof munged").stdout.strip()
        fon("cpu-1", "kill -9 $(pidof munged)")
        assert poll(lambda b=before: fon("cpu-1", "pidof munged", check=False).stdout.strip() not in ("", b), 15)
    wait_drained("cpu-1", "clusterbake-health: munge restarted 4 times in 10 min (journalctl -u munge)")
    fon("cpu-1", "systemctl restart munge")  # a person looked; an explicit restart resets the count
    wait_back("cpu-1")


def test_a_bad_infiniband_port_from_a_recorded_ibstat_drains(faults_cluster):
    """The IB check reading an ND H100 v5's ibstat with one link down (recorded: no IB here),
    on a node told it has InfiniBand; written from the host into the node's disk."""
    root = MachinePaths(StateDir.for_config(load_config(CONFIG)).cluster("cifaults").node("cpu-2")).root
    health, ibstat = root / "etc/clusterbake/health.json", root / "usr/local/bin/ibstat"
    original = health.read_text()
    health.write_text(json.dumps({**json.loads(original), "infiniband": {"min_rate": 400, "ports": 8}}))
    recorded = (RECORDED / "ibstat-ndv5-link-down.txt").read_text()
    ibstat.write_text(f"#!/bin/sh\ncat <<'OUT'\n{recorded}OUT\n")
    ibstat.chmod(0o755)
    try:
        wait_drained("cpu-2", "clusterbake-health: mlx5_ib5 port 1 is Down/Polling")
    finally:
        health.write_text(original)
        ibstat.unlink()
    wait_back("cpu-2")


def test_a_node_a_person_drained_stays_drained(faults_cluster):
    fon("head", "scontrol update NodeName=cpu-3 State=DRAIN Reason='disk swap on Monday'")
    time.sleep(25)  # two health check periods with every check passing
    try:
        assert node_state("cpu-3") == ("drained", "disk swap on Monday")
    finally:
        fon("head", "scontrol update NodeName=cpu-3 State=RESUME")
    wait_back("cpu-3")


def test_a_missing_mount_drains_and_a_reboot_of_the_node_brings_it_back(faults_cluster):
    fon("cpu-3", "umount /shared")
    wait_drained("cpu-3", "clusterbake-health: /shared is not mounted")
    # The node powers itself off: the head's reconcile loop sees its machine gone and starts it
    # again (a node clusterbake drained is replaced too); it comes back with its mounts.
    fon("cpu-3", "systemctl poweroff", check=False)
    wait_back("cpu-3", timeout=120)
    assert fon("cpu-3", "mountpoint -q /shared && echo mounted").stdout.strip() == "mounted"
    power_log = fon("head", "cat /var/log/clusterbake/power.log").stdout
    assert "reconcile: cpu-3 lost: started again and returned to service" in power_log


# --- jobs through faults ------------------------------------------------------------------


def submit_training(name: str, steps: int, every: int) -> tuple[str, str]:
    submitted = fcb(
        "job", "submit", "deepspeed", "--nodes", "2", "--upload", str(REPO / "examples/deepspeed"),
        "--job-name", name, "--", *TRAIN, "--steps", str(steps), "--checkpoint-every", str(every),
    ).stdout  # fmt: skip
    job_id = re.search(r"submitted job (\d+)", submitted).group(1)
    return job_id, f"/shared/jobs/researcher/{name}-{job_id}.out"


def job_field(job_id: str, field: str) -> str:
    out = fon("head", f"scontrol show job -o {job_id}", check=False).stdout
    match = re.search(rf"\b{field}=(\S+)", out)
    return match.group(1) if match else ""


def training_events(output: str) -> list[dict]:
    return events(fon("head", f"cat {output} 2>/dev/null || true").stdout)


def wait_until_step(output: str, step: int, timeout: float = 300) -> None:
    reached = poll(lambda: any(e["event"] == "step" and e["step"] >= step for e in training_events(output)), timeout, 1)
    assert reached, f"training did not reach step {step}"


def wait_finished(job_id: str, timeout: float = 600) -> str:
    state = poll(
        lambda: (s := job_field(job_id, "JobState")) in ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "") and s,
        timeout,
        2,
    )
    return state or job_field(job_id, "JobState")


def redone_steps(log: str) -> int:
    """Steps trained twice: the last step of the first run past the checkpoint the second resumed from."""
    first_run = log.split("(restart 1)")[0]
    last_before = max(e["step"] for e in events(first_run) if e["event"] == "step")
    resumed = next(e for e in events(log) if e["event"] == "resumed")
    return last_before - resumed["step"]


def last_node_of(job_id: str) -> str:
    return fon("head", f"scontrol show hostnames $(squeue -h -j {job_id} -o %N) | tail -n 1").stdout.strip()


def test_a_spot_reclaim_mid_training_drains_checkpoints_and_requeues(faults_cluster):
    job_id, output = submit_training("ci-reclaim", steps=30, every=10)
    wait_until_step(output, 5)
    victim = last_node_of(job_id)
    # A 75 s notice (EC2 gives 120 s, Azure 30 s): with 45 s the checkpoint and requeue did not finish
    # before the reclaim once, on 2 cores under the suite's four lanes.
    interrupt = subprocess.Popen(
        [*CB, "--config", str(CONFIG), "node", "interrupt", victim, "--in", "75"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    noticed = time.monotonic()
    try:
        # Drained within the notice, while the node still runs (how soon: bench, not a test).
        found = poll(lambda: node_state(victim)[1].startswith("clusterbake: spot reclaim at"), 75, 0.25)
        print(f"{victim} drained {time.monotonic() - noticed:.1f} s after the notice")
        assert found, node_state(victim)
        assert f"cb-cifaults-{victim}" in machines.find_machines("cb-cifaults-"), "drained only after the reclaim"
        read_log = lambda: fon(victim, "cat /var/log/clusterbake/notice.log").stdout  # noqa: E731
        notice_log = notice_log_after_the_drain(read_log, victim)
        assert drained_by_the_poll_that_saw_the_notice(notice_log, victim), notice_log
        state, reason = node_state(victim)
        assert state.startswith("drain"), state
        assert reason.endswith("(clusterbake node interrupt: terminate)")
        assert wait_finished(job_id) == "COMPLETED"
    finally:
        out, _ = interrupt.communicate(timeout=120)
    assert interrupt.returncode == 0, out
    assert f"{victim}: reclaimed" in out
    log = fon("head", f"cat {output}").stdout
    assert "asking for a checkpoint" in log and "checkpoint written; requeueing job" in log
    done = [e for e in events(log) if e["event"] == "done"][-1]  # the first run's ended at the checkpoint
    assert done["steps"] == 30 and not done["stopped_by_signal"]
    assert redone_steps(log) <= 0  # it checkpointed when told: no step trained twice
    wait_back(victim, timeout=120)  # reclaimed, then started again by the head's reconcile loop


def test_a_node_killed_mid_training_is_replaced_and_the_job_resumes(faults_cluster):
    job_id, output = submit_training("ci-killed", steps=30, every=10)
    poll(lambda: any(e["event"] == "checkpoint" for e in training_events(output)), 300, 1)
    wait_until_step(output, 14)
    victim = last_node_of(job_id)
    machine = f"cb-cifaults-{victim}"
    nspawn = machines.find_machines("cb-cifaults-")[machine]
    init = int(subprocess.run(["pgrep", "-P", str(nspawn)], capture_output=True, text=True).stdout.split()[0])
    subprocess.run(["kill", "-9", str(init)], check=True)  # the node dies: no shutdown, no notice
    assert wait_finished(job_id) == "COMPLETED"
    log = fon("head", f"cat {output}").stdout
    done = [e for e in events(log) if e["event"] == "done"][-1]  # the first run's ended at the checkpoint
    assert done["steps"] == 30 and not done["stopped_by_signal"]
    assert redone_steps(log) <= 10  # at most one checkpoint interval trained twice
    power_log = fon("head", "cat /var/log/clusterbake/power.log").stdout
    assert f"DOWN {victim}: clusterbake: node lost: its machine is not running" in power_log
    wait_back(victim, timeout=120)


def test_the_head_restarted_mid_job_keeps_the_job_and_the_queue(faults_cluster):
    running = fon(
        "head", "runuser -u researcher -- sbatch --parsable -N1 -o /dev/null --wrap 'sleep 45'"
    ).stdout.strip()
    assert poll(lambda: job_field(running, "JobState") == "RUNNING", 60)
    pending = fon(
        "head", "runuser -u researcher -- sbatch --parsable -N3 --exclusive -o /dev/null --wrap 'hostname'"
    ).stdout.strip()
    fcb("node", "stop", "head")
    fcb("node", "start", "head")
    assert job_field(running, "JobState") == "RUNNING"  # slurmctld came back with its saved state
    assert job_field(pending, "JobState") in ("PENDING", "RUNNING", "COMPLETED")
    assert wait_finished(running, timeout=120) == "COMPLETED"
    assert wait_finished(pending, timeout=120) == "COMPLETED"
    again = fcb("cluster", "up", timeout=600)
    assert "0 changed tasks (nothing to configure)" in again.stdout, again.stdout + again.stderr


def kill_supervisor(node: str) -> int:
    """SIGKILL the node's systemd-nspawn: the node's init runs on, supervised by nothing."""
    machine = f"cb-cifaults-{node}"
    nspawn = machines.find_machines("cb-cifaults-")[machine]
    subprocess.run(["kill", "-9", str(nspawn)], check=True)
    orphan = poll(lambda: machines.find_orphans(machine).get(machine), 10, 0.2)
    assert orphan, f"{node}'s init did not outlive its nspawn"
    return orphan


def test_a_node_whose_supervisor_died_is_reported_recovered_and_ended(faults_cluster):
    init = kill_supervisor("cpu-2")
    status = fcb("cluster", "status").stdout
    assert re.search(r"^cpu-2 .* orphaned ", status, re.M), status
    assert f"cpu-2: its nspawn supervisor died; its init (PID {init}) runs on: `cluster up` restarts it" in status
    up = fcb("cluster", "up", timeout=600)
    assert "cpu-2: its nspawn supervisor had died" in up.stderr
    assert not machines.alive(init)
    assert "cb-cifaults-cpu-2" in machines.find_machines("cb-cifaults-")
    wait_back("cpu-2", timeout=120)
    # And `cluster down` ends one too, leaving nothing of it behind.
    orphan = kill_supervisor("cpu-1")
    down = fcb("cluster", "down", timeout=300)
    assert f"machine cb-cifaults-cpu-1 (its nspawn supervisor had died; init PID {orphan})" in down.stderr + down.stdout
    assert not machines.alive(orphan)
    assert machines.find_orphans("cb-cifaults-") == {} and machines.find_machines("cb-cifaults-") == {}
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "cb-cifaults-" not in netns
