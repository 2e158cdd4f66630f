"""The AWS image wrapper: Packer versions, template staging, -var values, the
manifest post-processor's JSON and aws-latest.json. No Packer build, no AWS."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from clusterbake import packer_aws
from clusterbake.config import DEFAULT_IMAGE_BASE
from clusterbake.errors import ClusterbakeError

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "tests" / "unit" / "data" / "packer-manifest-aws.json"
LAST_RUN = "9e3c2b1a-0f4d-4e5f-8a7b-6c5d4e3f2a1b"
FIRST_RUN = "0b7d6f2e-58a1-4c1f-9c2e-3f8a1d2b4c5e"


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
    path = packer_aws.write_latest(tmp_path, record)
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


@pytest.mark.parametrize(
    ("version", "plugins"), [("1.6.6", False), ("Packer v1.6.6", False), ("1.7.0", True), ("1.11.2", True)]
)
def test_plugin_mode_from_the_packer_version(version, plugins):
    assert packer_aws.plugin_mode(version) is plugins


def test_versions_digest_is_the_manifest_files_sha256():
    manifest = REPO / "ansible" / "group_vars" / "all" / "versions.yml"
    assert packer_aws.versions_digest(REPO) == hashlib.sha256(manifest.read_bytes()).hexdigest()


def test_staged_template_has_the_plugin_settings_and_requirements(tmp_path):
    assert (REPO / "packer/aws.pkr.hcl").read_text().count(packer_aws.MARKER) == 1
    staged = packer_aws.stage_template(tmp_path / "t", REPO)
    assert sorted(p.name for p in staged.iterdir()) == ["ansible.pkr.hcl", "aws.pkr.hcl", "required_plugins.pkr.hcl"]
    text = (staged / "aws.pkr.hcl").read_text()
    assert packer_aws.MARKER not in text
    assert 'http_tokens                 = "required"' in text
    assert 'imds_support = "v2.0"' in text
    assert 'temporary_key_pair_type = "ed25519"' in text
    # Inside the source block, before its tags.
    assert text.index('source "amazon-ebs" "ubuntu"') < text.index("imds_support") < text.index("tags          =")
    plugins = (staged / "required_plugins.pkr.hcl").read_text()
    assert 'source  = "github.com/hashicorp/amazon"' in plugins
    assert 'source  = "github.com/hashicorp/ansible"' in plugins


@pytest.mark.skipif(not shutil.which("packer"), reason="packer is not installed")
def test_staged_template_is_formatted(tmp_path):
    staged = packer_aws.stage_template(tmp_path / "t", REPO)
    result = subprocess.run(["packer", "fmt", "-check", str(staged)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_stage_refuses_a_template_without_its_marker(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(REPO / "packer", root / "packer")
    aws = root / "packer" / "aws.pkr.hcl"
    aws.write_text(aws.read_text().replace(packer_aws.MARKER, "# gone"))
    with pytest.raises(ClusterbakeError, match="must hold the line"):
        packer_aws.stage_template(tmp_path / "t", root)


# --- -var values -------------------------------------------------------------------------------


def test_packer_variables(tmp_path):
    variables = packer_aws.aws_packer_variables(
        {
            "region": "eu-west-1",
            "base": "ubuntu-24.04",
            "features": ["cuda", "efa", "train-data"],
            "validate_efa": True,
        },
        name="clusterbake-ubuntu-24.04-x",
        revision="abc",
        digest="d" * 64,
        artifacts_dir=tmp_path / "a",
        image_vars_file=tmp_path / "v.yml",
        root=REPO,
    )
    assert variables["aws_region"] == "eu-west-1"
    assert variables["aws_base"] == "ubuntu-24.04"
    assert variables["aws_builder_instance_type"] == "g5.xlarge"
    assert variables["aws_volume_size_gb"] == "100"
    assert variables["aws_volume_encrypted"] == "true"
    assert json.loads(variables["aws_ansible_groups"]) == ["slurm_head", "slurm_compute", "cuda", "efa", "train_data"]
    assert (variables["validate_gpu"], variables["validate_efa"]) == ("true", "true")
    assert variables["versions_digest"] == "d" * 64
    assert variables["repo_root"] == str(REPO)
    assert variables["ansible_playbook_command"].endswith("/ansible-playbook")
    # Every value is a declared variable of the staged template.
    declared = set()
    for name in ("aws.pkr.hcl", "ansible.pkr.hcl"):
        declared |= set(re.findall(r'^variable "(\w+)"', (REPO / "packer" / name).read_text(), flags=re.MULTILINE))
    assert set(variables) <= declared


def test_default_base_is_the_configs_aws_default(tmp_path):
    # ubuntu-24.04: its Slurm 23.11 has the cgroup/v2 plugin the AWS defaults need (roles/slurm/README.md).
    variables = packer_aws.aws_packer_variables(
        {"region": "eu-west-1"},
        name="n",
        revision="r",
        digest="d",
        artifacts_dir=tmp_path / "a",
        image_vars_file=tmp_path / "v.yml",
        root=REPO,
    )
    assert variables["aws_base"] == DEFAULT_IMAGE_BASE["aws"] == "ubuntu-24.04"


@pytest.mark.parametrize(("settings", "error"), [({}, "need a region"), ({"region": "x", "base": "debian-12"}, "base")])
def test_bad_settings(settings, error, tmp_path):
    with pytest.raises(ClusterbakeError, match=error):
        packer_aws.aws_packer_variables(
            settings, name="n", revision="r", digest="d", artifacts_dir=tmp_path, image_vars_file=tmp_path / "v"
        )


# --- the build, with Packer replaced ---------------------------------------------------------------


def test_build_refuses_packer_1_6_6(tmp_path, monkeypatch):
    monkeypatch.setattr(packer_aws.packer, "packer_version", lambda: "1.6.6")
    with pytest.raises(ClusterbakeError, match=r"need Packer >= 1\.10"):
        packer_aws.build_aws_image({"region": "us-east-1"}, tmp_path)


def test_build_records_the_ami_and_reuses_it(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(packer_aws.packer, "packer_version", lambda: "1.11.2")
    monkeypatch.setattr(packer_aws.packer, "packer_binary", lambda: "/usr/bin/packer")
    monkeypatch.setattr(packer_aws, "run_logged", lambda argv, log, **kw: calls.append(("init", argv)))

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

    monkeypatch.setattr(packer_aws.packer, "build", fake_build)
    record = packer_aws.build_aws_image({"region": "us-east-1"}, tmp_path)
    assert calls[0] == ("init", ["/usr/bin/packer", "init", str(REPO / "packer/plugins")])
    assert calls[1][:2] == ("build", "amazon-ebs.ubuntu")
    assert record["ami_id"] == "ami-0f9e8d7c6b5a49382"
    assert record["manifest_digest"] == packer_aws.versions_digest(REPO)
    assert json.loads((tmp_path / "images" / "aws-latest.json").read_text()) == record
    # Same inputs, same region: no second build.
    assert packer_aws.build_aws_image({"region": "us-east-1"}, tmp_path) == record
    assert len(calls) == 2
