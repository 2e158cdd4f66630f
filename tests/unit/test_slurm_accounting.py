"""Role slurm_accounting: the head's join bundle part (slurmdbd.conf, MariaDB's settings and
init file), through the real ansible/tasks/join.yml and node_join, and the registration
program's plan (what sacctmgr is asked to do).

ansible-playbook runs tests/playbooks/join.yml (a head and a compute node, local
connection, a fake join program that keeps the bundle it gets) for MariaDB on the head,
an external server and accounting off. The database password must be in the head's
slurmdbd.conf and init file only: not in the compute node's bundle, Ansible's output
(-v) or any task result. slurmdbd, MariaDB and sacctmgr themselves run in
tests/integration/test_accounting.py.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path

import join_run
import pytest
from join_run import files, host, revealed
from playbook_run import ANSIBLE_PLAYBOOK, REPO

ACCOUNTING = {
    "enabled": True,
    "database": None,
    "accounts": [{"name": "general", "description": "every user by default", "fairshare": 1}],
    "users": [{"name": "researcher", "account": "general"}],
    "enforce_associations": True,
    "fairshare_weight": 10000,
    "age_weight": 1000,
    "decay_half_life": "7-0",
    "innodb_buffer_pool_mb": None,
}
HOSTS = {"head": host("10.0.1.10", "head", memory=8192), "cpu-1": host("10.0.1.11", "cpu")}
GROUPS = {"slurm_head": ["head"], "slurm_compute": ["cpu-1"]}


def play(tmp: Path, accounting: dict) -> dict:
    return join_run.play(tmp, HOSTS, GROUPS, {"clusterbake_accounting": accounting})


@pytest.fixture(scope="module")
def local_db(tmp_path_factory):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip("ansible-playbook is not in the venv (make venv)")
    return play(tmp_path_factory.mktemp("accounting_local"), ACCOUNTING)


@pytest.fixture(scope="module")
def external_db(tmp_path_factory):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip("ansible-playbook is not in the venv (make venv)")
    tmp = tmp_path_factory.mktemp("accounting_external")
    ca = tmp / "rds-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    database = {
        "host": "db.abc123.us-east-1.rds.amazonaws.com",
        "port": 3307,
        "name": "cluster_acct",
        "user": "admin",
        "password_file": str(tmp / "slurmdbd.password"),  # play() writes it (both paths are the same file)
        "ca_file": str(ca),
    }
    return play(tmp, {**ACCOUNTING, "database": database})


def settings(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def test_head_gets_slurmdbd_conf_0600_for_the_slurm_user(local_db):
    conf = files(local_db["bundles"]["head"])["/etc/slurm/slurmdbd.conf"]
    assert (conf["owner"], conf["group"], conf["mode"], conf["restart"]) == ("slurm", "slurm", "0600", ["slurmdbd"])
    assert settings(conf["text"]) == {
        "AuthType": "auth/munge",
        "DbdHost": "head",
        "DbdPort": "6819",
        "SlurmUser": "slurm",
        "LogFile": "/var/log/slurm/slurmdbd.log",
        "PidFile": "/run/slurmdbd.pid",
        "StorageType": "accounting_storage/mysql",
        "StorageHost": "localhost",
        "StoragePort": "3306",
        "StorageUser": "slurm",
        "StoragePass": local_db["password"],
        "StorageLoc": "slurm_acct_db",
    }


def test_head_runs_mariadb_with_schedmds_settings_and_keeps_the_users_password(local_db):
    head = files(local_db["bundles"]["head"])
    cnf = head["/etc/mysql/mariadb.conf.d/90-clusterbake-slurm.cnf"]
    assert cnf["restart"] == ["mariadb"] and cnf["mode"] == "0644"
    assert settings(cnf["text"]) == {
        "innodb_buffer_pool_size": "819M",  # 10% of the head's 8192 MiB
        "innodb_log_file_size": "128M",
        "innodb_lock_wait_timeout": "900",
        "bind-address": "127.0.0.1",
        "init_file": "/etc/mysql/clusterbake-slurm.sql",
    }
    init = head["/etc/mysql/clusterbake-slurm.sql"]
    assert (init["owner"], init["mode"], init["restart"]) == ("mysql", "0600", ["mariadb"])
    assert f"ALTER USER 'slurm'@'localhost' IDENTIFIED BY '{local_db['password']}';" in init["text"].splitlines()
    # munge first (slurmdbd authenticates with it), then MariaDB before slurmdbd.
    services = local_db["bundles"]["head"]["services"]
    assert services.index("munge") < services.index("mariadb") < services.index("slurmdbd")
    # No delayed ACKs on the head's own routes from before slurmdbd starts (its unit says so too).
    assert services.index("clusterbake-tcp-quickack.service") < services.index("slurmdbd")
    assert "clusterbake-tcp-quickack.service" not in local_db["bundles"]["cpu-1"]["services"]


def test_the_password_reaches_no_compute_node_no_log_and_no_task_result(local_db):
    password = local_db["password"]
    compute = local_db["bundles"]["cpu-1"]
    assert password not in json.dumps(compute)
    assert not any(password in f["text"] for f in files(compute).values())
    assert "slurmdbd" not in compute["services"] and "mariadb" not in compute["services"]
    assert not revealed(local_db["output"], password)
    assert not revealed(local_db["records"], password)


def test_an_external_database_runs_no_mariadb_and_speaks_tls(external_db):
    head = files(external_db["bundles"]["head"])
    assert not any(path.startswith("/etc/mysql") for path in head)
    assert "mariadb" not in external_db["bundles"]["head"]["services"]
    assert "slurmdbd" in external_db["bundles"]["head"]["services"]
    conf = settings(head["/etc/slurm/slurmdbd.conf"]["text"])
    assert {k: conf[k] for k in ("StorageHost", "StoragePort", "StorageUser", "StorageLoc", "StorageParameters")} == {
        "StorageHost": "db.abc123.us-east-1.rds.amazonaws.com",
        "StoragePort": "3307",
        "StorageUser": "admin",
        "StorageLoc": "cluster_acct",
        "StorageParameters": "SSL_CA=/etc/slurm/slurmdbd-ca.pem",
    }
    assert conf["StoragePass"] == external_db["password"]
    ca = head["/etc/slurm/slurmdbd-ca.pem"]
    assert ca["text"].startswith("-----BEGIN CERTIFICATE-----") and ca["restart"] == ["slurmdbd"]
    assert not revealed(external_db["output"] + json.dumps(external_db["bundles"]["cpu-1"]), external_db["password"])


def test_accounting_off_adds_nothing(tmp_path):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip("ansible-playbook is not in the venv (make venv)")
    off = play(tmp_path, {**ACCOUNTING, "enabled": False})
    assert "/etc/slurm/slurmdbd.conf" not in files(off["bundles"]["head"])
    assert "slurmdbd" not in off["bundles"]["head"]["services"]
    assert "clusterbake-tcp-quickack.service" not in off["bundles"]["head"]["services"]


def test_the_head_keeps_its_delayed_acks_when_told_to(tmp_path):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip("ansible-playbook is not in the venv (make venv)")
    kept = join_run.play(
        tmp_path, HOSTS, GROUPS, {"clusterbake_accounting": ACCOUNTING, "slurm_accounting_tcp_quickack": False}
    )
    services = kept["bundles"]["head"]["services"]
    assert "slurmdbd" in services and "clusterbake-tcp-quickack.service" not in services


# --- the registration program's plan --------------------------------------------------------

PROGRAM = REPO / "roles" / "slurm_accounting" / "files" / "clusterbake-slurm-accounts"


@pytest.fixture(scope="module")
def accounts():
    loader = importlib.machinery.SourceFileLoader("clusterbake_slurm_accounts", str(PROGRAM))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


WANT = {
    "cluster": "citest",
    "accounts": [{"name": "general", "description": "every user by default", "fairshare": 1}],
    "users": [{"name": "researcher", "account": "general"}],
}


def test_a_new_cluster_is_registered_with_its_accounts_and_users(accounts):
    steps = accounts.plan(WANT, [], [], {}, {})
    assert steps == [
        ("cluster citest", ["add", "cluster", "citest"]),
        (
            "account general",
            ["add", "account", "general", "cluster=citest", "description=every user by default", "fairshare=1"],
        ),
        ("user researcher in general", ["add", "user", "researcher", "account=general", "cluster=citest"]),
    ]


def test_what_exists_is_left_alone(accounts):
    # sacctmgr's rows once registered: root's associations, the account's, the user's.
    associations = [["root", "", "1"], ["root", "root", "1"], ["general", "", "1"], ["general", "researcher", "1"]]
    users = {"root": "root", "researcher": "general"}
    assert accounts.plan(WANT, ["citest"], associations, users, {"general": "every user by default"}) == []


def test_changed_shares_and_accounts_are_modified_never_removed(accounts):
    want = {
        **WANT,
        "accounts": [{"name": "general", "description": "every user by default", "fairshare": 3}],
        "users": [{"name": "researcher", "account": "vision"}],
    }
    want["accounts"].append({"name": "vision", "description": "", "fairshare": 1})
    associations = [["general", "", "1"], ["general", "researcher", "1"], ["old", "", "1"]]
    steps = accounts.plan(
        want, ["citest"], associations, {"researcher": "general"}, {"general": "every user by default"}
    )
    assert [label for label, _ in steps] == [
        "account general fairshare 3",
        "account vision",
        "user researcher in vision",
        "user researcher default account vision",
    ]
    assert not any(arguments[0] == "delete" for _, arguments in steps)


LIMITED = {
    "name": "guests",
    "description": "capped",
    "fairshare": 1,
    "grp_tres": "node=1,gres/gpu=8",
    "max_jobs": 2,
    "max_submit_jobs": 4,
    "max_wall": "0:10:00",
}


def test_a_new_account_is_added_with_its_limits(accounts):
    steps = accounts.plan({**WANT, "accounts": [LIMITED], "users": []}, ["citest"], [], {}, {})
    assert steps == [
        (
            "account guests",
            [
                "add", "account", "guests", "cluster=citest", "description=capped", "fairshare=1",
                "GrpTRES=node=1,gres/gpu=8", "MaxJobs=2", "MaxSubmitJobs=4", "MaxWall=0:10:00",
            ],
        )
    ]  # fmt: skip


def test_limits_as_sacctmgr_prints_them_are_left_alone(accounts):
    # sacctmgr lists TRES in its own order and MaxWall as [DAYS-]HH:MM:SS.
    associations = [
        ["guests", "", "1", "gres/gpu=8,node=1", "2", "4", "00:10:00"],
        ["general", "", "1", "", "", "", ""],
    ]
    want = {**WANT, "accounts": [LIMITED, WANT["accounts"][0]], "users": []}
    assert (
        accounts.plan(want, ["citest"], associations, {}, {"guests": "capped", "general": "every user by default"})
        == []
    )


def test_changed_limits_are_set_and_dropped_ones_cleared(accounts):
    associations = [["guests", "", "1", "gres/gpu=8,node=1", "2", "4", "00:10:00"]]
    want = {**WANT, "users": [], "accounts": [{**LIMITED, "grp_tres": "node=2", "max_jobs": None, "max_wall": "1-0"}]}
    steps = accounts.plan(want, ["citest"], associations, {}, {"guests": "capped"})
    assert steps == [
        (
            "account guests limits GrpTRES,MaxJobs,MaxWall",
            [
                "modify", "account", "where", "name=guests", "cluster=citest", "set",
                "GrpTRES=node=2,gres/gpu=-1", "MaxJobs=-1", "MaxWall=1-0",
            ],
        )
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10", 10), ("10:30", 11), ("01:30:00", 90), ("2-0", 2880), ("1-00:00:00", 1440), ("1-2:30", 1590)],
)
def test_slurm_times_in_minutes(accounts, text, expected):
    assert accounts.minutes(text) == expected


def test_the_directory_groups_members_not_listed_are_users_of_its_account(accounts, tmp_path, monkeypatch):
    """`directory`: the group's members as `getent group` gives them (SSSD), but for users the config lists."""
    getent = tmp_path / "getent"
    getent.write_text('#!/bin/sh\n[ "$2" = hpc-users ] && echo "hpc-users:*:3000:dana,researcher,eve" || exit 2\n')
    getent.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    listed = [{"name": "researcher", "account": "general"}]
    found = accounts.directory_users({"group": "hpc-users", "account": "general"}, listed, timeout=1)
    assert found == [{"name": "dana", "account": "general"}, {"name": "eve", "account": "general"}]
    assert accounts.directory_users({}, listed, timeout=1) == []
    with pytest.raises(accounts.AccountsError, match="the directory's group is unknown here"):
        accounts.directory_users({"group": "nobody", "account": "general"}, listed, timeout=0)
