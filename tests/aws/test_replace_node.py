"""Replacing a compute node on AWS (`clusterbake node replace`, the ops playbooks' replace step):
a new instance from the group's launch template at the node's planned address, and with another
AMI every launch template moved to it first. Against the real moto_server (conftest.py); the
Slurm side (drained and idle) needs the head's slurmctld, which moto has not: the integration
tests show it on the local provider."""

from __future__ import annotations

import pytest
import yaml
from awstest import REGION, example_config, live_instances, provisioned, run_cb, tag_map

from clusterbake.config import load_config
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.images.store import write_aws_record
from clusterbake.providers.aws.provider import AwsProvider
from clusterbake.state import StateDir

CLUSTER = "replacedemo"


@pytest.fixture
def demo(moto, network, tmp_path, monkeypatch):
    for key, value in moto.env.items():
        monkeypatch.setenv(key, value)
    yield from provisioned(moto, tmp_path, network.ami_id, example_config(network, cluster_name=CLUSTER))


def by_name(ec2) -> dict[str, dict]:
    return {tag_map(i)["clusterbake:name"]: i for i in live_instances(ec2, CLUSTER)}


def latest_template_image(ec2, group: str) -> str:
    name = f"clusterbake-{CLUSTER}-{group}"
    version = ec2.describe_launch_template_versions(LaunchTemplateName=name, Versions=["$Latest"])
    return version["LaunchTemplateVersions"][0]["LaunchTemplateData"]["ImageId"]


def test_a_replaced_node_is_a_new_instance_at_its_address(moto, demo):
    ec2 = moto.ec2()
    provider = AwsProvider(load_config(demo["path"]), StateDir(demo["state_dir"]))
    before = by_name(ec2)
    provider.replace_node("gpu-1")
    after = by_name(ec2)
    assert after["gpu-1"]["InstanceId"] != before["gpu-1"]["InstanceId"]
    assert after["gpu-1"]["PrivateIpAddress"] == before["gpu-1"]["PrivateIpAddress"]
    assert after["gpu-1"]["ImageId"] == before["gpu-1"]["ImageId"]
    old = ec2.describe_instances(InstanceIds=[before["gpu-1"]["InstanceId"]])["Reservations"][0]["Instances"][0]
    assert old["State"]["Name"] == "terminated"
    # Nothing else moved.
    assert {n: i["InstanceId"] for n, i in after.items() if n != "gpu-1"} == {
        n: i["InstanceId"] for n, i in before.items() if n != "gpu-1"
    }
    with pytest.raises(ConfigError, match="only compute nodes"):
        provider.replace_node("head")


def test_the_newest_ami_moves_the_templates_then_the_node(moto, network, demo):
    ec2 = moto.ec2()
    first = network.ami_id
    images = ec2.describe_images(Filters=[{"Name": "architecture", "Values": ["x86_64"]}])["Images"]
    newer = next(i["ImageId"] for i in sorted(images, key=lambda i: i["ImageId"]) if i["ImageId"] != first)
    write_aws_record(StateDir(demo["state_dir"]), newer, REGION)  # what `image build` records
    provider = AwsProvider(load_config(demo["path"]), StateDir(demo["state_dir"]))
    assert {s.name: s.image for s in provider.status()} == {"head": first, "gpu-1": first, "gpu-2": first}

    # The CLI refuses without Slurm's word (no head answers here); --force replaces all the same.
    refused = run_cb(moto, demo["state_dir"], demo["config"], "node", "replace", "gpu-2", "--image", "newest",
                     check=False)  # fmt: skip
    assert refused.returncode == 1 and "cannot ask Slurm whether gpu-2 run jobs" in refused.stderr
    assert by_name(ec2)["gpu-2"]["ImageId"] == first  # nothing was replaced
    forced = run_cb(moto, demo["state_dir"], demo["config"], "node", "replace", "gpu-2", "--image", "newest",
                    "--force", timeout=300)  # fmt: skip
    assert f"node gpu-2: replaced, on {newer}" in forced.stdout
    assert latest_template_image(ec2, "gpu") == newer and latest_template_image(ec2, "head") == newer
    assert provider.cluster.read_state()["image"] == newer
    assert {s.name: s.image for s in provider.status()} == {"head": first, "gpu-1": first, "gpu-2": newer}
    status = run_cb(moto, demo["state_dir"], demo["config"], "cluster", "status", "--json", check=False)
    assert '"newest_image": "' + newer in status.stdout


def test_an_unprovisioned_cluster_has_nothing_to_replace(moto, network, tmp_path, monkeypatch):
    for key, value in moto.env.items():
        monkeypatch.setenv(key, value)
    config = tmp_path / "never.yaml"
    config.write_text(yaml.safe_dump(example_config(network, cluster_name="neverup")))
    provider = AwsProvider(load_config(config), StateDir(tmp_path))
    with pytest.raises(ClusterbakeError, match="never provisioned"):
        provider.replace_node("gpu-1")


def test_a_node_the_head_relaunched_meanwhile_is_started_once(moto, demo, monkeypatch):
    """`node start` of a node whose instance is gone while the head's reconcile loop replaces it too
    (recovery.replace_lost_nodes): the head's instance takes the node's address between the provider's
    look and its own launch, which EC2 then refuses (InvalidIPAddress.InUse, as the twin's moto does).
    The node runs, as `node start` asked: one instance, at its address, and no error."""
    ec2 = moto.ec2()
    provider = AwsProvider(load_config(demo["path"]), StateDir(demo["state_dir"]))
    # The Slurm side needs the head's slurmctld, which moto has not: record what it is told.
    told = []
    monkeypatch.setattr(provider, "tell_slurm_down", lambda name, reason: told.append(name))
    old = by_name(ec2)["gpu-1"]
    ec2.terminate_instances(InstanceIds=[old["InstanceId"]])

    def the_head_launches_first(params, **_):
        # The same request from the head (its own client), just before the provider's is sent.
        provider.client.meta.events.unregister("provide-client-params.ec2.RunInstances", the_head_launches_first)
        ec2.run_instances(**params)

    provider.client.meta.events.register("provide-client-params.ec2.RunInstances", the_head_launches_first)
    provider.start_node("gpu-1")
    instances = [i for i in live_instances(ec2, CLUSTER) if tag_map(i)["clusterbake:name"] == "gpu-1"]
    assert len(instances) == 1 and instances[0]["InstanceId"] != old["InstanceId"]
    assert instances[0]["PrivateIpAddress"] == old["PrivateIpAddress"]
    assert told == ["gpu-1"]
