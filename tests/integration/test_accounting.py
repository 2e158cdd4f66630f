"""Slurm accounting on a real cluster (tests/integration/cluster.yaml, accounting on by default):
slurmdbd and MariaDB on the head, the cluster, accounts and users registered, fair share, the
example job in `sacct` after a head restart, and the database password kept private."""

import base64
import json
import re

import pytest
from localtest import CONFIG, REPO, cb, on
from polling import wait_for

from clusterbake.config import load_config
from clusterbake.state import StateDir

pytestmark = pytest.mark.integration
TRAIN = ["deepspeed/train.py", "--deepspeed_config", "deepspeed/ds_config.json", "--steps", "5"]


def cluster_dir():
    return StateDir.for_config(load_config(CONFIG)).cluster("citest")


def sacct(job_id: str) -> dict[str, str]:
    fields = "JobID,JobName,User,Account,NodeList,State,AllocTRES"
    out = on("head", f"sacct -j {job_id} -X -n -P -o {fields}").stdout.strip()
    return dict(zip(fields.split(","), out.split("|"), strict=True)) if out else {}


def listening_on(ss_output: str, port: int) -> list[str]:
    """The addresses of `ss -Htln`'s listening TCP sockets on `port`."""
    found = []
    for line in ss_output.splitlines():
        local = line.split()[3]  # State Recv-Q Send-Q Local:Port Peer:Port
        address, _, local_port = local.rpartition(":")
        if local_port == str(port):
            found.append(address)
    return found


def test_slurmdbd_and_mariadb_run_on_the_head_only(cluster):
    assert on("head", "systemctl is-active mariadb slurmdbd slurmctld").stdout.split() == ["active"] * 3
    assert on("head", "stat -c '%a %U:%G' /etc/slurm/slurmdbd.conf").stdout.strip() == "600 slurm:slurm"
    # SchedMD's settings reached the server (the buffer pool: 10% of the head's 2048 MiB, at least).
    pool, log_size, lock_wait = on(
        "head", "mariadb -N -e 'SELECT @@innodb_buffer_pool_size, @@innodb_log_file_size, @@innodb_lock_wait_timeout'"
    ).stdout.split()
    assert int(pool) >= 204 * 2**20 and int(log_size) == 128 * 2**20 and lock_wait == "900"
    # MariaDB listens to the head itself only: its setting, and the sockets really open (systemd's
    # socket activation, on in the package, would listen on every address whatever the setting).
    assert on("head", "mariadb -N -e 'SELECT @@bind_address'").stdout.strip() == "127.0.0.1"
    assert listening_on(on("head", "ss -Htln").stdout, 3306) == ["127.0.0.1"]
    for node in ("cpu-1", "cpu-2"):
        assert on(node, "test -e /etc/slurm/slurmdbd.conf", check=False).returncode != 0
        assert on(node, "systemctl is-active mariadb slurmdbd", check=False).stdout.split() == ["inactive"] * 2
        assert listening_on(on(node, "ss -Htln").stdout, 3306) == []


def test_the_heads_own_routes_ack_at_once(cluster):
    """slurmdbd's clients on the head talk to it over the head's own address: no delayed ACKs there
    (role slurm_accounting's README: each request waited twice 40 ms for one)."""
    assert on("head", "systemctl is-active clusterbake-tcp-quickack").stdout.strip() == "active"
    routes = on("head", "ip -4 -o route show table local type local").stdout.splitlines()
    assert any(" 10.78.0.10 " in route for route in routes), routes
    assert all("quickack 1" in route for route in routes), routes
    # The compute nodes' routes are theirs, left as they were.
    assert "quickack" not in on("cpu-1", "ip -4 -o route show table local").stdout


def test_the_database_password_is_private_and_never_logged(cluster):
    secret = cluster_dir().db_password
    assert (secret.stat().st_mode & 0o777) == 0o600
    password = secret.read_text().strip()
    assert f"StoragePass={password}" in on("head", "cat /etc/slurm/slurmdbd.conf").stdout.splitlines()
    # The slurm user reaches its database with it, as slurmdbd does (the password on stdin).
    on("head", 'mariadb -u slurm --password="$(cat)" -N -e "SELECT 1" slurm_acct_db', input=password)
    encoded = base64.b64encode(password.encode()).decode()
    logs = list(cluster_dir().logs.glob("*.log"))
    assert logs
    for log in logs:
        text = log.read_text(errors="replace")
        assert password not in text and encoded[:24] not in text, log
    # No compute node's bundle carries it, not even inside a file's content.
    bundles = list(cluster_dir().join_bundles.glob("*.json"))
    assert bundles
    for path in bundles:
        bundle = json.loads(path.read_text())
        assert password not in path.read_text()
        assert not any(password.encode() in base64.b64decode(f["content_b64"]) for f in bundle["files"])
        assert not any(f["path"].endswith("slurmdbd.conf") for f in bundle["files"])


