"""A real 1 head + 2 compute cluster of nspawn nodes: Slurm, munge, shared storage."""

import base64
import json
import re
import shutil
from pathlib import Path

import hostlist
import pytest
from localtest import CONFIG, REPO, cb, on, run
from polling import poll

from clusterbake.config import load_config
from clusterbake.nspawn.network import bridge_name, veth_name
from clusterbake.state import StateDir


def slurm_states():
    out = on("head", "sinfo --noheader --Node --format='%N %t'").stdout
    return dict(line.split() for line in out.splitlines())


def test_make_cluster_ends_with_idle_nodes(cluster):
    assert "compute nodes idle" in cluster.stdout
    assert slurm_states() == {"cpu-1": "idle", "cpu-2": "idle", "util-1": "idle"}


def test_new_compute_nodes_join_during_the_play_and_slurmd_after_it(cluster):
    """A new cluster's compute nodes join while the head is configured, but for slurmd and the health
    timer, which start after the play (slurmctld runs): a slurmd started before slurmctld fails its
    configless fetch, and systemd counts a restart, which the health check holds against the node."""
    early = re.findall(r"(\S+) joined during the play, but for slurmd, clusterbake-health.timer", cluster.stderr)
    assert sorted(hostlist.expand_hostlist(",".join(early))) == ["cpu-1", "cpu-2", "util-1"], cluster.stderr
    assert "cpu-[1-2],util-1: joined, slurmd, clusterbake-health.timer started" in cluster.stderr
    # The login node holds nothing back (no daemon of Slurm's waits for slurmctld there).
    assert "login-1 joined during the play\n" in cluster.stderr, cluster.stderr
    for node in ("cpu-1", "cpu-2", "util-1"):
        shown = on(node, "systemctl show --property=NRestarts --property=ActiveState slurmd").stdout.split()
        assert sorted(shown) == ["ActiveState=active", "NRestarts=0"], (node, shown)
        assert on(node, "systemctl is-active clusterbake-health.timer munge").stdout.split() == ["active"] * 2
        # The staged bundle is gone; the node's own is there, private.
        assert on(node, "stat -c %a /etc/clusterbake/node-join.json").stdout.strip() == "600"
        assert "node-join.early.json" not in on(node, "ls /etc/clusterbake").stdout


def test_nodes_boot_without_failed_units_and_skip_what_a_container_has_no_use_for(cluster):
    """Every node's systemd reaches `running`: the NFS client stack the image carries for the clouds
    (whose rpc_pipefs mount fails in a container, leaving the node `degraded`) and the disk and
    package housekeeping are masked in the node's own root, never in the image."""
    for node in ("head", "login-1", "cpu-1", "cpu-2", "util-1"):
        state = on(node, "systemctl is-system-running", check=False).stdout.strip()
        failed = on(node, "systemctl --failed --no-legend --plain", check=False).stdout
        assert state == "running", (node, state, failed)
        masked = on(node, "systemctl is-enabled rpcbind.service apt-daily.timer", check=False).stdout.split()
        assert masked == ["masked", "masked"], (node, masked)
        generators = on(node, "readlink /etc/systemd/system-generators/systemd-sysv-generator").stdout.strip()
        assert generators == "/dev/null", node
    image = Path(StateDir.for_config(load_config(CONFIG)).cluster("citest").read_state()["image"]) / "rootfs"
    assert not (image / "etc/systemd/system/rpcbind.service").is_symlink()
    assert not (image / "etc/systemd/system-generators/systemd-sysv-generator").is_symlink()


def test_clusterbake_ssh_runs_a_command_as_root_with_its_output_and_exit_status(cluster):
    """The CLI's own ssh (the tests' `on` keeps a connection open instead): stdout, stderr and the
    command's exit status come back as the node gave them; stdin reaches the command."""
    result = cb("ssh", "cpu-1", "--", "id -un; hostname; cat; echo oops >&2; exit 3", input="from stdin\n", check=False)
    assert result.returncode == 3
    assert result.stdout.split("\n")[:3] == ["root", "cpu-1", "from stdin"]
    assert result.stderr.strip() == "oops"


def test_srun_runs_on_both_nodes(cluster):
    out = on("head", "srun -N2 hostname").stdout.split()
    assert sorted(out) == ["cpu-1", "cpu-2"]


