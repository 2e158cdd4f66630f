"""The join bundles are the same on every render of the same inventory: their bytes decide whether a
re-run of `cluster up` changes anything (a bundle that differs is rewritten and re-applied), so no
part may depend on a Python set's order, which differs from process to process (PYTHONHASHSEED)."""

from __future__ import annotations

import json

import pytest
from join_run import files, host, play
from playbook_run import ANSIBLE_PLAYBOOK

HOSTS = {"head": host("10.0.1.10", "head"), "cpu-1": host("10.0.1.11", "cpu")}
GROUPS = {"slurm_head": ["head"], "slurm_compute": ["cpu-1"]}
STORAGE = [
    {"name": "shared", "mount_point": "/shared", "type": "hostdir"},
    {"name": "scratch", "mount_point": "/scratch", "type": "hostdir"},
    {"name": "datasets", "mount_point": "/datasets", "type": "hostdir", "read_only": True},
    {"name": "apps", "mount_point": "/apps", "type": "hostdir"},
]
VARIABLES = {
    "clusterbake_storage": STORAGE,
    "clusterbake_accounting": {"enabled": False},
    "clusterbake_monitoring": {"enabled": False},
}


def test_a_compute_bundle_renders_the_same_in_every_process(tmp_path, monkeypatch):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.fail("ansible-playbook is not in the venv: run `make venv`")
    bundles = []
    for seed in ("1", "2"):
        monkeypatch.setenv("PYTHONHASHSEED", seed)
        (tmp_path / seed).mkdir()
        bundles.append(play(tmp_path / seed, HOSTS, GROUPS, VARIABLES)["bundles"]["cpu-1"])
    health = json.loads(files(bundles[0])["/etc/clusterbake/health.json"]["text"])
    # The config's order, /home first; the read-only entry only among the read-only mounts.
    assert health["mounts"] == ["/home", "/shared", "/scratch", "/apps"]
    assert health["read_only_mounts"] == ["/datasets"]
    # Byte for byte, but for the munge key: join_run makes a new one for each play.
    first, second = ({**b, "files": [f for f in b["files"] if f["path"] != "/etc/munge/munge.key"]} for b in bundles)
    assert first == second


POWER_FILES = {
    "/etc/clusterbake/power.json",
    "/etc/clusterbake/power.token",
    "/etc/systemd/system/clusterbake-power-reconcile.timer.d/interval.conf",
}


def test_the_head_bundle_carries_the_power_program_settings(tmp_path):
    """Role slurm_power's files come with the head's join bundle (no task each): the settings and the
    agent's token readable by the Slurm user only, the reconcile interval as a timer drop-in."""
    hosts = {**HOSTS, "burst-1": host("10.0.1.12", "burst", clusterbake_elastic=True)}
    hosts["cpu-1"] = {**hosts["cpu-1"], "clusterbake_elastic": False}
    groups = {"slurm_head": ["head"], "slurm_compute": ["cpu-1", "burst-1"]}
    result = play(tmp_path, hosts, groups, {**VARIABLES, "clusterbake_recovery": {"reconcile_interval": 7}})
    head = files(result["bundles"]["head"])
    assert set(head) >= POWER_FILES
    # The reconcile timer: enabled by the head's join, started by the controller play (with slurmctld).
    held = ["clusterbake-power-reconcile.timer", "slurmctld"]
    assert result["bundles"]["head"]["after_controller"] == held
    assert set(held) <= set(result["bundles"]["head"]["services"])
    assert [a for a in result["argv"]["head"] if a.startswith("--hold")] == [f"--hold={s}" for s in held]
    settings = head["/etc/clusterbake/power.json"]
    assert (settings["mode"], settings["owner"], settings["group"]) == ("0640", "root", "slurm")
    power = json.loads(settings["text"])
    assert (power["elastic_nodes"], power["static_nodes"]) == (["burst-1"], ["cpu-1"])
    assert power["agent"] == "unix:///run/clusterbake-power-agent/agent.sock"
    assert power["token_file"] == "/etc/clusterbake/power.token"
    token = head["/etc/clusterbake/power.token"]
    assert token["text"] == (tmp_path / "power.token").read_text() and token["mode"] == "0640"
    assert "OnUnitActiveSec=7s" in head["/etc/systemd/system/clusterbake-power-reconcile.timer.d/interval.conf"]["text"]
    # Never in a compute node's bundle (the token is the head's).
    for name in ("cpu-1", "burst-1"):
        assert not POWER_FILES & set(files(result["bundles"][name]))


