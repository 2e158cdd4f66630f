"""What goes into an image: the builder's inventory groups and the inputs digest.

An image is rebuilt when its inputs change; the store finds an image by that digest.
Both the builders and the store (for the local provider's lookup) read this module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from clusterbake.config import ClusterConfig, extra_ca_files
from clusterbake.paths import repo_root
from clusterbake.wheelhouse import wheelhouse_key

SUITE = {"debian-12": "bookworm"}
# What a local node needs before Ansible can reach it (python3-apt: Ansible's apt module;
# nodes have no network to fetch it later).
BASE_PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "iproute2",
    "sudo",
    "ca-certificates",
    "procps",
]
INPUT_DIRS = ("ansible", "roles", "packer", "scripts/jobs")
# The GPU stack's version manifest: tagged on cloud images, recorded by the image itself.
MANIFEST_PATH = Path("ansible/group_vars/all/versions.yml")
# Cloud build settings (image.aws, image.azure) do not change the local image.
CLOUD_BUILD_SECTIONS = {"aws", "azure"}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def base_key(config: ClusterConfig) -> str:
    """The local debootstrap base's cache key."""
    spec = {"suite": SUITE[config.image.base], "mirror": config.image.mirror, "packages": BASE_PACKAGES}
    return _digest(json.dumps(spec, sort_keys=True).encode())[:16]


def hash_repository_inputs(h, root: Path) -> None:
    """Add the files of the repository that go into an image (playbooks, roles, templates, job scripts)."""
    for directory in INPUT_DIRS:
        for path in sorted((root / directory).rglob("*")):
            # Documentation does not change the image; a README edit must not force a rebuild. The
            # ops playbooks run against a live cluster: neither the image nor its configuration.
            if path.suffix == ".md" or "__pycache__" in path.parts or path.name.startswith(".packer"):
                continue
            if path.relative_to(root).parts[:2] == ("ansible", "ops"):
                continue
            if path.is_file():
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")


def builder_groups_for(features: Iterable) -> list[str]:
    """The builder joins every group a node will be in: features switch components on."""
    return ["slurm_head", "slurm_compute", *sorted({str(f).replace("-", "_") for f in features})]


def node_group_features(config: ClusterConfig) -> list[str]:
    return [f for group in config.node_groups for f in group.features]


def builder_groups(config: ClusterConfig) -> list[str]:
    """The local builder's groups: the node groups' features."""
    return builder_groups_for(node_group_features(config))


def local_inputs_digest(config: ClusterConfig) -> str:
    """Everything that changes what lands in the local image."""
    h = hashlib.sha256()
    h.update(json.dumps(config.image.model_dump(exclude=CLOUD_BUILD_SECTIONS), sort_keys=True).encode())
    h.update(base_key(config).encode())
    h.update(" ".join(builder_groups(config)).encode())
    if "train" in builder_groups(config):
        h.update(wheelhouse_key(config.training.extra_requirements).encode())
    for ca in extra_ca_files(config):
        h.update(Path(ca).read_bytes())
    hash_repository_inputs(h, repo_root())
    return h.hexdigest()[:16]


def settings_digest(settings: dict, root: Path | None = None) -> str:
    """A cloud image's inputs: its build settings, the playbooks, roles, templates, CA files."""
    root = root or repo_root()
    h = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    hash_repository_inputs(h, root)
    for ca in settings.get("extra_ca_certificates", []):
        h.update(Path(ca).read_bytes())
    return h.hexdigest()[:16]


def versions_digest(root: Path | None = None) -> str:
    """sha256 of the version manifest: tagged on cloud images, recorded by the image itself."""
    return hashlib.sha256(((root or repo_root()) / MANIFEST_PATH).read_bytes()).hexdigest()