def test_sbatch_as_user_writes_to_shared(cluster):
    script = (
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --output=/shared/ci-job-%j.out\n"
        "srun bash -c 'echo \"$(hostname) $(id -un)\" > /shared/ci-$(hostname).txt'\n"
    )
    on("head", "mkdir -p /shared && chmod 1777 /shared")
    submitted = on("head", f"cd /tmp && runuser -u researcher -- sbatch --parsable <<'EOF'\n{script}EOF").stdout.strip()
    job_id = submitted.split(";")[0]
    assert job_id.isdigit(), submitted

    def finished():
        out = on("head", f"scontrol show job {job_id}").stdout
        match = re.search(r"JobState=(\S+)", out)
        return match and match.group(1) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") and match.group(1)

    assert poll(finished, timeout=60) == "COMPLETED"
    # /shared is the same directory on every node: read the results on cpu-1.
    seen = on("cpu-1", "cat /shared/ci-cpu-1.txt /shared/ci-cpu-2.txt").stdout.split("\n")
    assert seen[:2] == ["cpu-1 researcher", "cpu-2 researcher"]
    owner = on("cpu-2", "stat -c %U:%u /shared/ci-cpu-1.txt").stdout.strip()
    assert owner == "researcher:2001"


def test_user_has_same_uid_everywhere(cluster):
    for node in ("head", "login-1", "cpu-1", "cpu-2", "util-1"):
        assert on(node, "id -u researcher").stdout.strip() == "2001"


def test_munge_key_identical_private_and_unlogged(cluster):
    sums = {
        node: on(node, "sha256sum /etc/munge/munge.key").stdout.split()[0]
        for node in ("head", "login-1", "cpu-1", "cpu-2", "util-1")
    }
    assert len(set(sums.values())) == 1
    assert on("cpu-1", "stat -c '%a %U:%G' /etc/munge/munge.key").stdout.strip() == "400 munge:munge"
    # A credential made on a compute node decodes on the head: the key really is shared.
    credential = on("cpu-2", "munge -n").stdout.strip()
    assert "STATUS:          Success" in on("head", f"echo '{credential}' | unmunge").stdout
    # The key never reaches a log: neither its bytes as hex nor as base64.
    key = bytes.fromhex("".join(on("head", "od -An -tx1 -v /etc/munge/munge.key").stdout.split()))
    cluster_dir = StateDir.for_config(load_config(CONFIG)).cluster("citest")
    assert cluster_dir.munge_key.read_bytes() == key
    assert (cluster_dir.munge_key.stat().st_mode & 0o777) == 0o600
    logs = list(cluster_dir.logs.glob("*.log"))
    assert logs
    for log in logs:
        text = log.read_text(errors="replace")
        assert key[:24].hex() not in text and base64.b64encode(key[:48]).decode() not in text


def test_second_make_cluster_changes_nothing(cluster):
    before = on("head", "pidof slurmctld").stdout.strip()
    slurmd_before = on("cpu-1", "pidof slurmd").stdout.strip()
    again = run(["make", "cluster", f"CONFIG={CONFIG}"], timeout=600)
    # Inputs unchanged and the head as applied: Ansible is not run at all.
    assert "0 changed tasks (nothing to configure)" in again.stdout, again.stdout + again.stderr
    assert "nothing changed since the last configure" in again.stderr
    # The play itself is idempotent too: run anyway, it changes nothing and restarts nothing.
    forced = cb("cluster", "up", "--reconfigure", timeout=600)
    assert ", 0 changed tasks" in forced.stdout and "nothing to configure" not in forced.stdout, forced.stdout
    assert on("head", "pidof slurmctld").stdout.strip() == before
    assert on("cpu-1", "pidof slurmd").stdout.strip() == slurmd_before


def test_drift_on_the_head_is_reported_and_configured_away(cluster):
    on("head", "echo '# edited by hand' >> /etc/slurm/slurm.conf")
    result = cb("cluster", "up", timeout=600)
    assert "drift on the head since the last configure: /etc/slurm/slurm.conf changed" in result.stderr
    assert "nothing to configure" not in result.stdout
    assert "# edited by hand" not in on("head", "cat /etc/slurm/slurm.conf").stdout
    again = cb("cluster", "up", timeout=600)
    assert "0 changed tasks (nothing to configure)" in again.stdout, again.stderr


def test_stopped_compute_node_rejoins_idle(cluster):
    cb("node", "stop", "cpu-2")
    status = json.loads(cb("cluster", "status", "--json").stdout)
    assert {n["name"]: n["state"] for n in status["nodes"]}["cpu-2"] == "stopped"
    cb("node", "start", "cpu-2")
    assert poll(lambda: slurm_states().get("cpu-2") == "idle", timeout=120), slurm_states()
    assert sorted(on("head", "srun -N2 hostname").stdout.split()) == ["cpu-1", "cpu-2"]


def test_status_json_reports_nodes(cluster):
    def settled():
        # A job of an earlier test may still be completing on a node ("comp"): wait for the nodes to settle.
        status = json.loads(cb("cluster", "status", "--json").stdout)
        return status if all(n["slurm_state"] in (None, "idle") for n in status["nodes"]) else None

    status = poll(settled, timeout=60, interval=2) or json.loads(cb("cluster", "status", "--json").stdout)
    assert [(n["name"], n["state"], n["slurm_state"]) for n in status["nodes"]] == [
        ("head", "running", None),
        ("login-1", "running", None),  # no slurmd: not a node of Slurm's
        ("cpu-1", "running", "idle"),
        ("cpu-2", "running", "idle"),
        ("util-1", "running", "idle"),
    ]
    assert status["image"].startswith("clusterbake-debian-12-")


