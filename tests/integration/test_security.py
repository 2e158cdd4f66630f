"""The security review's exploits that need a running cluster (../shared/reviews/security.md), run as
an unprivileged cluster user of the suite's shared cluster (tests/integration/cluster.yaml: researcher,
the job user; mallory, a second user). Each test leaves the cluster as it found it."""

import re
import shlex

import pytest
from localtest import CONFIG, cb, on

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
