"""The aws parts of the config schema, the image record contract and the SSH endpoint."""

from __future__ import annotations

import json
import shlex
import textwrap

import configs
import pytest

from clusterbake.config import ClusterConfig, load_config
from clusterbake.errors import ConfigError, MissingImageError
from clusterbake.images.store import ImageStore, find_aws_image, write_aws_record
from clusterbake.inventory import cluster_vars
from clusterbake.providers.aws.provider import AwsProvider
from clusterbake.remote import command_line
from clusterbake.state import StateDir

AWS = """
cluster_name: demo
provider: aws
image:
  base: ubuntu-22.04
aws:
  region: us-east-1
  vpc_id: vpc-0123456789abcdef0
  subnet_id: subnet-0123456789abcdef0
  ssh_cidrs: [203.0.113.0/24]
head:
  instance_type: m7i.2xlarge
node_groups:
  - name: gpu
    count: 2
    instance_type: p5.48xlarge
    efa: true
"""


def error_for(tmp_path, text) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


def test_example_is_valid_and_efa_gets_a_placement_group(repo):
    config = load_config(repo / "examples" / "aws-p5.yaml")
    assert config.provider == "aws" and config.aws.ssh_user == "ubuntu"
    [gpu] = config.node_groups
    assert (gpu.instance_type, gpu.count, gpu.efa, gpu.spot) == ("p5.48xlarge", 2, True, False)
    assert gpu.placement_group is None and gpu.wants_placement_group
    assert config.image.base == "ubuntu-24.04"
    assert config.slurm_plugins()["proctrack_type"] == "proctrack/cgroup"


def test_aws_image_base_defaults_to_ubuntu_24_04(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(AWS.replace("image:\n  base: ubuntu-22.04\n", ""))
    assert load_config(path).image.base == "ubuntu-24.04"
    path.write_text(AWS.replace("  base: ubuntu-22.04\n", "  package_pins: {slurmd: '23.11*'}\n"))
    config = load_config(path)
    assert (config.image.base, config.image.package_pins) == ("ubuntu-24.04", {"slurmd": "23.11*"})


CGROUP = {
    "proctrack_type": "proctrack/cgroup",
    "task_plugin": "task/cgroup,task/affinity",
    "jobacct_gather_type": "jobacct_gather/cgroup",
}
WITHOUT_CGROUP = {
    "proctrack_type": "proctrack/linuxproc",
    "task_plugin": "task/affinity",
    "jobacct_gather_type": "jobacct_gather/linux",
}


@pytest.mark.parametrize(
    ("base", "plugins", "cgroup_conf"),
    [
        # Slurm 23.11 has cgroup/v2, which Ubuntu 24.04's cgroup-v2-only boot needs.
        ("ubuntu-24.04", CGROUP, True),
        # Slurm 21.08 has cgroup/v1 only and Ubuntu 22.04 boots cgroup v2 only: no cgroup plugins.
        ("ubuntu-22.04", WITHOUT_CGROUP, False),
    ],
)
def test_plugin_choice_per_image_base(tmp_path, base, plugins, cgroup_conf):
    path = tmp_path / "c.yaml"
    path.write_text(AWS.replace("base: ubuntu-22.04", f"base: {base}"))
    config = load_config(path)
    assert config.slurm_plugins() == plugins
    variables = cluster_vars(config)
    assert {key: variables[f"slurm_{key}"] for key in plugins} == plugins
    assert variables["slurm_cgroup_enabled"] is cgroup_conf


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("proctrack_type", "proctrack/cgroup"),
        ("task_plugin", "task/affinity,task/cgroup"),
        ("jobacct_gather_type", "jobacct_gather/cgroup"),
    ],
)
def test_cgroup_plugins_on_ubuntu_22_04_are_refused_naming_the_field(tmp_path, key, value):
    message = error_for(tmp_path, AWS + f"slurm:\n  {key}: {value}\n")
    assert f"slurm.{key}: {value} needs Slurm's cgroup plugins" in message
    assert "image.base ubuntu-22.04" in message and "set image.base: ubuntu-24.04" in message
    assert f"default there: {WITHOUT_CGROUP[key]}" in message