def test_inventory_graph(cluster):
    env = {"CLUSTERBAKE_CONFIG": str(CONFIG), "PATH": f"{REPO / '.venv/bin'}:/usr/sbin:/usr/bin:/sbin:/bin"}
    graph = run([str(REPO / ".venv/bin/ansible-inventory"), "-i", "inventories/local.py", "--graph"], env=env).stdout
    assert "@slurm_head:" in graph and "head" in graph
    assert "@nodegroup_cpu:" in graph and "cpu-1" in graph and "cpu-2" in graph


def test_slurm_conf_is_managed_and_configless(cluster):
    conf = on("head", "cat /etc/slurm/slurm.conf").stdout
    assert "managed by clusterbake" in conf.lower()
    assert "enable_configless" in conf
    assert "NodeName=cpu-[1-2]" in conf
    assert on("cpu-1", "test -e /etc/slurm/slurm.conf", check=False).returncode != 0


def test_slurmd_restarts_after_a_crash(cluster):
    before = on("cpu-1", "pidof slurmd").stdout.strip()
    on("cpu-1", "kill -9 $(pidof slurmd)")

    # The killed slurmd may still be listed for a moment (not reaped yet): wait for another pid.
    def new_pid():
        pid = on("cpu-1", "pidof slurmd", check=False).stdout.strip()
        return pid if pid and pid != before else None

    restarted = poll(new_pid, timeout=30)
    assert restarted, before
    assert poll(lambda: slurm_states().get("cpu-1") == "idle", timeout=60), slurm_states()


def test_doctor_finds_a_stopped_munge_and_says_how_to_fix_it(cluster):
    healthy = cb("doctor")
    assert healthy.stdout.rstrip().endswith("no problem found"), healthy.stdout
    assert "ok    cpu-1: munge, slurmd active; fabric tcp: NCCL and gloo over sockets on host0" in healthy.stdout
    on("cpu-1", "systemctl stop munge")
    try:
        sick = cb("doctor", check=False)
        assert sick.returncode == 1, sick.stdout
        assert "FAIL  cpu-1: munge is inactive; fix: clusterbake ssh cpu-1 -- systemctl restart munge" in sick.stdout, (
            sick.stdout
        )
        assert sick.stdout.rstrip().endswith("1 problem(s) found")
    finally:
        on("cpu-1", "systemctl start munge")
    assert poll(lambda: cb("doctor", check=False).returncode == 0), "doctor still finds a problem"


def test_ops_drain_and_resume_keep_a_running_job(cluster):
    def nodes() -> dict[str, tuple[str, str]]:
        out = on("head", "sinfo -h -N -n 'cpu-[1-2]' -o '%N|%t|%E'").stdout
        return {name: (state, reason) for name, state, reason in (line.split("|") for line in out.splitlines())}

    sbatch = "runuser -u researcher -- sbatch --parsable -w cpu-2 -o /dev/null --wrap 'sleep 60'"
    job = on("head", sbatch).stdout.strip()
    try:
        assert poll(lambda: on("head", f"squeue -h -j {job} -o %T").stdout.strip() == "RUNNING")
        check = cb("ops", "drain", "-e", "nodes=cpu-[1-2]", "-e", "reason=ops test", "--check")
        assert "0 changed (check mode)" in check.stdout
        assert {state for state, _ in nodes().values()} <= {"idle", "alloc", "mix"}  # check mode changed nothing
        drained = cb("ops", "drain", "-e", "nodes=cpu-[1-2]", "-e", "reason=ops test")
        assert ", 1 changed" in drained.stdout
        assert nodes() == {"cpu-1": ("drain", "ops test"), "cpu-2": ("drng", "ops test")}
        assert on("head", f"squeue -h -j {job} -o %T").stdout.strip() == "RUNNING"  # the job goes on
        assert ", 0 changed" in cb("ops", "drain", "-e", "nodes=cpu-[1-2]", "-e", "reason=ops test").stdout
        # The same playbooks run with plain ansible-playbook and the provider's inventory.
        run(
            [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", "inventories/local.py", "ansible/ops/resume.yml",
             "-e", "nodes=cpu-[1-2]"],
            env={"CLUSTERBAKE_CONFIG": str(CONFIG)},
        )  # fmt: skip
        # Back in service: no drain flag, no reason. A trailing "*" (not responding) is Slurm's
        # ping, not the playbook's: seen once in CI on a loaded machine; it clears at the next ping.
        assert {name: (state.rstrip("*"), reason) for name, (state, reason) in nodes().items()} in (
            {"cpu-1": ("idle", "none"), "cpu-2": ("mix", "none")},
            {"cpu-1": ("idle", "none"), "cpu-2": ("alloc", "none")},
        ), nodes()
        assert poll(lambda: {state for state, _ in nodes().values()} <= {"idle", "alloc", "mix"}, timeout=150)
        assert on("head", f"squeue -h -j {job} -o %T").stdout.strip() == "RUNNING"
    finally:
        on("head", f"scancel {job}", check=False)


