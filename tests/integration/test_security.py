"""The security review's exploits that need a running cluster (../shared/reviews/security.md), run as
an unprivileged cluster user of the suite's shared cluster (tests/integration/cluster.yaml: researcher,
the job user; mallory, a second user). Each test leaves the cluster as it found it."""

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from localtest import CONFIG, cb, on
from polling import wait_for

PRELOAD = "/etc/ld.so.preload"


def head(command: str, **kwargs):
    return on("head", command, config=CONFIG, **kwargs)


def as_user(user: str, command: str, node: str = "head", **kwargs):
    return on(node, f"runuser -u {user} -- sh -c {shlex.quote(command)}", config=CONFIG, **kwargs)


def test_only_root_makes_entries_in_the_job_and_checkpoint_directories(cluster):
    for parent in ("/shared/jobs", "/shared/checkpoints"):
        assert head(f"stat -c '%U %a' {parent}").stdout.split() == ["root", "755"], parent
        for user in ("researcher", "mallory"):
            assert head(f"stat -c '%U %a' {parent}/{user}").stdout.split() == [user, "700"], (parent, user)
    # Finding 5's plant: mallory's checkpoint where another user's job would resume from it (the
    # template's old default, /shared/checkpoints/<job name>), or in the other user's directory.
    planted = as_user("mallory", "mkdir -p /shared/checkpoints/deepspeed/step1", check=False)
    assert planted.returncode != 0 and "Permission denied" in planted.stderr, planted.stderr
    for target in ("/shared/checkpoints/researcher/latest", "/shared/jobs/researcher/sec-mallory.sbatch"):
        into = as_user("mallory", f"touch {target}", check=False)
        assert into.returncode != 0 and "Permission denied" in into.stderr, (target, into.stderr)
        assert head(f"test -e {target}", check=False).returncode != 0, target


@pytest.fixture
def rejoin_head():
    """A test that moves the head's job directories aside (to /shared/jobs.planted) gets them back, as
    the head's join keeps them."""
    yield
    head("rm -rf /shared/jobs && mv /shared/jobs.planted /shared/jobs && clusterbake-node-join >/dev/null")
    assert head("stat -c '%U %a' /shared/jobs/researcher").stdout.split() == ["researcher", "700"]


def test_job_submit_never_writes_as_root_where_a_user_planted_a_link(cluster, rejoin_head):
    """Finding 3's exploit: before the operator's first submit, the job user makes /shared/jobs theirs
    with a link named like the script; root's `cat >` and `chown` went through it and handed the
    user /etc/ld.so.preload (root on the head at the next sudo). Now every write is the user's own."""
    head("mv /shared/jobs /shared/jobs.planted")  # a cluster before its first submit, as the review had it
    as_user(
        "researcher",
        f"mkdir -m 1777 /shared/jobs && mkdir /shared/jobs/researcher && "
        f"ln -s {PRELOAD} /shared/jobs/sec-probe.sbatch && ln -s {PRELOAD} /shared/jobs/researcher/sec-probe.sbatch",
    )
    result = cb("job", "submit", "hello-distributed", "--nodes", "1", "--job-name", "sec-probe",
                check=False, timeout=120)  # fmt: skip
    assert result.returncode != 0, result.stdout
    assert head(f"test -e {PRELOAD}", check=False).returncode != 0, f"{PRELOAD} was created through the user's link"
    assert "Permission denied" in result.stderr, result.stderr[-2000:]


def test_a_job_checkpoints_in_its_users_own_directory(cluster):
    """Finding 5: the template's default checkpoint directory was /shared/checkpoints/<job name>, one a
    second user could create first (and fill with a pickled checkpoint the job resumes from)."""
    result = cb("job", "submit", "deepspeed", "--nodes", "1", "--job-name", "sec-ckpt", "--wait", "--raw",
                "--", "sec-no-such-script.py", check=False, timeout=300)  # fmt: skip
    found = re.search(r"checkpoints in (\S+),", result.stdout)
    assert found and found.group(1) == "/shared/checkpoints/researcher/sec-ckpt", result.stdout[-3000:]
    head("rm -rf /shared/checkpoints/researcher/sec-ckpt /shared/jobs/researcher/sec-ckpt*")


def test_job_report_refuses_a_job_id_that_is_not_one(cluster):
    """Finding 16: `job report JOBID` went into a root shell line on the head unchecked."""
    result = cb("job", "report", "1;touch /tmp/sec-injected", check=False, timeout=60)
    assert result.returncode != 0 and "job id" in result.stderr, result.stderr
    assert head("test -e /tmp/sec-injected", check=False).returncode != 0


def _host_path(inside: str) -> str:
    """Where a node's shared directory is on this host (the local provider binds host directories)."""
    from clusterbake.config import load_config
    from clusterbake.state import StateDir

    config = load_config(CONFIG)
    return str(StateDir.for_config(config).cluster(config.cluster_name).storage("shared") / inside)


