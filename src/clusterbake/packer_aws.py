"""AWS GPU images: packer/aws.pkr.hcl (amazon-ebs) driven by the packer wrapper.

The provider code calls `build_aws_image(settings, state_dir)`; it stages the
template for the Packer on PATH, runs `packer build -only=amazon-ebs.ubuntu`,
reads the manifest post-processor's JSON and the image's versions.json, and
records the AMI in `<state_dir>/images/aws-latest.json`:

    {"ami_id", "region", "name", "git_revision", "manifest_digest", "versions", ...}

Packer versions (packer/README.md): amazon-ebs builds need Packer >= 1.10 with
the amazon and ansible plugins (`packer init packer/plugins`); the template is
staged with packer/plugins/required_plugins.pkr.hcl and the plugin-only settings
(IMDSv2, ed25519 key pairs). Debian's Packer 1.6.6 only validates the template:
its SSH client cannot log in to Ubuntu 22.04+ and it has no IMDSv2 settings.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import yaml

from clusterbake import packer
from clusterbake.config import DEFAULT_IMAGE_BASE
from clusterbake.errors import ClusterbakeError
from clusterbake.image import builder_groups_for, hash_repository_inputs
from clusterbake.paths import git_revision, repo_root
from clusterbake.progress import phase, run_logged, say

SOURCE = "amazon-ebs.ubuntu"
BASES = ("ubuntu-22.04", "ubuntu-24.04")
# Packer >= 1.7 has `packer init` and required_plugins; 1.10 dropped the bundled
# amazon and ansible plugins, so from there the plugins are a must.
PLUGIN_PACKER = (1, 7, 0)
BUILD_PACKER = (1, 10, 0)
MARKER = "# clusterbake:plugin-settings"
MANIFEST_PATH = Path("ansible/group_vars/all/versions.yml")
# The AMI changes when any of these does (documentation excepted).
# Feature groups of the AWS GPU image when the settings name none.
DEFAULT_FEATURES = ("aws", "cuda", "nvswitch", "efa", "dcgm", "lustre", "s3")

# The settings build_aws_image reads, with their defaults (region is required).
DEFAULTS: dict[str, object] = {
    "base": DEFAULT_IMAGE_BASE["aws"],
    "builder_instance_type": "g5.xlarge",
    "volume_size_gb": 100,
    "volume_encrypted": True,
    "kms_key_id": "",
    "subnet_id": "",
    "ssh_interface": "public_ip",
    "features": list(DEFAULT_FEATURES),
    "validate_gpu": True,
    "validate_efa": False,
    "package_pins": {},
    "extra_ca_certificates": [],
}


def parse_version(text: str) -> tuple[int, ...]:
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if not match:
        raise ClusterbakeError(f"cannot read a Packer version from {text!r}")
    return tuple(int(part) for part in match.groups())


def plugin_mode(version: str | None = None) -> bool:
    """Whether this Packer takes required_plugins (and so the staged template)."""
    return parse_version(version or packer.packer_version()) >= PLUGIN_PACKER


def versions_digest(root: Path | None = None) -> str:
    """sha256 of the version manifest: tagged on the AMI, recorded by the image itself."""
    return hashlib.sha256(((root or repo_root()) / MANIFEST_PATH).read_bytes()).hexdigest()


def stage_template(dest: Path | str, root: Path | None = None) -> Path:
    """A template directory for Packer >= 1.7: aws.pkr.hcl with the plugin-only
    settings inserted at its marker, the shared variables and the plugin
    requirements. Paths in it point back to the checkout (var.repo_root)."""
    root = root or repo_root()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    template = (root / "packer/aws.pkr.hcl").read_text()
    settings = (root / "packer/plugins/amazon-ebs.plugin-settings.hcl").read_text()
    lines = template.splitlines(keepends=True)
    marked = [i for i, line in enumerate(lines) if line.strip().startswith(MARKER)]
    if len(marked) != 1:
        raise ClusterbakeError(f"packer/aws.pkr.hcl must hold the line '{MARKER}' once, found {len(marked)}")
    lines[marked[0] : marked[0] + 1] = [settings if settings.endswith("\n") else settings + "\n"]
    (dest / "aws.pkr.hcl").write_text("".join(lines))
    shutil.copyfile(root / "packer/ansible.pkr.hcl", dest / "ansible.pkr.hcl")
    shutil.copyfile(root / "packer/plugins/required_plugins.pkr.hcl", dest / "required_plugins.pkr.hcl")
    return dest


def _settings(settings: Mapping) -> dict:
    merged = {**DEFAULTS, **{k: v for k, v in settings.items() if v is not None}}
    if not merged.get("region"):
        raise ClusterbakeError("AWS image settings need a region")
    if merged["base"] not in BASES:
        raise ClusterbakeError(f"AWS image base must be one of {', '.join(BASES)}, not {merged['base']!r}")
    return merged


def image_name(base: str, revision: str | None = None) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"clusterbake-{base}-{stamp}-{revision or git_revision()}"


def aws_packer_variables(
    settings: Mapping,
    *,
    name: str,
    revision: str,
    digest: str,
    artifacts_dir: Path,
    image_vars_file: Path,
    root: Path | None = None,
) -> dict[str, str]:
    """The -var values of packer/aws.pkr.hcl for these settings."""
    s = _settings(settings)
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
        "image_name": name,
        "git_revision": revision,
        "versions_digest": digest,
        "artifacts_dir": str(artifacts_dir),
        "image_vars_file": str(image_vars_file),
        "ansible_playbook_command": str(Path(sys.executable).with_name("ansible-playbook")),
        "repo_root": str(root or repo_root()),
    }


def parse_packer_manifest(path: Path, run_uuid: str | None = None) -> dict:
    """The AMI of the manifest post-processor's JSON: the last amazon-ebs build of
    the last run (or of run_uuid). Packer appends a build per run to the file."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ClusterbakeError(f"Packer wrote no manifest at {path}: the build did not finish") from None
    except json.JSONDecodeError as exc:
        raise ClusterbakeError(f"{path} is not JSON: {exc}") from None
    run = run_uuid or data.get("last_run_uuid")
    builds = [
        b
        for b in data.get("builds", [])
        if b.get("builder_type") == "amazon-ebs" and (run is None or b.get("packer_run_uuid") == run)
    ]
    if not builds:
        raise ClusterbakeError(f"{path} has no amazon-ebs build for run {run}")
    build = builds[-1]
    # artifact_id is "region:ami-id", comma-separated when the AMI was copied to more regions.
    amis = {}
    for part in str(build.get("artifact_id", "")).split(","):
        region, sep, ami = part.strip().partition(":")
        if not sep or not re.fullmatch(r"ami-[0-9a-f]{8,17}", ami):
            raise ClusterbakeError(f"{path}: cannot read an AMI from artifact_id {build.get('artifact_id')!r}")
        amis[region] = ami
    custom = build.get("custom_data") or {}
    region = custom.get("region") if custom.get("region") in amis else next(iter(amis))
    return {
        "ami_id": amis[region],
        "region": region,
        "amis": amis,
        "name": custom.get("image_name", ""),
        "git_revision": custom.get("git_revision", ""),
        "manifest_digest": custom.get("versions_digest", ""),
        "base": custom.get("aws_base", ""),
        "build_time": build.get("build_time"),
        "packer_run_uuid": build.get("packer_run_uuid"),
    }


