"""The join bundles are the same on every render of the same inventory: their bytes decide whether a
re-run of `cluster up` changes anything (a bundle that differs is rewritten and re-applied), so no
part may depend on a Python set's order, which differs from process to process (PYTHONHASHSEED)."""

from __future__ import annotations

import base64
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
    # (and, with the REST API off, slurmrestd's settings and the JWT key; without a directory, SSSD's files)
    slurms = [entry for entry in head["absent"] if not entry["path"].startswith(("/etc/sssd/", "/etc/ssh/"))]
    assert slurms == [
        {"path": "/etc/slurm/gres.conf"},
        {"path": "/etc/slurm/topology.conf"},
        {"path": "/etc/default/slurmrestd"},
        {"path": "/var/spool/slurmctld/jwt_hs256.key"},
    ]
    assert head["directories"] == [{"path": "/var/spool/slurmctld", "owner": "slurm", "group": "slurm", "mode": "0700"}]
    assert "TopologyPlugin" not in written["/etc/slurm/slurm.conf"]["text"]  # no topology known
    # A compute node gets none of it: its slurmd fetches the config from slurmctld.
    assert not {path for path in files(compute) if path.startswith("/etc/slurm/")}
    assert compute["directories"] == []
    assert not [entry for entry in compute["absent"] if entry["path"].startswith("/etc/slurm/")]


def test_a_login_nodes_bundle_is_slurms_commands_without_a_daemon_and_the_head_becomes_the_operators(tmp_path):
    """A login node (group slurm_login): the users' node. Its Slurm commands fetch slurm.conf from
    slurmctld (SLURM_CONF_SERVER from sshd and the login shells' profile), no slurmd, no health checks
    or notice agent, anyone with a key logs in; with a login node the head admits only the
    administrators (pam_access), and without one everyone, as before."""
    hosts = {**HOSTS, "login-1": host("10.0.1.9", "login")}
    hosts["head"] = {**hosts["head"], "ansible_user": "root"}
    groups = {**GROUPS, "slurm_login": ["login-1"]}
    users = [{"name": "alice", "uid": 2001, "gid": 2001, "sudo": True}, {"name": "bob", "uid": 2002, "gid": 2002}]
    result = play(tmp_path, hosts, groups, {**VARIABLES, "clusterbake_users": users})
    login, head = result["bundles"]["login-1"], result["bundles"]["head"]
    written = files(login)
    assert written["/etc/ssh/sshd_config.d/60-clusterbake-slurm.conf"]["text"].splitlines()[1:] == [
        "SetEnv SLURM_CONF_SERVER=head:6817"
    ]
    assert written["/etc/ssh/sshd_config.d/60-clusterbake-slurm.conf"]["restart"] == ["ssh"]
    assert "export SLURM_CONF_SERVER=head:6817" in written["/etc/profile.d/clusterbake-slurm.sh"]["text"]
    assert "account optional pam_permit.so" in written["/etc/pam.d/clusterbake-slurm-adopt"]["text"]
    assert {"path": "/etc/security/clusterbake-ssh-access.conf"} in login["absent"]
    assert not {"/etc/default/slurmd", "/etc/clusterbake/health.json", "/etc/clusterbake/notice.json"} & set(written)
    assert "munge" in login["services"] and "ssh" in login["services"]
    assert not {"slurmd", "slurmctld", "clusterbake-health.timer"} & set(login["services"])
    assert login["after_controller"] == []
    assert "/etc/munge/munge.key" in written and "login-1" in written["/etc/hosts"]["text"]
    # The head: the administrators (root, the sudo user) and no one else.
    access = files(head)["/etc/security/clusterbake-ssh-access.conf"]["text"].splitlines()
    assert access[1:] == ["+:root alice:ALL", "-:ALL:ALL"]
    stack = files(head)["/etc/pam.d/clusterbake-slurm-adopt"]["text"]
    assert "account required pam_access.so accessfile=/etc/security/clusterbake-ssh-access.conf" in stack
    # slurm.conf names no login node: they are no nodes of Slurm's.
    assert "login-1" not in files(head)["/etc/slurm/slurm.conf"]["text"]

    (tmp_path / "without").mkdir()
    alone = play(tmp_path / "without", HOSTS, GROUPS, {**VARIABLES, "clusterbake_users": users})
    access = files(alone["bundles"]["head"])["/etc/security/clusterbake-ssh-access.conf"]["text"].splitlines()
    assert access[-1] == "+:ALL:ALL"


