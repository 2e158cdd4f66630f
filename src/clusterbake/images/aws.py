"""The AWS image: packer/aws.pkr.hcl (amazon-ebs.ubuntu) driven by the packer wrapper.

`AwsBuilder().build(config, state)` takes its settings from the config (image.aws,
with aws.region and aws.subnet_id as defaults), stages the template for the Packer
on PATH, runs `packer build -only=amazon-ebs.ubuntu`, reads the manifest
post-processor's JSON and the image's versions.json, and records the AMI in the
store, `<state_dir>/images/aws-latest.json`:

    {"ami_id", "region", "name", "git_revision", "manifest_digest", "versions", ...}

Packer versions (packer/README.md): amazon-ebs builds need Packer >= 1.10 with the
amazon and ansible plugins (`packer init packer/plugins`); the template is staged
with packer/plugins/required_plugins.pkr.hcl and the plugin-only settings (IMDSv2,
ed25519 key pairs). Debian's Packer 1.6.6 only validates the template: its SSH
client cannot log in to Ubuntu 22.04+ and it has no IMDSv2 settings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from clusterbake.config import AWS_IMAGE_FEATURES, ClusterConfig, extra_ca_files
from clusterbake.errors import ClusterbakeError
from clusterbake.images import cloud
from clusterbake.images.base import PackerRun
from clusterbake.images.inputs import builder_groups_for, node_group_features
from clusterbake.state import StateDir

SOURCE = "amazon-ebs.ubuntu"
TEMPLATE = "aws.pkr.hcl"
PLUGIN_SETTINGS = "amazon-ebs.plugin-settings.hcl"
BASES = ("ubuntu-22.04", "ubuntu-24.04")
DEFAULT_FEATURES = AWS_IMAGE_FEATURES


def aws_settings(config: ClusterConfig) -> dict:
    """The build's settings from the config: image.aws, defaulting to the cluster's region and
    subnet; the node groups' features join the image's. Hashed into the inputs digest."""
    build = config.image.aws
    region = build.region or (config.aws.region if config.aws else None)
    subnet = build.subnet_id or (config.aws.subnet_id if config.aws else "")
    settings = {
        "region": region,
        "base": config.image.base,
        "builder_instance_type": build.builder_instance_type,
        "volume_size_gb": build.volume_size_gb,
        "volume_encrypted": build.volume_encrypted,
        "kms_key_id": build.kms_key_id,
        "subnet_id": subnet or "",
        "ssh_interface": build.ssh_interface,
        "features": sorted({*build.features, *node_group_features(config)}),
        "validate_gpu": build.validate_gpu,
        "validate_efa": build.validate_efa,
        "package_pins": dict(config.image.package_pins),
        "extra_ca_certificates": extra_ca_files(config),
    }
    if not settings["region"]:
        raise ClusterbakeError("image.aws.region: the AWS image build needs a region (or aws.region)")
    if settings["base"] not in BASES:
        raise ClusterbakeError(f"image.base: AWS images are built from {', '.join(BASES)}, not {settings['base']!r}")
    return settings


def aws_packer_variables(settings: Mapping, run: PackerRun) -> dict[str, str]:
    """The -var values of packer/aws.pkr.hcl for these settings."""
    s = settings
    return {
        "aws_region": str(s["region"]),
        "aws_base": str(s["base"]),
        "aws_builder_instance_type": str(s["builder_instance_type"]),
        "aws_volume_size_gb": str(int(s["volume_size_gb"])),
        "aws_volume_encrypted": json.dumps(bool(s["volume_encrypted"])),
        "aws_kms_key_id": str(s["kms_key_id"]),
        "aws_subnet_id": str(s["subnet_id"]),
        "aws_ssh_interface": str(s["ssh_interface"]),
        "aws_ansible_groups": json.dumps(builder_groups_for(s["features"])),
        "validate_gpu": json.dumps(bool(s["validate_gpu"])),
        "validate_efa": json.dumps(bool(s["validate_efa"])),
        **cloud.run_variables(run),
    }


def parse_packer_manifest(path: Path, run_uuid: str | None = None) -> dict:
    """The AMI of the manifest post-processor's JSON: the last amazon-ebs build of
    the last run (or of run_uuid)."""
    build = cloud.manifest_build(path, "amazon-ebs", run_uuid)
    # artifact_id is "region:ami-id", comma-separated when the AMI was copied to more regions.
    amis = {}
    for part in str(build.get("artifact_id", "")).split(","):
        region, sep, ami = part.strip().partition(":")
        if not sep or not re.fullmatch(r"ami-[0-9a-f]{8,17}", ami):
            raise ClusterbakeError(f"{path}: cannot read an AMI from artifact_id {build.get('artifact_id')!r}")
        amis[region] = ami
    custom = build.get("custom_data") or {}
    region = custom.get("region") if custom.get("region") in amis else next(iter(amis))
    return {"ami_id": amis[region], "region": region, "amis": amis, **cloud.manifest_fields(build, "aws_base")}


def image_record(manifest: Mapping, versions: Mapping | None, inputs_digest: str = "") -> dict:
    """What aws-latest.json holds about an AMI."""
    record = {
        "ami_id": manifest["ami_id"],
        "region": manifest["region"],
        **cloud.record_fields(manifest, versions, inputs_digest, {"amis": dict(manifest.get("amis", {}))}),
    }
    cloud.check_versions(f"AMI {record['ami_id']}", record)
    return record


class AwsBuilder(cloud.PackerCloudBuilder):
    """The AWS GPU image (AMI), Packer amazon-ebs."""

    name = "aws"
    source = SOURCE
    template = TEMPLATE
    plugin_settings = PLUGIN_SETTINGS
    location_key = "region"
    image_id_key = "ami_id"
    label = "AWS image"
    why_new_packer = "its SSH client cannot log in to Ubuntu 22.04+ and it cannot require IMDSv2"
    # packer_env: none, the usual AWS credential chain of the process running clusterbake
    settings = staticmethod(aws_settings)
    variables = staticmethod(aws_packer_variables)
    parse_packer_manifest = staticmethod(parse_packer_manifest)
    image_record = staticmethod(image_record)

    def describe(self, settings: Mapping) -> str:
        return f"{settings['builder_instance_type']} in {settings['region']}"


def build_aws_image(config: ClusterConfig, state: StateDir, *, force: bool = False) -> dict:
    """Bake the AWS GPU image for the config and record it; the record (aws-latest.json)."""
    return cloud.build_cloud_image(AwsBuilder(), config, state, force=force)[0]