def test_explicit_plugins_where_they_can_run(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(AWS + "slurm:\n  proctrack_type: proctrack/pgid\n")
    assert load_config(path).slurm_plugins()["proctrack_type"] == "proctrack/pgid"
    path.write_text(AWS.replace("ubuntu-22.04", "ubuntu-24.04") + "slurm:\n  task_plugin: task/cgroup\n")
    assert load_config(path).slurm_plugins()["task_plugin"] == "task/cgroup"


@pytest.mark.parametrize(
    "extra, wants, existing",
    [
        ("", True, None),  # efa: a placement group of the cluster's own
        ("    placement_group: false\n", False, None),  # EFA without one (the EC2 guide: not required)
        ("    capacity_reservation_id: cr-0123456789abcdef0\n", False, None),  # a new group could not hold the CR
        ("    capacity_reservation_id: cr-0123456789abcdef0\n    placement_group: odcr-pg\n", True, "odcr-pg"),
    ],
)
def test_placement_groups_with_efa_and_capacity_reservations(tmp_path, extra, wants, existing):
    """Hardware review item 15: EFA was forced into a new placement group, so a capacity reservation made
    in a cluster placement group could not be used."""
    path = tmp_path / "c.yaml"
    path.write_text(AWS + extra)
    [group] = load_config(path).node_groups
    assert (group.wants_placement_group, group.existing_placement_group) == (wants, existing)


def test_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(AWS.replace("    efa: true\n", ""))
    [group] = load_config(path).node_groups
    assert (group.efa, group.spot, group.capacity_reservation_id, group.wants_placement_group) == (
        False,
        False,
        None,
        False,
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.replace("provider: aws", "provider: gcp"), "provider: Input should be 'local', 'aws' or 'azure'"),
        (lambda t: t[: t.index("aws:")] + t[t.index("head:") :], "aws: required with provider aws"),
        (lambda t: t.replace("    instance_type: p5.48xlarge\n", ""), "node_groups.0.instance_type: required"),
        (lambda t: t.replace("  instance_type: m7i.2xlarge", "  cpus: 4"), "head.instance_type: required"),
        (lambda t: t + "    cpus: 96\n", "node_groups.0.cpus: only for provider local"),
        (lambda t: t + "    memory_mb: 4096\n", "node_groups.0.memory_mb: only for provider local"),
        (
            lambda t: t + "    spot: true\n    capacity_reservation_id: cr-0123456789abcdef0\n",
            "node_groups.0.capacity_reservation_id: capacity reservations are for on-demand",
        ),
        (lambda t: t.replace("203.0.113.0/24", "203.0.113.1/24"), "aws.ssh_cidrs: '203.0.113.1/24' is not a CIDR"),
        (lambda t: t.replace("vpc-0123456789abcdef0", "my-vpc"), "aws.vpc_id: String should match pattern"),
        (lambda t: t.replace("  ssh_cidrs:", "  bastion: bastion.example.com\n  ssh_cidrs:"), "aws.bastion"),
        (lambda t: t + "    capacity_reservation_id: reservation-1\n", "node_groups.0.capacity_reservation_id"),
        (
            lambda t: (
                t.replace("    instance_type: p5.48xlarge\n", "    instance_types: [p5.48xlarge, p5e.48xlarge]\n")
                + "    capacity_reservation_id: cr-0123456789abcdef0\n"
            ),
            "node_groups.0.instance_types: a capacity reservation holds one instance type",
        ),
        (
            lambda t: t + "    instance_types: [p5e.48xlarge, p5.48xlarge]\n",
            "node_groups.0: instance_types: give instance_type or instance_types (its first is the primary), not both",
        ),
        (lambda t: t + "    instance_types: []\n", "node_groups.0.instance_types: List should have at least 1 item"),
        (
            lambda t: t.replace("    instance_type: p5.48xlarge\n", "    instance_types: [p5.48xlarge, p5.48xlarge]\n"),
            "node_groups.0.instance_types: each instance type only once",
        ),
        (
            lambda t: t.replace("    instance_type: p5.48xlarge\n", "    instance_types: [P5]\n"),
            "node_groups.0.instance_types.0: String should match pattern",
        ),
    ],
)
def test_aws_errors_name_the_field(tmp_path, change, message):
    assert message in error_for(tmp_path, change(AWS))


