"""A backup controller on the local provider (tests/integration/ha.yaml: head and head-2, two compute
nodes, accounting): both heads run slurmctld with the StateSaveLocation on a directory both mount;
the primary killed mid-job, the backup takes control after SlurmctldTimeout (10 s here), the job
finishes, new jobs run; `cluster up` brings the primary back, which takes control again (Slurm's
rule: the first SlurmctldHost that answers runs the cluster), and accounting has every job.
Real Slurm 22.05, munge, MariaDB; the primary dies as a machine does (its init SIGKILLed: no
shutdown). The tests run in order on one cluster.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from localtest import cb, on, up_for_the_module
from polling import poll
from timetable import boots_cluster

from clusterbake.nspawn import machines

pytestmark = pytest.mark.integration
CONFIG = Path(__file__).with_name("ha.yaml")
CONTROLLER_TIMEOUT = 10  # ha.yaml's head.controller_timeout (SlurmctldTimeout)
STATE_SAVE = "/srv/clusterbake/controller/slurmctld"  # the StateSaveLocation both heads mount
# Whether this head's reconcile loop acts: role slurm_power's own test of control.
IN_CONTROL = (
    'python3 -c \'import sys; sys.path.insert(0, "/usr/local/lib/clusterbake"); '
    "from clusterbake_power import core; print(core.in_control())'"
)


def hcb(*args, **kwargs):
    return cb(*args, config=CONFIG, **kwargs)


def hon(node, command, **kwargs):
    return on(node, command, config=CONFIG, **kwargs)


@pytest.fixture(scope="module")
@boots_cluster("local 2 heads+2 (ha.yaml)")
def ha_cluster(image):
    yield from up_for_the_module(CONFIG)


def ping(node: str) -> dict[str, str]:
    """`scontrol ping` on `node`: {controller: UP or DOWN}, in slurm.conf's order."""
    text = hon(node, "scontrol ping", check=False).stdout
    return {line.split()[2]: line.split()[-1] for line in text.splitlines() if line.startswith("Slurmctld(")}


def job_state(node: str, job: str) -> str:
    shown = hon(node, f"scontrol show job -o {job}", check=False).stdout
    return next((w.split("=", 1)[1] for w in shown.split() if w.startswith("JobState=")), "")


def submit(node: str, nodes: int, command: str) -> str:
    return hon(
        node,
        f"runuser -u researcher -- sbatch --parsable -N{nodes} -D /home/researcher -o ha-%j.out --wrap '{command}'",
    ).stdout.strip()


def test_both_heads_run_slurmctld_the_primary_in_control(ha_cluster):
    conf = hon("head-2", "cat /etc/slurm/slurm.conf").stdout
    controllers = [
        line.split("=", 1)[1].split("(")[0] for line in conf.splitlines() if line.startswith("SlurmctldHost=")
    ]
    assert controllers == ["head", "head-2"]
    assert "SlurmctldTimeout=10" in conf.splitlines()
    assert ping("head-2") == {"head": "UP", "head-2": "UP"}
    # One StateSaveLocation that both see: what the primary saves, the backup reads (its heartbeat too,
    # which the backup checks before taking control).
    assert hon("head", f"stat -c %U:%a {STATE_SAVE}").stdout.split() == ["slurm:700"]
    listing = {node: hon(node, f"ls {STATE_SAVE}").stdout.split() for node in ("head", "head-2")}
    assert listing["head"] == listing["head-2"] and "heartbeat" in listing["head"], listing
    # slurmd on the compute nodes fetches its config from either controller.
    assert "--conf-server head:6817,head-2:6817" in hon("cpu-1", "cat /etc/default/slurmd").stdout
    # The reconcile timer runs on both heads; its loop acts only where slurmctld is in control.
    assert hon("head-2", "systemctl is-active clusterbake-power-reconcile.timer").stdout.strip() == "active"
    assert (hon("head", IN_CONTROL).stdout.strip(), hon("head-2", IN_CONTROL).stdout.strip()) == ("True", "False")
    # What a cluster has once stays on the primary: slurmdbd and its database.
    assert hon("head-2", "systemctl is-active slurmdbd mariadb", check=False).stdout.split() == ["inactive"] * 2


def slurm_logs(job: str) -> str:
    """What the controller and the job's nodes logged, for a failure's message: why a job stalled after
    the failover is in them and nowhere else once the cluster is gone."""
    logs = [hon("head-2", f"scontrol show job {job}", check=False).stdout]
    for node, log in (("head-2", "slurmctld"), ("cpu-1", "slurmd"), ("cpu-2", "slurmd")):
        tail = hon(node, f"tail -n 60 /var/log/slurm/{log}.log", check=False).stdout
        logs.append(f"--- {node} {log}.log (last 60 lines)\n{tail}")
    return "\n".join(logs)