def image_record(manifest: Mapping, versions: Mapping | None, inputs_digest: str = "") -> dict:
    """What aws-latest.json holds about an AMI."""
    record = {
        "ami_id": manifest["ami_id"],
        "region": manifest["region"],
        "name": manifest["name"],
        "git_revision": manifest["git_revision"],
        "manifest_digest": manifest["manifest_digest"],
        "versions": dict(versions or {}),
        "base": manifest.get("base", ""),
        "amis": dict(manifest.get("amis", {})),
        "inputs_digest": inputs_digest,
        "built": datetime.fromtimestamp(manifest["build_time"], UTC).isoformat(timespec="seconds")
        if manifest.get("build_time")
        else None,
    }
    gpu = record["versions"].get("gpu") or {}
    if gpu.get("manifest_sha256") and record["manifest_digest"] and gpu["manifest_sha256"] != record["manifest_digest"]:
        raise ClusterbakeError(
            f"AMI {record['ami_id']} was built from version manifest {gpu['manifest_sha256'][:12]}, "
            f"but tagged {record['manifest_digest'][:12]}: the playbooks changed during the build; rebuild"
        )
    return record


def latest_path(state_dir: Path) -> Path:
    return Path(state_dir) / "images" / "aws-latest.json"


def write_latest(state_dir: Path, record: Mapping) -> Path:
    """<state_dir>/images/aws-latest.json, and a copy per AMI in images/aws/<name>.json."""
    path = latest_path(state_dir)
    history = path.parent / "aws" / f"{record['name'] or record['ami_id']}.json"
    history.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    history.write_text(text)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def inputs_digest(settings: Mapping, root: Path | None = None) -> str:
    """Everything that changes the AMI: the settings and the playbooks, roles, templates."""
    root = root or repo_root()
    h = hashlib.sha256(json.dumps(_settings(settings), sort_keys=True, default=str).encode())
    hash_repository_inputs(h, root)
    for ca in _settings(settings)["extra_ca_certificates"]:
        h.update(Path(ca).read_bytes())
    return h.hexdigest()[:16]