def test_instance_types_name_the_primary_and_its_fallbacks(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        AWS.replace("    instance_type: p5.48xlarge\n", "    instance_types: [p5.48xlarge, p5e.48xlarge]\n")
    )
    [group] = load_config(path).node_groups
    assert group.instance_type == "p5.48xlarge"  # the primary: the Slurm spec and `cluster up` use it
    assert group.types == ["p5.48xlarge", "p5e.48xlarge"]
    # The config as written back (the local provider keeps it) loads again.
    again = ClusterConfig.model_validate(load_config(path).model_dump(mode="json", exclude_unset=True))
    assert again.node_groups[0].types == group.types
    # With the primary named twice it is the same.
    path.write_text(
        AWS.replace(
            "    instance_type: p5.48xlarge\n",
            "    instance_type: p5.48xlarge\n    instance_types: [p5.48xlarge, p5e.48xlarge]\n",
        )
    )
    assert load_config(path).node_groups[0].types == ["p5.48xlarge", "p5e.48xlarge"]


def test_local_configs_are_unchanged(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("cluster_name: demo\nnode_groups: [{name: cpu, count: 1, cpus: 2, efa: true}]\n")
    config = load_config(path)
    assert config.provider == "local" and config.aws is None and config.node_groups[0].cpus == 2


def _config(**aws) -> ClusterConfig:
    return ClusterConfig.model_validate(configs.aws_cluster(aws))


def test_ami_from_the_image_record(tmp_path):
    state = StateDir(tmp_path)
    with pytest.raises(MissingImageError, match=r"run `make image PROVIDER=aws`"):
        find_aws_image(_config(), state)
    path = write_aws_record(state, "ami-0123456789abcdef0", "us-east-1", name="clusterbake-ubuntu-22.04-x")
    assert path == ImageStore(state).cloud_record_path("aws") == tmp_path / "images" / "aws-latest.json"
    assert json.loads(path.read_text())["region"] == "us-east-1"
    assert find_aws_image(_config(), state) == "ami-0123456789abcdef0"
    assert find_aws_image(_config(ami_id="ami-00000000000000001"), state) == "ami-00000000000000001"
    write_aws_record(state, "ami-0123456789abcdef0", "eu-west-1")
    with pytest.raises(MissingImageError, match="built in eu-west-1, the cluster runs in us-east-1"):
        find_aws_image(_config(), state)
    path.write_text("{}")
    with pytest.raises(MissingImageError, match="not an image record"):
        find_aws_image(_config(), state)


def test_ssh_runs_the_command_as_root_through_the_bastion(tmp_path):
    provider = AwsProvider(_config(bastion="ec2-user@bastion.example.com"), StateDir(tmp_path), client=object())
    endpoint = provider._endpoint_to("gpu-1", "10.0.0.11")
    assert (endpoint.name, endpoint.user, endpoint.host, endpoint.port) == ("gpu-1", "ubuntu", "10.0.0.11", 22)
    assert endpoint.gateway == "ec2-user@bastion.example.com" and endpoint.sudo
    assert endpoint.host_key_policy == "accept-new"
    assert endpoint.known_hosts == provider.cluster.known_hosts and endpoint.key_file == provider.cluster.ssh_key
    command = "sinfo --noheader --Node --format='%N %t'"
    # The login shell gets one word list: sudo -n sh -c <the command line unchanged>.
    assert shlex.split(command_line(endpoint, command)) == ["sudo", "-n", "sh", "-c", command]
    assert shlex.split(command_line(endpoint, ["echo", "a b"])) == ["sudo", "-n", "sh", "-c", "echo 'a b'"]
    # Ansible still talks OpenSSH, with the same known_hosts, trust on first use and the bastion.
    options = provider._ssh_options()
    assert "ProxyJump=ec2-user@bastion.example.com" in options and "StrictHostKeyChecking=accept-new" in options
    assert f"UserKnownHostsFile={provider.cluster.known_hosts}" in options
    no_bastion = AwsProvider(_config(), StateDir(tmp_path), client=object())
    assert no_bastion._endpoint_to("head", "10.0.0.10").gateway is None
    assert not any("ProxyJump" in a for a in no_bastion._ssh_options())


def test_image_base_must_match_the_provider(tmp_path):
    debian = error_for(tmp_path, AWS.replace("base: ubuntu-22.04", "base: debian-12"))
    assert "image.base: AWS images are Ubuntu; remove image.base (default ubuntu-24.04)" in debian
    local = "cluster_name: x\nimage: {base: ubuntu-24.04}\nnode_groups: [{name: cpu, count: 1}]\n"
    assert "image.base: the local provider builds debian-12 images only" in error_for(tmp_path, local)
