"""What a cluster user meets on the suite's shared cluster (tests/integration/cluster.yaml: login-1,
rest_api, training.extra_requirements): the login node, the only node a user logs in to, over real
SSH from this host as a researcher would; Slurm's commands work there without slurmd (configless:
each fetches slurm.conf from slurmctld); the head admits only the administrators; slurmrestd takes a
job with a user's token; a job imports the team's extra package from the training environment."""

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from directory import Person
from localtest import CONFIG, cb, on, run
from polling import wait_for

USER = "researcher"


@pytest.fixture(scope="module")
def addresses(cluster):
    return {n["name"]: n["address"] for n in json.loads(cb("cluster", "status", "--json").stdout)["nodes"]}


@pytest.fixture(scope="module")
def user_key(cluster, tmp_path_factory):
    """A key of the researcher's in ~/.ssh/authorized_keys (the shared /home), as `users.N.ssh_authorized_keys`
    would put it; the head's join takes it away after the module."""
    key = tmp_path_factory.mktemp("login") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ci-login-key", "-f", str(key)], check=True)
    public = key.with_suffix(".pub").read_text().strip()
    on(
        "login-1",
        f"install -d -o {USER} -g {USER} -m 0700 /home/{USER}/.ssh && echo {shlex.quote(public)} >> "
        f"/home/{USER}/.ssh/authorized_keys && chown {USER}:{USER} /home/{USER}/.ssh/authorized_keys",
    )
    yield key
    # The head's join writes authorized_keys as the config has them (no key here): as it found it.
    on("head", "clusterbake-node-join >/dev/null")
    assert on("head", f"stat -c '%s %U %a' /home/{USER}/.ssh/authorized_keys").stdout.split() == ["0", USER, "600"]