def build_aws_image(settings: Mapping, state_dir: Path, *, force: bool = False) -> dict:
    """Bake the AWS GPU image for `settings` (see DEFAULTS; region required) and
    record it in <state_dir>/images/aws-latest.json. An AMI already built from the
    same inputs in the same region is reused unless force."""
    s = _settings(settings)
    state_dir = Path(state_dir)
    root = repo_root()
    digest = inputs_digest(s, root)
    latest = latest_path(state_dir)
    if latest.exists() and not force:
        record = json.loads(latest.read_text())
        if record.get("inputs_digest") == digest and record.get("region") == s["region"]:
            say(f"==> AMI {record['ami_id']} ({record['name']}) is up to date (inputs {digest}); FORCE=1 rebuilds")
            return record
    version = packer.packer_version()
    if parse_version(version) < BUILD_PACKER:
        raise ClusterbakeError(
            f"AWS image builds need Packer >= {'.'.join(map(str, BUILD_PACKER))} with the amazon and ansible plugins "
            f"(this is {version}): its SSH client cannot log in to Ubuntu 22.04+ and it cannot require IMDSv2. "
            "Install Packer from HashiCorp, then `packer init packer/plugins`; see packer/README.md"
        )
    revision = git_revision()
    name = image_name(s["base"], revision)
    work = state_dir / "images" / "aws" / name
    artifacts = work / "artifacts"
    log_file = state_dir / "logs" / f"image-{name}.log"
    say(f"    log: {log_file}")
    artifacts.mkdir(parents=True, exist_ok=True)
    with phase("packer init (amazon and ansible plugins)"):
        run_logged([packer.packer_binary(), "init", str(root / "packer/plugins")], log_file, what="packer init")
    template = stage_template(work / "template", root)
    vars_file = work / "image-vars.yml"
    vars_file.write_text(
        yaml.safe_dump(
            {
                "common_package_pins": dict(s["package_pins"]),
                "clusterbake_extra_ca_certificates": list(s["extra_ca_certificates"]),
                "clusterbake_image_name": name,
            }
        )
    )
    variables = aws_packer_variables(
        s,
        name=name,
        revision=revision,
        digest=versions_digest(root),
        artifacts_dir=artifacts,
        image_vars_file=vars_file,
        root=root,
    )
    with phase(f"packer build {SOURCE} ({s['builder_instance_type']} in {s['region']})"):
        packer.build(template, variables, log_file, only=SOURCE)
    manifest = parse_packer_manifest(artifacts / "packer-manifest.json")
    versions_file = artifacts / "versions.json"
    versions = json.loads(versions_file.read_text()) if versions_file.exists() else {}
    if not versions:
        say(f"    warning: the build brought back no versions.json; see {log_file}")
    record = image_record(manifest, versions, digest)
    path = write_latest(state_dir, record)
    shutil.rmtree(work / "template", ignore_errors=True)
    vars_file.unlink(missing_ok=True)
    say(f"    AMI {record['ami_id']} in {record['region']} ({record['name']}), recorded in {path}")
    return record
