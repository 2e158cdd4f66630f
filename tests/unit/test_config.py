"""The config schema: defaults, and errors that name the file and the field."""

import subprocess
import sys
import textwrap

import pytest

from clusterbake.config import ClusterConfig, load_config
from clusterbake.errors import ConfigError

MINIMAL = """
cluster_name: demo
node_groups:
  - name: cpu
    count: 2
"""


def write(tmp_path, text):
    path = tmp_path / "cluster.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error_for(tmp_path, text) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    return str(info.value)


def test_defaults_in_one_place(tmp_path):
    config = load_config(write(tmp_path, MINIMAL))
    assert config.provider == "local"
    assert config.local.subnet == "10.77.0.0/24"
    assert [s.mount_point for s in config.effective_storage()] == ["/shared"]
    parts = config.effective_partitions()
    assert [(p.name, p.node_groups, p.default) for p in parts] == [("cpu", ["cpu"], True)]
    assert config.slurm_plugins()["proctrack_type"] == "proctrack/linuxproc"


def test_repository_default_config_is_valid(repo):
    config = load_config(repo / "clusterbake.yaml")
    assert config.cluster_name == "local"
    assert [(g.name, g.count) for g in config.node_groups] == [("cpu", 2)]
    assert [p.name for p in config.partitions] == ["cpu"]


def test_unknown_key_is_named(tmp_path):
    message = error_for(tmp_path, MINIMAL + "colour: blue\n")
    assert "colour: unknown key" in message


def test_nested_unknown_key_has_its_path(tmp_path):
    message = error_for(tmp_path, MINIMAL.replace("count: 2", "count: 2\n    gpu_count: 8"))
    assert "node_groups.0.gpu_count: unknown key" in message


def test_wrong_type(tmp_path):
    message = error_for(tmp_path, MINIMAL.replace("count: 2", "count: many"))
    assert "node_groups.0.count" in message and "integer" in message


def test_negative_count(tmp_path):
    message = error_for(tmp_path, MINIMAL.replace("count: 2", "count: -1"))
    assert "node_groups.0.count" in message and "greater than or equal to 0" in message


def test_duplicate_node_group(tmp_path):
    message = error_for(tmp_path, MINIMAL + "  - name: cpu\n    count: 1\n")
    assert "node_groups: duplicate name 'cpu'" in message


def test_partition_naming_missing_group(tmp_path):
    message = error_for(tmp_path, MINIMAL + "partitions:\n  - name: gpu\n    node_groups: [gpu]\n")
    assert "partitions.0.node_groups: 'gpu' is not a node group" in message


def test_missing_required_field(tmp_path):
    message = error_for(tmp_path, "node_groups: [{name: cpu, count: 1}]\n")
    assert "cluster_name: required" in message


def test_bad_yaml_and_missing_file(tmp_path):
    assert "not valid YAML" in error_for(tmp_path, "cluster_name: [unclosed\n")
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "absent.yaml")


def test_bad_subnet(tmp_path):
    message = error_for(tmp_path, MINIMAL + "local:\n  subnet: 8.8.8.0/24\n")
    assert "local.subnet" in message and "private" in message


@pytest.mark.parametrize(
    "text, field",
    [
        (MINIMAL.replace("name: cpu", "name: CPU_1"), "node_groups.0.name"),
        (MINIMAL + "users:\n  - {name: alice, uid: 10}\n", "users.0.uid"),
        (MINIMAL + "storage:\n  - {name: s, mount_point: relative}\n", "storage.0.mount_point"),
        (
            MINIMAL + "partitions:\n  - {name: p, node_groups: [cpu], max_time: soon}\n",
            "partitions.0.max_time",
        ),
        (MINIMAL + "login_nodes: {count: 0}\n", "login_nodes.count"),
        (MINIMAL + "login_nodes: {count: 17}\n", "login_nodes.count"),
        (MINIMAL + "login_nodes: {ssh_cidrs: [10.0.0.0/8]}\n", "login_nodes.ssh_cidrs: only for the clouds"),
        (MINIMAL.replace("name: cpu", "name: login"), "node_groups: 'login' names the login nodes"),
        (MINIMAL + "training: {extra_requirements: ['pkg @ https://example.com/p.whl']}\n", "no URL, no pip option"),
        (MINIMAL + "training: {extra_requirements: ['--index-url http://x']}\n", "is not a pip requirement"),
        (MINIMAL + "training: {extra_requirements: ['-r more.txt']}\n", "training.extra_requirements.0"),
    ],
)
def test_field_errors(tmp_path, text, field):
    assert field in error_for(tmp_path, text)


def test_cpus_must_split_into_sockets():
    with pytest.raises(ValueError, match="multiple of sockets"):
        ClusterConfig.model_validate(
            {"cluster_name": "x", "node_groups": [{"name": "a", "count": 1, "cpus": 3, "sockets": 2}]}
        )