def test_a_set_uid_file_a_nodes_root_makes_in_shared_storage_gives_no_one_root(cluster):
    """Finding 4's exploit: root in a node (a sudo user, or anyone who became root there) copies a
    shell to /shared and makes it set-uid; any user on the node, or on this host, ran it as root."""
    head("cp /bin/bash /shared/sec-suid && chmod 4755 /shared/sec-suid")
    try:
        in_node = as_user("mallory", "/shared/sec-suid -p -c 'id -u'", node="cpu-1", check=False)
        assert in_node.stdout.strip() == "2002", in_node  # nosuid: the user's own uid
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        on_host = subprocess.run([*nobody, _host_path("sec-suid"), "-p", "-c", "id -u"],
                                 capture_output=True, text=True, timeout=30)  # fmt: skip
        # Not root on the host: the state directory is root's (0700) and the storage nosuid.
        assert on_host.stdout.strip() != "0", on_host
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        storage = os.path.realpath(_host_path(""))
        options = [line.split()[5] for line in mounts if line.split()[4] == storage.rstrip("/")]
        assert options and {"nosuid", "nodev"} <= set(options[-1].split(",")), options
    finally:
        head("rm -f /shared/sec-suid")


def test_a_user_sees_only_their_own_jobs(cluster):
    """Finding 11: every user saw every job, user, account and usage (no PrivateData)."""
    job = head("cd /tmp && runuser -u researcher -- sbatch --parsable -N1 --mem=64 -o /dev/null --wrap 'sleep 60'")
    job = job.stdout.strip()
    try:
        assert job in head("squeue -h -o %i").stdout.split()  # root sees it
        assert job not in as_user("mallory", "squeue -h -o %i").stdout.split()
        assert job in as_user("researcher", "squeue -h -o %i").stdout.split()
        assert "researcher" not in as_user("mallory", "sshare -a -h -o User", check=False).stdout.split()
    finally:
        head(f"scancel {job}")


def test_users_reach_a_compute_node_over_ssh_only_while_their_job_runs_there(cluster):
    """Finding 11: any user with a key could SSH to any compute node and run there outside Slurm,
    beside other users' jobs. pam_slurm_adopt lets a user in only while the user has a job there."""
    node = "cpu-1"

    def ssh_as(user: str):
        options = "-o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=20"
        return head(f"runuser -u {user} -- ssh -i /tmp/sec-{user}-key {options} {node} hostname", check=False)

    for user in ("researcher", "mallory"):  # each a key the node accepts (sshd's authentication passes)
        key = f"/tmp/sec-{user}-key"
        head(f"rm -f {key} {key}.pub && ssh-keygen -q -t ed25519 -N '' -C sec-{user}-key -f {key}")
        head(f"chown {user} {key} {key}.pub")
        public = head(f"cat {key}.pub").stdout.strip()
        on(
            node,
            f"install -d -o {user} -g {user} -m 0700 /home/{user}/.ssh && "
            f"echo {shlex.quote(public)} >> /home/{user}/.ssh/authorized_keys && "
            f"chown {user}:{user} /home/{user}/.ssh/authorized_keys",
            config=CONFIG,
        )
    job = None
    try:
        refused = ssh_as("researcher")
        assert refused.returncode == 255, (refused.stdout, refused.stderr)  # no job there: the account stack says no
        submit = (
            f"cd /tmp && runuser -u researcher -- sbatch --parsable -w {node} --mem=64 -o /dev/null --wrap 'sleep 300'"
        )
        job = head(submit).stdout.strip()
        wait_for(f"job {job} running", lambda: head(f"squeue -h -j {job} -o %T").stdout.strip() == "RUNNING", 60)
        allowed = ssh_as("researcher")
        assert allowed.returncode == 0 and allowed.stdout.strip() == node, (allowed.stdout, allowed.stderr)
        # Another user's job running there lets no one else in.
        assert ssh_as("mallory").returncode == 255
        # The administrators (root here) come in without a job: the rest of the suite depends on it.
        assert "pam_slurm_adopt.so" in on(node, "cat /etc/pam.d/clusterbake-slurm-adopt", config=CONFIG).stdout
        assert re.search(r"PrologFlags\s*=\s*\S*Contain", head("scontrol show config").stdout)  # Contain implies Alloc
    finally:
        if job:
            head(f"scancel {job}")
        for user in ("researcher", "mallory"):
            head(f"rm -f /tmp/sec-{user}-key /tmp/sec-{user}-key.pub")
            on(
                node,
                f"sed -i '/ sec-{user}-key$/d' /home/{user}/.ssh/authorized_keys",
                config=CONFIG,
                check=False,
            )


def test_a_compute_nodes_root_cannot_take_another_address_on_the_bridge(cluster):
    """Finding 17: the power agent takes a bearer token over HTTP on the bridge, and every node had
    CAP_NET_ADMIN and CAP_NET_RAW (ARP spoofing of the host's address). Compute nodes have neither."""
    link = on("cpu-1", "ip link add cbsecdummy type dummy", config=CONFIG, check=False)
    assert link.returncode != 0 and "Operation not permitted" in link.stderr, link.stderr
    raw = "import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)"
    sniff = on("cpu-1", f"python3 -c {shlex.quote(raw)}", config=CONFIG, check=False)
    assert sniff.returncode != 0 and "Operation not permitted" in sniff.stderr, sniff.stderr