def test_with_the_rest_api_the_head_alone_gets_the_jwt_key_and_slurmrestd_on_its_cluster_address(tmp_path):
    """rest_api.enabled: slurm.conf verifies JWTs with the key (AuthAltTypes, a restart), the key goes in
    the head's StateSaveLocation (SlurmUser's, 0600) and in no other node's bundle, and slurmrestd
    listens on the head's address with JWT authentication only. Off, both files are removed."""
    key = tmp_path / "jwt.key"
    key.write_bytes(bytes(range(32)))
    variables = {**VARIABLES, "clusterbake_rest_api": {"enabled": True, "port": 6820}, "slurm_jwt_key_file": str(key)}
    (tmp_path / "on").mkdir()
    bundles = play(tmp_path / "on", HOSTS, GROUPS, variables)["bundles"]
    head = files(bundles["head"])
    secret = head["/var/spool/slurmctld/jwt_hs256.key"]
    assert (secret["owner"], secret["mode"]) == ("slurm", "0600")
    assert base64.b64decode(secret["content_b64"]) == key.read_bytes()
    assert head["/etc/default/slurmrestd"]["text"].splitlines()[1:] == [
        "SLURMRESTD_AUTH_TYPES=rest_auth/jwt",
        "SLURMRESTD_LISTEN=10.0.1.10:6820",
    ]
    assert "slurmrestd" in bundles["head"]["services"]
    conf = head["/etc/slurm/slurm.conf"]["text"]
    assert "AuthAltTypes=auth/jwt" in conf and "AuthAltParameters=jwt_key=/var/spool/slurmctld/jwt_hs256.key" in conf
    assert base64.b64encode(key.read_bytes()).decode() not in json.dumps(bundles["cpu-1"])
    assert "slurmrestd" not in bundles["cpu-1"]["services"]
    (tmp_path / "off").mkdir()
    off = play(tmp_path / "off", HOSTS, GROUPS, {**VARIABLES, "slurm_jwt_key_file": str(key)})["bundles"]["head"]
    assert {"path": "/etc/default/slurmrestd"} in off["absent"]
    assert {"path": "/var/spool/slurmctld/jwt_hs256.key"} in off["absent"]
    assert "AuthAltTypes" not in files(off)["/etc/slurm/slurm.conf"]["text"]


def test_with_a_directory_every_node_gets_sssd_with_the_bind_password_in_its_root_only_config(tmp_path):
    """The config's directory: SSSD on every node (jobs run as its users everywhere), its config 0600 with
    the bind password (nowhere else in the bundle), the directory's CA, sshd asking SSSD for keys; only
    the group's members are let in (simple_allow_groups), over TLS the CA verifies."""
    password, ca = tmp_path / "bind.password", tmp_path / "ca.pem"
    password.write_text("s3cret-bind-pw\n")
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    directory = {
        "uri": "ldaps://ldap.example.org",
        "base_dn": "dc=example,dc=org",
        "users_group": "hpc-users",
        "bind_dn": "cn=sssd,dc=example,dc=org",
        "bind_password_file": str(password),
        "ca_file": str(ca),
        "start_tls": False,
        "ldap_schema": "rfc2307",
        "min_uid": 2000,
    }
    (tmp_path / "play").mkdir()
    bundles = play(tmp_path / "play", HOSTS, GROUPS, {**VARIABLES, "clusterbake_directory": directory})["bundles"]
    for name in ("head", "cpu-1"):
        written = files(bundles[name])
        conf = written["/etc/sssd/sssd.conf"]
        assert conf["mode"] == "0600" and "ldap_default_authtok = s3cret-bind-pw" in conf["text"], name
        assert "simple_allow_groups = hpc-users" in conf["text"] and "ldap_tls_reqcert = demand" in conf["text"]
        assert "ldap_tls_cacert = /etc/sssd/clusterbake-directory-ca.pem" in conf["text"]
        assert written["/etc/sssd/clusterbake-directory-ca.pem"]["text"] == ca.read_text()
        assert (
            "AuthorizedKeysCommand /usr/bin/sss_ssh_authorizedkeys"
            in (written["/etc/ssh/sshd_config.d/55-clusterbake-directory.conf"]["text"])
        )
        assert "sssd" in bundles[name]["services"]
        others = [f["text"] for path, f in written.items() if path != "/etc/sssd/sssd.conf"]
        assert not any("s3cret-bind-pw" in text for text in others), name


def test_a_known_topology_gives_the_head_topology_conf_and_the_tree_plugin(tmp_path):
    """The switches the inventory gives (clusterbake.topology) as topology.conf lines (topology.conf(5):
    SwitchName with Nodes or Switches), and TopologyPlugin=topology/tree in slurm.conf."""
    topology = [
        {"name": "leaf-1", "nodes": "cpu-1"},
        {"name": "unplaced", "nodes": "gpu-[1-2]"},
        {"name": "root", "switches": "leaf-1,unplaced"},
    ]
    result = play(tmp_path, HOSTS, GROUPS, {**VARIABLES, "clusterbake_topology": topology})
    written = files(result["bundles"]["head"])
    lines = written["/etc/slurm/topology.conf"]["text"].splitlines()
    assert [line for line in lines if not line.startswith("#")] == [
        "SwitchName=leaf-1 Nodes=cpu-1",
        "SwitchName=unplaced Nodes=gpu-[1-2]",
        "SwitchName=root Switches=leaf-1,unplaced",
    ]
    assert "\nTopologyPlugin=topology/tree\n" in written["/etc/slurm/slurm.conf"]["text"]