def kill_head() -> None:
    """The primary dies as a machine does: its init SIGKILLed, no shutdown, nothing told."""
    machine = "cb-citha-head"
    nspawn = machines.find_machines("cb-citha-")[machine]
    init = int(subprocess.run(["pgrep", "-P", str(nspawn)], capture_output=True, text=True).stdout.split()[0])
    subprocess.run(["kill", "-9", str(init)], check=True)
    assert poll(lambda: machine not in machines.find_machines("cb-citha-"), 30, 0.2), f"{machine} still runs"


def test_the_backup_takes_control_when_the_primary_dies_mid_job(ha_cluster):
    # Its first step runs until the test lets it go (after the takeover), so the backup must find it
    # running whatever the machine's load (with a fixed 40 s sleep it once found the job COMPLETING).
    job = submit("head-2", 2, 'srun sh -c "until [ -e ha-go-$SLURM_JOB_ID ]; do sleep 1; done"; srun hostname')
    # The backup starts from the state the primary saved last; what came after is lost. So the primary
    # dies once the batch script runs (its first srun's step exists) and a save followed that. Under
    # the suite's load, killed sooner: the backup found the job PENDING and started it again beside
    # the copy still running (reproduced: "Duplicate jobid", the node drained, the job held), and
    # once the job stayed RUNNING past 120 s.
    first_step = f"scontrol show step -o {job}.0"
    assert poll(lambda: "StepId=" in hon("head", first_step, check=False).stdout, 60, 0.5), job_state("head", job)
    stepped_at = float(hon("head", "date +%s.%N").stdout)
    # The step's own save may already be done (then nothing changes until the step ends): a job update
    # is a change slurmctld saves, so a write after stepped_at holds the step.
    hon("head", f"scontrol update JobId={job} Comment=ha-step-seen")
    saved = f"stat -c %.9Y {STATE_SAVE}/job_state"
    assert poll(lambda: float(hon("head", saved).stdout) > stepped_at, 60, 0.5), "no state saved after the step"
    kill_head()
    killed = time.monotonic()
    took_over = poll(lambda: ping("head-2") == {"head": "DOWN", "head-2": "UP"} and job_state("head-2", job), 120, 1)
    seconds = time.monotonic() - killed
    print(
        f"the backup answered for the job {seconds:.0f} s after the primary died "
        f"(SlurmctldTimeout {CONTROLLER_TIMEOUT})"
    )
    assert took_over == "RUNNING", slurm_logs(job)  # the job survived in the shared state, on its nodes
    # The backup pings every SlurmctldTimeout/3 and takes control after SlurmctldTimeout of silence.
    assert seconds <= 3 * CONTROLLER_TIMEOUT
    assert hon("head-2", IN_CONTROL).stdout.strip() == "True"
    hon("head-2", f"runuser -u researcher -- touch /home/researcher/ha-go-{job}")
    assert poll(lambda: job_state("head-2", job) == "COMPLETED", 120, 1), slurm_logs(job)
    assert sorted(hon("head-2", f"cat /home/researcher/ha-{job}.out").stdout.split()) == ["cpu-1", "cpu-2"]
    # The cluster works on the backup alone: a new job runs, the CLI finds the controller.
    second = submit("head-2", 1, "hostname")
    assert poll(lambda: job_state("head-2", second) == "COMPLETED", 60, 1), job_state("head-2", second)
    status = json.loads(hcb("cluster", "status", "--json").stdout)
    nodes = {n["name"]: n for n in status["nodes"]}
    assert (nodes["head"]["state"], nodes["head-2"]["state"], status["slurm_error"]) == ("stopped", "running", None)
    assert nodes["cpu-1"]["slurm_state"] == "idle", status


def test_the_primary_rejoins_takes_control_again_and_accounting_has_every_job(ha_cluster):
    hcb("cluster", "up", timeout=600)
    assert poll(lambda: ping("head-2") == {"head": "UP", "head-2": "UP"}, 120, 1), ping("head-2")
    # Slurm's rule: the first SlurmctldHost that answers is in control; the backup stands by again.
    assert poll(lambda: hon("head", IN_CONTROL).stdout.strip() == "True", 60, 1)
    assert hon("head-2", IN_CONTROL).stdout.strip() == "False"
    third = submit("head", 2, "hostname")
    assert poll(lambda: job_state("head", third) == "COMPLETED", 60, 1), job_state("head", third)

    # The backup's slurmctld kept the records slurmdbd could not take while the primary was down.
    def completed() -> list[str]:
        lines = hon("head", "sacct -X -n -P -u researcher -o JobID,State").stdout.splitlines()
        return [line.split("|")[0] for line in lines if line.endswith("|COMPLETED")]

    assert poll(lambda: len(completed()) == 3, 120, 2), completed()
    again = hcb("cluster", "up", timeout=600)
    assert "0 changed tasks (nothing to configure)" in again.stdout, again.stdout + again.stderr
