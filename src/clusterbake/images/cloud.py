"""What the cloud builders (aws.py, azure.py) share: the build flow, the image's name,
the Packer manifest and the check of the image's own versions.json.

The flow: the same settings and repository inputs as the recorded image -> reuse it;
else Packer >= 1.10 (`packer init packer/plugins`), the template staged with the
plugin requirements, `packer build -only=<source>`, the manifest post-processor's
JSON and versions.json read back, the record written to the store.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import yaml

from clusterbake.config import ClusterConfig
from clusterbake.errors import ClusterbakeError, MissingImageError
from clusterbake.images import packer
from clusterbake.images.base import PackerRun, ansible_playbook_command
from clusterbake.images.inputs import settings_digest, versions_digest
from clusterbake.images.store import ImageRecord, ImageStore
from clusterbake.paths import git_revision, repo_root
from clusterbake.progress import phase, say
from clusterbake.state import StateDir


class CloudBuilder(Protocol):
    name: str
    source: str
    template: str  # packer/<template>
    plugin_settings: str | None  # packer/plugins/<file> inserted at the template's marker
    location_key: str  # the record's key of the region (aws region, azure location)
    label: str  # for messages: "AWS image"
    why_new_packer: str  # why Packer 1.6.6 cannot build it

    def describe(self, settings: Mapping) -> str: ...

    def settings(self, config: ClusterConfig) -> dict: ...
    def packer_vars(self, config: ClusterConfig, run: PackerRun) -> dict[str, str]: ...
    def packer_env(self, config: ClusterConfig) -> dict[str, str]: ...
    def parse_packer_manifest(self, path: Path) -> dict: ...
    def image_record(self, manifest: Mapping, versions: Mapping | None, inputs_digest: str = "") -> dict: ...
    def to_image_record(self, record: Mapping, reused: bool = False) -> ImageRecord: ...


class PackerCloudBuilder:
    """What a cloud builder (aws.py, azure.py) shares; a subclass gives its class attributes
    (CloudBuilder's, and `image_id_key`: the record's key of the image id) and its settings,
    variables, manifest parser and record functions."""

    name: str
    source: str
    template: str
    plugin_settings: str | None = None
    location_key: str
    label: str
    why_new_packer: str
    image_id_key: str

    def settings(self, config: ClusterConfig) -> dict:
        raise NotImplementedError

    def variables(self, settings: Mapping, run: PackerRun) -> dict[str, str]:
        raise NotImplementedError

    def inputs_digest(self, config: ClusterConfig) -> str:
        return settings_digest(self.settings(config))

    def packer_vars(self, config: ClusterConfig, run: PackerRun) -> dict[str, str]:
        return self.variables(self.settings(config), run)

    def packer_env(self, config: ClusterConfig) -> dict[str, str]:
        return {}

    def to_image_record(self, record: Mapping, reused: bool = False) -> ImageRecord:
        return ImageRecord(
            provider=self.name,
            image_id=record[self.image_id_key],
            name=record.get("name", ""),
            inputs_digest=record.get("inputs_digest", ""),
            location=record[self.location_key],
            data=dict(record),
            reused=reused,
        )

    def build(self, config: ClusterConfig, state: StateDir, *, force: bool = False) -> ImageRecord:
        record, reused = build_cloud_image(self, config, state, force=force)
        return self.to_image_record(record, reused=reused)


def run_variables(run: PackerRun) -> dict[str, str]:
    """The -var values every cloud template takes from the run (name, revision, files, Ansible)."""
    return {
        "image_name": run.name,
        "git_revision": run.revision,
        "versions_digest": run.versions_digest,
        "artifacts_dir": str(run.artifacts_dir or ""),
        "image_vars_file": str(run.image_vars_file),
        "ansible_playbook_command": ansible_playbook_command(),
        "repo_root": str(run.repo_root or repo_root()),
    }


def manifest_fields(build: Mapping, base_key: str, default_name: str = "") -> dict:
    """What every cloud build's manifest entry says about the image (its custom_data and times);
    `base_key`: the custom_data key of the base."""
    custom = build.get("custom_data") or {}
    return {
        "name": custom.get("image_name", default_name),
        "git_revision": custom.get("git_revision", ""),
        "manifest_digest": custom.get("versions_digest", ""),
        "base": custom.get(base_key, ""),
        "build_time": build.get("build_time"),
        "packer_run_uuid": build.get("packer_run_uuid"),
    }


def record_fields(manifest: Mapping, versions: Mapping | None, inputs_digest: str, extra: Mapping) -> dict:
    """What every cloud record (<cloud>-latest.json) holds after its image ids; `extra` after the base."""
    return {
        "name": manifest["name"],
        "git_revision": manifest["git_revision"],
        "manifest_digest": manifest["manifest_digest"],
        "versions": dict(versions or {}),
        "base": manifest.get("base", ""),
        **extra,
        "inputs_digest": inputs_digest,
        "built": built_at(manifest.get("build_time")),
    }


def image_name(base: str, revision: str | None = None) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"clusterbake-{base}-{stamp}-{revision or git_revision()}"


def built_at(build_time) -> str | None:
    return datetime.fromtimestamp(build_time, UTC).isoformat(timespec="seconds") if build_time else None


def manifest_build(path: Path, builder_type: str, run_uuid: str | None = None) -> dict:
    """The last `builder_type` build of the last run (or of run_uuid) in the manifest
    post-processor's JSON. Packer appends a build per run to the file."""
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
        if b.get("builder_type") == builder_type and (run is None or b.get("packer_run_uuid") == run)
    ]
    if not builds:
        raise ClusterbakeError(f"{path} has no {builder_type} build for run {run}")
    return builds[-1]