def test_partition_change_reconfigures_without_restart(cluster, tmp_path):
    """A slurm.conf change that needs no restart reaches Slurm by `scontrol reconfigure`."""
    changed = tmp_path / "cluster.yaml"
    changed.write_text(CONFIG.read_text().replace("default: true", "default: true\n    max_time: '30'"))
    controller = on("head", "pidof slurmctld").stdout.strip()
    slurmd = on("cpu-1", "pidof slurmd").stdout.strip()
    try:
        cb("cluster", "up", config=changed, timeout=600)
        assert "MaxTime=00:30:00" in on("head", "scontrol show partition cpu").stdout
        assert on("head", "pidof slurmctld").stdout.strip() == controller
        assert on("cpu-1", "pidof slurmd").stdout.strip() == slurmd
    finally:
        cb("cluster", "up", timeout=600)
    assert "MaxTime=UNLIMITED" in on("head", "scontrol show partition cpu").stdout


def test_a_fresh_compute_node_joins_by_itself(cluster):
    """Scale-out path: a node with no state of its own boots from the image plus its
    group's join bundle and becomes idle in Slurm with no Ansible run."""
    cluster_dir = StateDir.for_config(load_config(CONFIG)).cluster("citest")
    cb("node", "stop", "cpu-2")
    shutil.rmtree(cluster_dir.node("cpu-2"))
    logs_before = sorted(cluster_dir.logs.iterdir())
    cb("node", "start", "cpu-2")
    assert poll(lambda: slurm_states().get("cpu-2") == "idle", timeout=120), slurm_states()
    assert sorted(cluster_dir.logs.iterdir()) == logs_before, "an Ansible run happened"
    assert on("cpu-2", "id -u researcher").stdout.strip() == "2001"
    assert on("cpu-2", "stat -c '%a %U' /etc/munge/munge.key").stdout.strip() == "400 munge"
    assert sorted(on("head", "srun -N2 hostname").stdout.split()) == ["cpu-1", "cpu-2"]


def test_nodes_trust_the_extra_ca_certificates(cluster):
    """The local default bakes the host's extra CA certificates into the image (PLATFORM.md: TLS)."""
    host_cas = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    assert host_cas, "this host has no extra CA certificates to test with"
    bundle = on("cpu-1", "cat /etc/ssl/certs/ca-certificates.crt").stdout
    for ca in host_cas:
        body = "".join(ca.read_text().split("-----")[2].split())
        assert body[:64] in "".join(bundle.split()), f"{ca} is not trusted on the node"


def host_leftovers(cluster: str) -> dict[str, list[str]]:
    """Everything of this cluster that could outlive a destroy on the host."""
    netns = [p.name for p in Path("/run/netns").glob(f"cb-{cluster}-*")] if Path("/run/netns").exists() else []
    links = [line.split(":")[1].strip() for line in run(["ip", "-o", "link"]).stdout.splitlines()]
    ours = {bridge_name(cluster)} | {veth_name(cluster, n) for n in ("head", "login-1", "cpu-1", "cpu-2", "util-1")}
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    processes = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"systemd-nspawn") and f"--machine=cb-{cluster}-".encode() in b" ".join(argv):
            processes.append(cmdline.parent.name)
    cgroups = [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/clusterbake/cb-{cluster}-*")]
    return {
        "netns": netns,
        "links": [name for name in links if name.split("@")[0] in ours],
        "mounts": [m for m in mounts if f"/clusters/{cluster}/" in m],
        "nspawn": processes,
        "cgroups": cgroups,
    }


@pytest.mark.ends_shared_cluster  # after every other test of the run that uses it
def test_destroy_leaves_a_clean_machine_and_can_run_twice(cluster):
    assert host_leftovers("citest")["nspawn"], "the cluster should be running before destroy"
    run(["make", "destroy", f"CONFIG={CONFIG}"], timeout=300)
    assert host_leftovers("citest") == {"netns": [], "links": [], "mounts": [], "nspawn": [], "cgroups": []}
    assert not StateDir.for_config(load_config(CONFIG)).cluster("citest").root.exists()
    again = run(["make", "destroy", f"CONFIG={CONFIG}"], timeout=300)
    assert "nothing to remove" in again.stderr