def ssh_as_user(key, address: str, command: str, user: str = USER) -> subprocess.CompletedProcess:
    """Real SSH from this host, a non-interactive command (no login shell: what sshd alone sets up)."""
    options = [
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "ConnectTimeout=20", "-o", "LogLevel=ERROR",
    ]  # fmt: skip
    argv = ["ssh", "-i", str(key), *options, f"{user}@{address}", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def wait_completed(job: str) -> None:
    finished = lambda: on("head", f"sacct -n -X -P -j {job} -o State").stdout.strip() == "COMPLETED"  # noqa: E731
    wait_for(f"job {job} completed", finished, 120)


def test_a_user_logs_in_to_the_login_node_and_submits_a_job_that_accounting_shows_as_theirs(addresses, user_key):
    where = ssh_as_user(user_key, addresses["login-1"], "hostname; echo $SLURM_CONF_SERVER; sinfo -h -o %P")
    assert where.returncode == 0, where.stderr
    assert where.stdout.split()[:2] == ["login-1", "head:6817"], where.stdout
    assert "cpu*" in where.stdout.split(), where.stdout  # sinfo answered: slurm.conf came from slurmctld
    submit = ssh_as_user(
        user_key, addresses["login-1"], "cd /tmp && sbatch --parsable -N1 --mem=64 -o /dev/null --wrap 'hostname'"
    )
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip()
    wait_completed(job)
    assert on("head", f"sacct -n -X -P -j {job} -o User").stdout.strip() == USER


def test_the_head_admits_only_the_administrators(addresses, user_key):
    """The same key that opens the login node: sshd's account stack on the head says no (pam_access)."""
    assert ssh_as_user(user_key, addresses["login-1"], "true").returncode == 0
    refused = ssh_as_user(user_key, addresses["head"], "true")
    assert refused.returncode == 255, (refused.stdout, refused.stderr)
    access = on("head", "cat /etc/security/clusterbake-ssh-access.conf").stdout.splitlines()
    assert access[-2:] == ["+:root:ALL", "-:ALL:ALL"], access  # root (the suite's own SSH) still comes in


def test_a_directory_user_logs_in_to_the_login_node_only_with_the_key_the_directory_holds(addresses, directory):
    """dana, of the directory's cluster group: SSH to login-1 with the key of her directory entry (SSSD,
    sshPublicKey; no authorized_keys of hers), her home made at that first login on the shared /home;
    her sbatch job runs and is accounted as hers, in the directory's account. eve, in the directory
    but not in the group, is refused there; dana is refused by the head."""
    dana, eve = directory.keys / "dana", directory.keys / "eve"
    who = ssh_as_user(dana, addresses["login-1"], "id -u; id -Gn; stat -c %U:%a $HOME", user="dana")
    assert who.returncode == 0, who.stderr
    assert who.stdout.split() == ["5001", "people", "hpc-users", "dana:700"], who.stdout
    assert on("login-1", "test -e /home/dana/.ssh/authorized_keys", check=False).returncode != 0
    submit = ssh_as_user(
        dana, addresses["login-1"], "cd /tmp && sbatch --parsable -N1 -o /dev/null --wrap id", user="dana"
    )
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip()
    wait_completed(job)
    assert on("head", f"sacct -n -X -P -j {job} -o User,Account").stdout.strip() == "dana|general"
    assert ssh_as_user(eve, addresses["login-1"], "true", user="eve").returncode == 255
    assert ssh_as_user(dana, addresses["head"], "true", user="dana").returncode == 255
    # Every node knows her (jobs run as her everywhere), from the directory, with its CA.
    for node in ("head", "cpu-1"):
        assert on(node, "id -u dana").stdout.strip() == "5001", node
    assert on("cpu-1", "stat -c '%U %a' /etc/sssd/sssd.conf").stdout.split() == ["root", "600"]


def test_a_member_who_joins_the_group_later_is_registered_by_the_heads_timer(directory):
    """The head's timer (clusterbake-directory-accounts) registers the group's new members for accounting:
    frank joins the group in the directory; once SSSD's cache lets the head see him, the timer's run gives
    him an association in the directory's account."""
    assert on("head", "systemctl is-active clusterbake-directory-accounts.timer").stdout.strip() == "active"
    assert "frank" not in on("head", "sacctmgr -n -P list user format=user").stdout.split()
    directory.add(Person("frank", 5003, (directory.keys / "dana.pub").read_text().strip(), True))
    on("head", "sss_cache -E && systemctl start clusterbake-directory-accounts.service")
    account = on("head", "sacctmgr -n -P list association user=frank format=account").stdout.split()
    assert account == ["general"], account


def test_the_login_node_has_slurms_commands_and_the_training_environment_but_no_slurm_daemon(addresses, user_key):
    states = on("login-1", "systemctl is-active munge slurmd slurmctld", check=False).stdout.split()
    assert states == ["active", "inactive", "inactive"], states
    assert on("login-1", "test -e /etc/slurm/slurm.conf", check=False).returncode != 0
    assert "NodeName=login" not in on("head", "cat /etc/slurm/slurm.conf").stdout
    imported = ssh_as_user(
        user_key, addresses["login-1"], ". /etc/clusterbake/train.env && python -c 'import deepspeed, torch; print(1)'"
    )
    # (DeepSpeed says on stdout that it found no accelerator.)
    assert imported.returncode == 0 and imported.stdout.split()[-1:] == ["1"], imported.stderr[-2000:]


def test_doctor_checks_the_login_node_for_munge_alone(cluster):
    result = cb("doctor", check=False, timeout=300)
    lines = [line for line in result.stdout.splitlines() if " login-1: " in line]
    assert len(lines) == 1 and lines[0].startswith("ok    login-1: munge active; "), result.stdout


# docs/users.md's example job, as the researcher's curl sends it (the script and settings of sbatch's).
JOB = {
    "job": {
        "current_working_directory": "/tmp",
        "environment": {"PATH": "/usr/bin:/bin"},
        "standard_output": "/dev/null",
    },
    "script": "#!/bin/sh\nhostname\n",
}


def test_a_directory_user_submits_through_slurmrestd_with_the_token_clusterbake_token_gives(addresses, directory):
    """`clusterbake token dana` (scontrol token on the head, for a user the head knows through SSSD); from
    the login node dana's job goes in through the REST API and runs as hers. The token is hers alone:
    the same token under another user's name, or none at all, is refused. slurmrestd listens on the
    head's cluster address only, as its own user; the signing key is on the head alone, SlurmUser's."""
    key = directory.keys / "dana"
    issued = cb("token", "dana", "--lifespan", "600")
    assert issued.stdout.startswith("SLURM_JWT=") and issued.stdout.count("\n") == 1, issued.stdout
    token = issued.stdout.strip().split("=", 1)[1]
    url = f"http://{addresses['head']}:6820"
    assert url in issued.stderr, issued.stderr
    assert cb("token", "nobody-here", check=False).returncode == 2  # a user the head does not know

    def submit(user: str, token: str) -> tuple[str, str | None]:
        """(HTTP status, job id) of docs/users.md's curl command on the login node, as a call of `user`'s."""
        headers = f"-H 'X-SLURM-USER-NAME: {user}'" + (f" -H 'X-SLURM-USER-TOKEN: {token}'" if token else "")
        command = (
            f"curl -sS -w '\\n%{{http_code}}' {headers} -H 'Content-Type: application/json' "
            f"-d {shlex.quote(json.dumps(JOB))} {url}/slurm/v0.0.38/job/submit"
        )
        result = ssh_as_user(key, addresses["login-1"], command, user="dana")
        assert result.returncode == 0, result.stderr
        body, _, status = result.stdout.rpartition("\n")
        try:
            job = json.loads(body).get("job_id")
        except ValueError:
            job = None
        return status, None if job is None else str(job)

    status, job = submit("dana", token)
    assert status == "200" and job and job.isdigit(), (status, job)
    wait_completed(job)
    assert on("head", f"sacct -n -X -P -j {job} -o User,Account").stdout.strip() == "dana|general"
    # Refused: no job (the status is slurmrestd's to choose: 401, or an error in the answer).
    assert submit("researcher", token)[1] is None
    assert submit("dana", "")[1] is None

    listening = on("head", "ss -Hltn 'sport = :6820' | awk '{print $4}'").stdout.split()
    assert listening == [f"{addresses['head']}:6820"], listening  # not 0.0.0.0 nor [::]
    assert on("head", "ps -o user= -C slurmrestd").stdout.split() == ["slurmrestd"]
    assert on("head", "stat -c '%U %a' /var/spool/slurmctld/jwt_hs256.key").stdout.split() == ["slurm", "600"]
    for node in ("login-1", "cpu-1"):
        assert on(node, "test -e /var/spool/slurmctld/jwt_hs256.key", check=False).returncode != 0, node


def test_a_job_imports_the_package_the_config_added_to_the_training_environment(addresses, user_key):
    """training.extra_requirements (requests, with its own dependencies) baked into the image's training
    environment, resolved with torch and DeepSpeed: a researcher's job on a compute node imports it."""
    command = "cd /tmp && srun -N1 -p cpu bash -c " + shlex.quote(
        ". /etc/clusterbake/train.env && python -c 'import requests, torch; print(requests.__version__)'"
    )
    result = ssh_as_user(user_key, addresses["login-1"], command)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1:] == ["2.34.2"], result.stdout
    lock = on("cpu-1", "cat /opt/clusterbake/train/requirements.lock").stdout.split()
    assert "requests==2.34.2" in lock and any(line.startswith("urllib3==") for line in lock), lock


