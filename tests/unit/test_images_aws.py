"""The AWS image builder (clusterbake.images.aws): Packer versions, template staging,
-var values from the config, the manifest post-processor's JSON and aws-latest.json.
No Packer build, no AWS."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from imagetest import STAGED_FILES, packer_run

from clusterbake.config import DEFAULT_IMAGE_BASE, ClusterConfig
from clusterbake.errors import ClusterbakeError
from clusterbake.images import aws as packer_aws
from clusterbake.images import packer
from clusterbake.images.base import PackerRun
from clusterbake.images.inputs import versions_digest
from clusterbake.images.store import ImageStore
from clusterbake.state import StateDir

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "tests" / "unit" / "data" / "packer-manifest-aws.json"
LAST_RUN = "9e3c2b1a-0f4d-4e5f-8a7b-6c5d4e3f2a1b"
FIRST_RUN = "0b7d6f2e-58a1-4c1f-9c2e-3f8a1d2b4c5e"


def aws_config(image: dict | None = None, features=("cuda", "efa", "train-data"), **aws) -> ClusterConfig:
    return ClusterConfig.model_validate(
        {
            "cluster_name": "demo",
            "provider": "aws",
            "image": image or {},
            "aws": {"region": "us-east-1", "vpc_id": "vpc-0123456789abcdef0", "subnet_id": "subnet-0123456789abcdef0"}
            | aws,
            "head": {"instance_type": "m7i.2xlarge"},
            "node_groups": [{"name": "gpu", "count": 1, "instance_type": "p5.48xlarge", "features": list(features)}],
        }
    )


def run(tmp_path, name="clusterbake-ubuntu-24.04-x") -> PackerRun:
    return packer_run(tmp_path, name, "abc")


# --- the manifest post-processor's JSON ---------------------------------------------


def test_manifest_gives_the_last_runs_ami_in_the_build_region():
    image = packer_aws.parse_packer_manifest(SAMPLE)
    assert image["ami_id"] == "ami-0f9e8d7c6b5a49382"
    assert image["region"] == "us-east-1"
    assert image["amis"] == {"us-east-1": "ami-0f9e8d7c6b5a49382", "eu-west-1": "ami-01234567890abcdef"}
    assert image["name"] == "clusterbake-ubuntu-24.04-20251130-081000-a1b2c3d4e5"
    assert image["git_revision"] == "a1b2c3d4e5"
    assert image["manifest_digest"].startswith("8d7c6b5a")
    assert image["base"] == "ubuntu-24.04"
    assert image["packer_run_uuid"] == LAST_RUN


def test_manifest_of_a_given_run():
    image = packer_aws.parse_packer_manifest(SAMPLE, run_uuid=FIRST_RUN)
    assert (image["ami_id"], image["base"]) == ("ami-0a1b2c3d4e5f60718", "ubuntu-22.04")


def test_manifest_without_an_amazon_build_of_the_run(tmp_path):
    data = json.loads(SAMPLE.read_text())
    data["last_run_uuid"] = "another-run"
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ClusterbakeError, match="no amazon-ebs build for run another-run"):
        packer_aws.parse_packer_manifest(path)


@pytest.mark.parametrize("artifact", ["", "us-east-1", "us-east-1:i-0123456789abcdef0", "ami-0123456789abcdef0"])
def test_manifest_with_an_unreadable_artifact(tmp_path, artifact):
    data = json.loads(SAMPLE.read_text())
    data["builds"][-1]["artifact_id"] = artifact
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ClusterbakeError, match="cannot read an AMI"):
        packer_aws.parse_packer_manifest(path)


def test_missing_manifest_says_the_build_did_not_finish(tmp_path):
    with pytest.raises(ClusterbakeError, match="the build did not finish"):
        packer_aws.parse_packer_manifest(tmp_path / "nothing.json")


# --- aws-latest.json -------------------------------------------------------------------


def test_latest_record_has_what_the_provider_needs(tmp_path):
    image = packer_aws.parse_packer_manifest(SAMPLE)
    versions = {"os": {"distribution": "Ubuntu"}, "gpu": {"manifest_sha256": image["manifest_digest"]}}
    record = packer_aws.image_record(image, versions, inputs_digest="0123456789abcdef")
    path = ImageStore(StateDir(tmp_path)).write_cloud_record("aws", record)
    assert path == tmp_path / "images" / "aws-latest.json"
    saved = json.loads(path.read_text())
    assert {"ami_id", "region", "name", "git_revision", "manifest_digest", "versions"} <= set(saved)
    assert saved["ami_id"] == "ami-0f9e8d7c6b5a49382"
    assert saved["versions"] == versions
    assert saved["built"] == "2025-11-30T08:10:00+00:00"
    assert json.loads((tmp_path / "images" / "aws" / f"{image['name']}.json").read_text()) == saved


def test_record_refuses_an_image_built_from_another_manifest():
    image = packer_aws.parse_packer_manifest(SAMPLE)
    with pytest.raises(ClusterbakeError, match="built from version manifest"):
        packer_aws.image_record(image, {"gpu": {"manifest_sha256": "f" * 64}})


# --- Packer versions and the staged template ---------------------------------------------


def stage(dest, root):
    return packer.stage_template(packer_aws.TEMPLATE, dest, root, packer_aws.PLUGIN_SETTINGS)


@pytest.mark.parametrize(
    ("version", "plugins"), [("1.6.6", False), ("Packer v1.6.6", False), ("1.7.0", True), ("1.11.2", True)]
)
def test_plugin_mode_from_the_packer_version(version, plugins):
    assert packer.plugin_mode(version) is plugins


def test_versions_digest_is_the_manifest_files_sha256():
    manifest = REPO / "ansible" / "group_vars" / "all" / "versions.yml"
    assert versions_digest(REPO) == hashlib.sha256(manifest.read_bytes()).hexdigest()


def test_staged_template_has_the_plugin_settings_and_requirements(tmp_path):
    assert (REPO / "packer/aws.pkr.hcl").read_text().count(packer.MARKER) == 1
    staged = stage(tmp_path / "t", REPO)
    assert sorted(p.name for p in staged.iterdir()) == STAGED_FILES
    text = (staged / "aws.pkr.hcl").read_text()
    assert packer.MARKER not in text
    assert 'http_tokens                 = "required"' in text
    assert 'imds_support = "v2.0"' in text
    assert 'temporary_key_pair_type = "ed25519"' in text
    # Inside the source block, before its tags.
    assert text.index('source "amazon-ebs" "ubuntu"') < text.index("imds_support") < text.index("tags          =")
    plugins = (staged / "required_plugins.pkr.hcl").read_text()
    assert 'source  = "github.com/hashicorp/amazon"' in plugins
    assert 'source  = "github.com/hashicorp/ansible"' in plugins
    assert 'source  = "github.com/hashicorp/azure"' in plugins
    # The shared variables (image name, repo_root, ...) come with ansible.pkr.hcl.
    assert 'variable "repo_root"' in (staged / "ansible.pkr.hcl").read_text()


@pytest.mark.skipif(not shutil.which("packer"), reason="packer is not installed")
def test_staged_template_is_formatted(tmp_path):
    staged = stage(tmp_path / "t", REPO)
    result = subprocess.run(["packer", "fmt", "-check", str(staged)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_stage_refuses_a_template_without_its_marker(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(REPO / "packer", root / "packer")
    aws = root / "packer" / "aws.pkr.hcl"
    aws.write_text(aws.read_text().replace(packer.MARKER, "# gone"))
    with pytest.raises(ClusterbakeError, match="must hold the line"):
        stage(tmp_path / "t", root)


# --- -var values -------------------------------------------------------------------------------


def test_packer_variables_come_from_the_config(tmp_path):
    config = aws_config(
        {"base": "ubuntu-24.04", "aws": {"region": "eu-west-1", "validate_efa": True, "features": ["aws", "cuda"]}}
    )
    variables = packer_aws.AwsBuilder().packer_vars(config, run(tmp_path))
    assert variables["aws_region"] == "eu-west-1"
    assert variables["aws_base"] == "ubuntu-24.04"
    assert variables["aws_builder_instance_type"] == "g5.xlarge"
    assert variables["aws_volume_size_gb"] == "100"
    assert variables["aws_volume_encrypted"] == "true"
    assert variables["aws_subnet_id"] == "subnet-0123456789abcdef0"  # the cluster's, by default
    groups = ["slurm_head", "slurm_compute", "aws", "cuda", "efa", "train_data"]
    assert json.loads(variables["aws_ansible_groups"]) == groups
    assert (variables["validate_gpu"], variables["validate_efa"]) == ("true", "true")
    assert variables["versions_digest"] == "d" * 64
    assert variables["repo_root"] == str(REPO)
    assert variables["ansible_playbook_command"].endswith("/ansible-playbook")
    # Every value is a declared variable of the staged template.
    declared = set()
    for name in ("aws.pkr.hcl", "ansible.pkr.hcl"):
        declared |= set(re.findall(r'^variable "(\w+)"', (REPO / "packer" / name).read_text(), flags=re.MULTILINE))
    assert set(variables) <= declared


def test_build_settings_default_to_the_cluster_and_the_schema(tmp_path):
    variables = packer_aws.AwsBuilder().packer_vars(aws_config(), run(tmp_path))
    # ubuntu-24.04: its Slurm 23.11 has the cgroup/v2 plugin the AWS defaults need (roles/slurm/README.md).
    assert variables["aws_base"] == DEFAULT_IMAGE_BASE["aws"] == "ubuntu-24.04"
    assert variables["aws_region"] == "us-east-1"
    groups = json.loads(variables["aws_ansible_groups"])
    assert {"aws", "cuda", "nvswitch", "efa", "dcgm", "lustre", "s3", "pyxis", "train_data"} <= set(groups)
    settings = {
        "builder_instance_type": "p4d.24xlarge",
        "subnet_id": "subnet-0fedcba9876543210",
        "volume_size_gb": 200,
        "volume_encrypted": False,
        "kms_key_id": "alias/images",
        "ssh_interface": "private_ip",
        "validate_gpu": False,
    }
    variables = packer_aws.AwsBuilder().packer_vars(aws_config({"aws": settings}), run(tmp_path))
    assert variables["aws_builder_instance_type"] == "p4d.24xlarge"
    assert variables["aws_subnet_id"] == "subnet-0fedcba9876543210"
    assert (variables["aws_volume_size_gb"], variables["aws_volume_encrypted"]) == ("200", "false")
    assert (variables["aws_kms_key_id"], variables["aws_ssh_interface"]) == ("alias/images", "private_ip")
    assert variables["validate_gpu"] == "false"


def test_the_inputs_digest_is_the_settings_and_the_repository():
    builder = packer_aws.AwsBuilder()
    assert builder.inputs_digest(aws_config()) == builder.inputs_digest(aws_config())
    assert builder.inputs_digest(aws_config()) != builder.inputs_digest(aws_config({"aws": {"volume_size_gb": 120}}))


def test_bad_base():
    config = aws_config({"base": "ubuntu-24.04"}).model_copy(
        update={"image": aws_config().image.model_copy(update={"base": "debian-12"})}
    )
    with pytest.raises(ClusterbakeError, match=r"image\.base"):
        packer_aws.aws_settings(config)


# --- the build, with Packer replaced ---------------------------------------------------------------


def test_build_refuses_packer_1_6_6(tmp_path, monkeypatch):
    monkeypatch.setattr(packer, "packer_version", lambda: "1.6.6")
    with pytest.raises(ClusterbakeError, match=r"need Packer >= 1\.10"):
        packer_aws.AwsBuilder().build(aws_config(), StateDir(tmp_path))


def test_build_records_the_ami_and_reuses_it(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(packer, "packer_version", lambda: "1.11.2")
    monkeypatch.setattr(packer, "packer_binary", lambda: "/usr/bin/packer")
    monkeypatch.setattr(packer, "run_logged", lambda argv, log, **kw: calls.append(("init", argv)))

    def fake_build(template, variables, log_file, only=None, env=None):
        calls.append(("build", only, template))
        assert (Path(template) / "required_plugins.pkr.hcl").exists()
        artifacts = Path(variables["artifacts_dir"])
        data = json.loads(SAMPLE.read_text())
        data["builds"][-1]["custom_data"].update(
            image_name=variables["image_name"], versions_digest=variables["versions_digest"], region="us-east-1"
        )
        (artifacts / "packer-manifest.json").write_text(json.dumps(data))
        versions = {"gpu": {"manifest_sha256": variables["versions_digest"]}, "os": {"distribution": "Ubuntu"}}
        (artifacts / "versions.json").write_text(json.dumps(versions))

    monkeypatch.setattr(packer, "build", fake_build)
    state = StateDir(tmp_path)
    image = packer_aws.AwsBuilder().build(aws_config(), state)
    assert calls[0] == ("init", ["/usr/bin/packer", "init", str(REPO / "packer/plugins")])
    assert calls[1][:2] == ("build", "amazon-ebs.ubuntu")
    assert (image.provider, image.image_id, image.location, image.reused) == (
        "aws",
        "ami-0f9e8d7c6b5a49382",
        "us-east-1",
        False,
    )
    record = json.loads((tmp_path / "images" / "aws-latest.json").read_text())
    assert record == dict(image.data)
    assert record["manifest_digest"] == versions_digest(REPO)
    assert record["inputs_digest"] == packer_aws.AwsBuilder().inputs_digest(aws_config())
    # Same inputs, same region: no second build.
    again = packer_aws.AwsBuilder().build(aws_config(), state)
    assert again.reused and again.image_id == image.image_id
    assert packer_aws.build_aws_image(aws_config(), state) == record
    assert len(calls) == 2