def test_the_cluster_its_account_and_users_are_registered_with_fair_share(cluster):
    assert "citest" in on("head", "sacctmgr -n -P list cluster format=cluster").stdout.split()
    associations = on("head", "sacctmgr -n -P list association cluster=citest format=account,user").stdout.split()
    assert {"general|", "general|researcher", "root|root"} <= set(associations)
    assert on("head", "sacctmgr -n -P list user researcher format=defaultaccount").stdout.strip() == "general"
    config = on("head", "scontrol show config").stdout
    for setting in (
        r"AccountingStorageType\s+= accounting_storage/slurmdbd",
        r"AccountingStorageTRES\s+= \S*gres/gpu",
        r"AccountingStorageEnforce\s+= associations,limits,qos,safe",
        r"PriorityType\s+= priority/multifactor",
        r"PriorityWeightFairshare\s+= 10000",
    ):
        assert re.search(setting, config, re.IGNORECASE), setting
    assert "researcher" in on("head", "sshare -n -P -a -o User").stdout.split()


def test_an_accounts_limits_hold_and_others_are_not_held_by_them(cluster):
    """guests (mallory's account): at most one node at a time, jobs of at most 10 minutes. Slurm keeps
    a job over a limit waiting with the limit as its reason."""
    limits = on("head", "sacctmgr -n -P list association account=guests user= format=grptres,maxwall").stdout
    assert limits.split() == ["node=1|00:10:00"]
    submit = "cd /tmp && runuser -u {} -- sbatch --parsable -o /dev/null {} --wrap 'sleep 1'"
    wide = on("head", submit.format("mallory", "-N2")).stdout.strip()
    long = on("head", submit.format("mallory", "-N1 --time=20")).stdout.strip()

    def reasons() -> str:
        return on("head", f"squeue -h -j {wide},{long} -o '%i %r'").stdout

    def held() -> str | None:
        shown = reasons()
        return shown if "AssocGrpNodeLimit" in shown and "AssocMaxWallDurationPerJobLimit" in shown else None

    try:
        shown = wait_for("both jobs held by their limits", held, timeout=30, describe=reasons)
        assert f"{wide} AssocGrpNodeLimit" in shown and f"{long} AssocMaxWallDurationPerJobLimit" in shown
    finally:
        on("head", f"scancel {wide} {long}")
    # The partition's own limit: at most one node per job in util.
    assert "MaxNodes=1 " in on("head", "scontrol show partition util").stdout
    assert "MaxNodes=UNLIMITED " in on("head", "scontrol show partition cpu").stdout


def test_a_user_without_an_association_cannot_run_jobs(cluster):
    on("head", "id stranger >/dev/null 2>&1 || useradd --uid 2999 --no-create-home stranger")
    try:
        refused = on("head", "cd /tmp && runuser -u stranger -- sbatch --wrap true -o /dev/null", check=False)
        assert refused.returncode != 0
        assert "Invalid account" in refused.stderr, refused.stderr
    finally:
        on("head", "userdel stranger", check=False)


def test_a_second_cluster_up_changes_nothing_and_restarts_no_database(cluster):
    daemons = "pidof mariadbd; pidof slurmdbd; pidof slurmctld"
    before = on("head", daemons).stdout.split()
    forced = cb("cluster", "up", "--reconfigure", timeout=600)
    assert ", 0 changed tasks" in forced.stdout, forced.stdout + forced.stderr
    again = cb("cluster", "up", timeout=600)
    assert "0 changed tasks (nothing to configure)" in again.stdout, again.stdout + again.stderr
    assert on("head", daemons).stdout.split() == before


def test_sacct_lists_the_example_job_after_a_head_restart(cluster):
    submitted = cb(
        "job", "submit", "deepspeed", "--nodes", "all", "--upload", str(REPO / "examples" / "deepspeed"),
        "--job-name", "ci-accounting", "--wait", "--", *TRAIN,
        timeout=900,
    )  # fmt: skip
    job_id = re.search(r"submitted job (\d+)", submitted.stdout).group(1)
    completed = lambda: sacct(job_id).get("State") == "COMPLETED"  # noqa: E731
    wait_for(f"job {job_id} COMPLETED in sacct", completed, 60, lambda: sacct(job_id))

    cb("node", "stop", "head")
    cb("node", "start", "head")
    states = lambda: on("head", "sinfo -h -N -o '%N %t'", check=False).stdout.split()  # noqa: E731
    idle = lambda: states() == ["cpu-1", "idle", "cpu-2", "idle", "util-1", "idle"]  # noqa: E731
    wait_for("every node idle after the head's restart", idle, 180, states)

    record = sacct(job_id)
    assert record["JobName"] == "ci-accounting" and record["User"] == "researcher" and record["Account"] == "general"
    assert record["NodeList"] == "cpu-[1-2]" and record["State"] == "COMPLETED"
    assert "node=2" in record["AllocTRES"].split(","), record
    # The database keeps working after the restart: a new job is recorded too.
    new = on("head", "cd /tmp && runuser -u researcher -- sbatch --parsable --wait -N2 -o /dev/null --wrap 'srun true'")
    new = new.stdout
    new_id = new.strip().split(";")[0]
    wait_for(f"job {new_id} in sacct", lambda: sacct(new_id).get("NodeList") == "cpu-[1-2]", 60, lambda: sacct(new_id))