def test_with_local_outbound_a_user_installs_a_package_into_a_venv_of_their_own(addresses, user_key, tmp_path):
    """docs/users.md's per-user way: a venv on the shared /home on top of the training environment
    (clusterbake-venv), filled from PyPI through the host (local.outbound: NAT); a job on a compute
    node imports from it and the environment's torch. Before and after, no node has a way off the bridge: the config's
    outbound switched on for the test, then off again (table, routes and forwarding gone)."""

    def routes(node: str) -> str:
        return on(node, "ip route show default").stdout.strip()

    assert routes("login-1") == "" and routes("cpu-1") == ""
    forwarding = Path("/proc/sys/net/ipv4/ip_forward")
    forwarding_before = forwarding.read_text().strip()
    config = yaml.safe_load(CONFIG.read_text())
    config["local"]["outbound"] = True
    with_outbound = tmp_path / "cluster.yaml"
    with_outbound.write_text(yaml.safe_dump(config))
    venv = "/home/researcher/venvs/ci-outbound"
    try:
        up = cb("cluster", "up", config=with_outbound, timeout=600)
        assert "outbound: the nodes reach beyond this machine" in up.stderr, up.stderr[-3000:]
        host = addresses["head"].rsplit(".", 1)[0] + ".1"
        assert routes("login-1") == f"default via {host} dev host0" == routes("cpu-1")
        # (--cert: this machine's TLS proxy, whose CA the image trusts; pip's own bundle does not.)
        install = ssh_as_user(
            user_key,
            addresses["login-1"],
            f"clusterbake-venv {venv} && {venv}/bin/pip install -q --cert /etc/ssl/certs/ca-certificates.crt "
            "tomli-w==1.2.0",
        )
        assert install.returncode == 0, install.stderr[-3000:]
        job = ssh_as_user(
            user_key,
            addresses["login-1"],
            f"cd /tmp && srun -N1 -p cpu {venv}/bin/python -c "
            + shlex.quote('import tomli_w, torch; print(tomli_w.dumps({"a": 1}))'),
        )
        assert job.returncode == 0 and job.stdout.strip() == "a = 1", (job.stdout, job.stderr[-2000:])
    finally:
        down = cb("cluster", "up", timeout=600)
        on("head", f"rm -rf {venv}", check=False)
    assert "outbound: off" in down.stderr, down.stderr[-3000:]
    assert routes("login-1") == "" and routes("cpu-1") == ""
    assert "clusterbake_out_citest" not in run(["nft", "list", "tables"]).stdout
    assert forwarding.read_text().strip() == forwarding_before