def check_versions(what: str, record: Mapping) -> None:
    """The image's versions.json was written from the version manifest it is tagged with."""
    gpu = (record.get("versions") or {}).get("gpu") or {}
    tagged = record.get("manifest_digest")
    if gpu.get("manifest_sha256") and tagged and gpu["manifest_sha256"] != tagged:
        raise ClusterbakeError(
            f"{what} was built from version manifest {gpu['manifest_sha256'][:12]}, "
            f"but tagged {tagged[:12]}: the playbooks changed during the build; rebuild"
        )


def write_image_vars(path: Path, settings: Mapping, name: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "common_package_pins": dict(settings["package_pins"]),
                "clusterbake_extra_ca_certificates": list(settings["extra_ca_certificates"]),
                "clusterbake_image_name": name,
            }
        )
    )
    return path


def build_cloud_image(
    builder: CloudBuilder, config: ClusterConfig, state: StateDir, *, force: bool = False
) -> tuple[dict, bool]:
    """Bake the cloud image of `builder` for `config` and record it in the store
    (<state_dir>/images/<cloud>-latest.json); the record, and whether it was reused: an
    image built from the same inputs in the same region is reused unless force."""
    settings = builder.settings(config)
    root = repo_root()
    digest = settings_digest(settings, root)
    store = ImageStore(state)
    location = settings[builder.location_key]
    try:
        latest = store.read_cloud_record(builder.name)
    except MissingImageError:
        latest = None
    if latest and not force and latest.get("inputs_digest") == digest and latest.get(builder.location_key) == location:
        image = latest.get("ami_id") or latest.get("image")
        say(f"==> image {image} ({latest.get('name')}) is up to date (inputs {digest}); FORCE=1 rebuilds")
        return latest, True
    packer.require_plugin_packer(builder.label, builder.why_new_packer)
    env = builder.packer_env(config)  # credentials missing: fail before anything runs
    revision = git_revision()
    name = image_name(settings["base"], revision)
    work = store.dir / builder.name / name
    artifacts = work / "artifacts"
    log_file = state.root / "logs" / f"image-{name}.log"
    say(f"    log: {log_file}")
    artifacts.mkdir(parents=True, exist_ok=True)
    packer.init_plugins(log_file, root)
    template = packer.stage_template(builder.template, work / "template", root, builder.plugin_settings)
    vars_file = write_image_vars(work / "image-vars.yml", settings, name)
    run = PackerRun(
        name=name,
        image_vars_file=vars_file,
        artifacts_dir=artifacts,
        revision=revision,
        versions_digest=versions_digest(root),
        repo_root=root,
    )
    variables = builder.packer_vars(config, run)
    with phase(f"packer build {builder.source} ({builder.describe(settings)})"):
        packer.build(template, variables, log_file, only=builder.source, env=env)
    manifest = builder.parse_packer_manifest(artifacts / "packer-manifest.json")
    versions_file = artifacts / "versions.json"
    versions = json.loads(versions_file.read_text()) if versions_file.exists() else {}
    if not versions:
        say(f"    warning: the build brought back no versions.json; see {log_file}")
    record = builder.image_record(manifest, versions, digest)
    path = store.write_cloud_record(builder.name, record)
    shutil.rmtree(work / "template", ignore_errors=True)
    vars_file.unlink(missing_ok=True)
    image = record.get("ami_id") or record.get("image")
    say(f"    image {image} in {record[builder.location_key]} ({record['name']}), recorded in {path}")
    return record, False