def test_cli_exits_2_and_names_the_field(tmp_path):
    path = write(tmp_path, MINIMAL.replace("count: 2", "count: -3"))
    result = subprocess.run(
        [sys.executable, "-m", "clusterbake.cli", "--config", str(path), "validate"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "node_groups.0.count" in result.stderr and str(path) in result.stderr


def test_config_reference_is_up_to_date(repo):
    from clusterbake.config_reference import render

    assert (repo / "docs" / "config.md").read_text() == render(), (
        "docs/config.md is stale: run .venv/bin/python -m clusterbake.config_reference > docs/config.md"
    )


def test_image_base_and_slurm_plugin_defaults_in_one_place(tmp_path):
    from clusterbake.config import DEFAULT_IMAGE_BASE, SLURM_PLUGIN_DEFAULTS, SLURM_WITHOUT_CGROUP_V2, SlurmConfig

    config = load_config(write(tmp_path, MINIMAL))
    assert config.image.base == DEFAULT_IMAGE_BASE["local"] == "debian-12"
    # A base whose Slurm cannot run cgroup plugins has defaults without them, and is not the AWS default.
    for base in SLURM_WITHOUT_CGROUP_V2:
        assert not any(value.endswith("/cgroup") for value in SLURM_PLUGIN_DEFAULTS[base].values())
    assert DEFAULT_IMAGE_BASE["aws"] not in SLURM_WITHOUT_CGROUP_V2
    # docs/config.md's descriptions come from the same table.
    for key, value in SLURM_PLUGIN_DEFAULTS["cloud"].items():
        description = SlurmConfig.model_fields[key].description
        assert value in description and SLURM_PLUGIN_DEFAULTS["ubuntu-22.04"][key] in description


# --- accounting -----------------------------------------------------------------------------

USERS = MINIMAL + "users:\n  - {name: alice, uid: 2001}\n  - {name: bob, uid: 2002, account: vision}\n"


def test_accounting_is_on_by_default_with_one_account_for_everyone(tmp_path):
    from clusterbake.inventory import accounting_vars

    config = load_config(write(tmp_path, MINIMAL + "users:\n  - {name: alice, uid: 2001}\n"))
    assert config.accounting.enabled and config.accounting.database is None
    assert [a.name for a in config.accounting.effective_accounts()] == ["general"]
    assert accounting_vars(config)["users"] == [{"name": "alice", "account": "general"}]


def test_users_join_their_account_or_the_first_one(tmp_path):
    from clusterbake.inventory import accounting_vars

    text = USERS + "accounting:\n  accounts:\n    - {name: research, fairshare: 3}\n    - {name: vision}\n"
    variables = accounting_vars(load_config(write(tmp_path, text)))
    assert variables["users"] == [{"name": "alice", "account": "research"}, {"name": "bob", "account": "vision"}]
    assert variables["accounts"][0] == {"name": "research", "description": "", "fairshare": 3}


@pytest.mark.parametrize(
    "text, expected",
    [
        (USERS, "users.1.account: 'vision' is not an account (accounting.accounts: general)"),
        (
            MINIMAL + "accounting:\n  accounts:\n    - {name: a}\n    - {name: a}\n",
            "accounting.accounts: duplicate name 'a'",
        ),
        (MINIMAL + "accounting:\n  accounts:\n    - {name: Research}\n", "accounting.accounts.0.name"),
        (MINIMAL + "accounting:\n  decay_half_life: a week\n", "accounting.decay_half_life"),
        (MINIMAL + "accounting:\n  database: {host: db.example.com}\n", "accounting.database.password_file: required"),
    ],
)
def test_accounting_errors_name_the_field(tmp_path, text, expected):
    assert expected in error_for(tmp_path, text)


def external(tmp_path, password: str | None = "s3cret-Pass_word", mode: int = 0o600, ca: str | None = None):
    from clusterbake.config import check_accounting_files

    secret = tmp_path / "db.password"
    if password is not None:
        secret.write_text(password + "\n")
        secret.chmod(mode)
    text = MINIMAL + f"accounting:\n  database:\n    host: db.abc.rds.amazonaws.com\n    password_file: {secret}\n"
    if ca is not None:
        (tmp_path / "ca.pem").write_text(ca)
        text += f"    ca_file: {tmp_path / 'ca.pem'}\n"
    check_accounting_files(load_config(write(tmp_path, text)))


def test_an_external_databases_password_file_is_checked_before_anything_is_created(tmp_path):
    external(tmp_path)  # a good one passes
    external(tmp_path, ca="-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    for index, (kwargs, message) in enumerate(
        (
            ({"password": None}, "is not a file on this machine"),
            ({"mode": 0o644}, "is readable by others; chmod 600"),
            ({"password": "has#hash1"}, "without '#'"),
            ({"password": "two words"}, "blanks"),
            ({"password": "short"}, "8 to 128 characters"),
            ({"ca": "not a certificate"}, "accounting.database.ca_file"),
        )
    ):
        (tmp_path / str(index)).mkdir()
        with pytest.raises(ConfigError, match=message):
            external(tmp_path / str(index), **kwargs)


def test_the_cli_refuses_a_bad_password_file_with_exit_status_2(tmp_path):
    secret = tmp_path / "db.password"
    secret.write_text("with#hash\n")
    secret.chmod(0o600)
    path = write(tmp_path, MINIMAL + f"accounting:\n  database: {{host: db.example.com, password_file: {secret}}}\n")
    result = subprocess.run(
        [sys.executable, "-m", "clusterbake.cli", "--config", str(path), "validate"], capture_output=True, text=True
    )
    assert result.returncode == 2 and "accounting.database.password_file" in result.stderr
    assert "with#hash" not in result.stderr + result.stdout  # the password is never printed


@pytest.mark.parametrize(
    "health, message",
    [
        ("dcgm_diag_level: 3", "health.dcgm_diag_level"),  # ~15 minutes: no prolog's
        ("dcgm_diag_level: 2", "set health.dcgm_diag_timeout to at least 180"),  # the default 90 s cannot do
    ],
)
def test_a_dcgm_prolog_that_cannot_finish_in_time_is_refused(tmp_path, health, message):
    """Hardware review item 10: level 3, or level 2 within 90 s, drained every GPU node at its first job."""
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, MINIMAL + f"health:\n  {health}\n"))
    fitting = load_config(write(tmp_path, MINIMAL + "health:\n  dcgm_diag_level: 2\n  dcgm_diag_timeout: 180\n"))
    assert fitting.health.dcgm_diag_level == 2