def test_nothing_to_reconcile_gives_the_head_only_the_interval(tmp_path):
    hosts = {**HOSTS, "cpu-1": {**HOSTS["cpu-1"], "clusterbake_elastic": False}}
    variables = {**VARIABLES, "clusterbake_recovery": {"replace_lost_nodes": False}}
    result = play(tmp_path, hosts, GROUPS, variables)
    head = files(result["bundles"]["head"])
    assert POWER_FILES & set(head) == {"/etc/systemd/system/clusterbake-power-reconcile.timer.d/interval.conf"}
    # No timer to enable: the head's join holds slurmctld only.
    assert "clusterbake-power-reconcile.timer" not in result["bundles"]["head"]["services"]
    assert result["bundles"]["head"]["after_controller"] == ["slurmctld"]
    assert [a for a in result["argv"]["head"] if a.startswith("--hold")] == ["--hold=slurmctld"]


def test_in_one_play_the_head_gets_no_compute_part(tmp_path):
    """ansible/cluster.yml joins the head and renders the compute bundles in one play: a compute-only
    part (configless slurmd, health checks, notice agent) must not reach the head's bundle, as a
    run_once fact would (it is set on every host of the play)."""
    result = play(tmp_path, HOSTS, GROUPS, VARIABLES)
    bundles = result["bundles"]
    compute_only_files = {
        "/etc/default/slurmd",
        "/etc/clusterbake/slurmd-restart.digest",
        "/etc/clusterbake/health.json",
        "/etc/clusterbake/notice.json",
    }
    compute_only_services = {"slurmd", "clusterbake-health.timer", "clusterbake-notice-agent"}
    assert compute_only_files <= set(files(bundles["cpu-1"]))
    assert compute_only_services <= set(bundles["cpu-1"]["services"])
    assert not compute_only_files & set(files(bundles["head"]))
    assert not compute_only_services & set(bundles["head"]["services"])
    # What talks to slurmctld as it starts: the local provider joins a compute node during the play
    # but for these, which it starts once slurmctld runs.
    assert bundles["cpu-1"]["after_controller"] == ["slurmd", "clusterbake-health.timer"]
    # The head's: enabled by its join, started by the controller play once slurm.conf is written.
    assert bundles["head"]["after_controller"] == ["slurmctld"]
    assert "slurmctld" in bundles["head"]["services"]
    assert [a for a in result["argv"]["head"] if a.startswith("--hold")] == ["--hold=slurmctld"]
    # A compute node Ansible joins (join_after_controller: once slurmctld runs) holds nothing.
    assert result["argv"]["cpu-1"][:1] == ["--install"]
    assert not [a for a in result["argv"]["cpu-1"] if a.startswith("--hold")]
    # The parts both have are the same (run_once parts, rendered once for the play).
    assert files(bundles["head"])["/etc/hosts"] == files(bundles["cpu-1"])["/etc/hosts"]


def test_the_heads_join_writes_the_slurm_config_and_a_restart_digest_for_slurmctld(tmp_path):
    """slurm.conf, cgroup.conf and the StateSaveLocation come with the head's join (one remote task),
    gres.conf is removed when no node has GPUs, and slurmctld's restart digest is the one the compute
    nodes' slurmd digest files carry (a change restarts both)."""
    result = play(tmp_path, HOSTS, GROUPS, VARIABLES)
    head, compute = result["bundles"]["head"], result["bundles"]["cpu-1"]
    written = files(head)
    assert "NodeName=cpu-1 " in written["/etc/slurm/slurm.conf"]["text"]
    assert written["/etc/slurm/cgroup.conf"]["text"].startswith("# Managed by clusterbake")
    digest = written["/etc/clusterbake/slurmctld-restart.digest"]
    assert (digest["restart"], digest["restart_on_create"]) == (["slurmctld"], False)
    assert digest["text"] == files(compute)["/etc/clusterbake/slurmd-restart.digest"]["text"]
    assert len(digest["text"]) == 64
    assert head["absent"] == [{"path": "/etc/slurm/gres.conf"}]
    assert head["directories"] == [{"path": "/var/spool/slurmctld", "owner": "slurm", "group": "slurm", "mode": "0700"}]
    # A compute node gets none of it: its slurmd fetches the config from slurmctld.
    assert not {path for path in files(compute) if path.startswith("/etc/slurm/")}
    assert (compute["directories"], compute["absent"]) == ([], [])
