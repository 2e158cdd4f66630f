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
