"""The one interface of the image builders, and the choice of builder.

A builder bakes the node image of one target with Packer and records it in the
store (clusterbake.images.store):

    builder = get_builder(config.provider)
    record = builder.build(config, state, force=False)   # an ImageRecord
    builder.packer_vars(config, run)                     # the -var values of its source

`packer_vars` is the whole mapping from the config (its image: section and the
cloud's section) to the template's variables; `build` adds nothing from the config
that `packer_vars` does not say.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from clusterbake.config import ClusterConfig
from clusterbake.images.store import ImageRecord
from clusterbake.state import StateDir

BUILDERS = ("local", "aws", "azure")


@dataclass(frozen=True)
class PackerRun:
    """What one build chooses besides the config: names and files of that run."""

    name: str  # the image's name (clusterbake-<base>-<date>-<time>-<git rev>)
    image_vars_file: Path  # YAML of image-time variables (package pins, CA files, the image name)
    artifacts_dir: Path | None = None  # clouds: the manifest's and versions.json's directory
    revision: str = "unknown"  # git revision baked in
    versions_digest: str = "unknown"  # sha256 of ansible/group_vars/all/versions.yml
    repo_root: Path | None = None  # the checkout the playbooks come from
    ssh_port: int | None = None  # local: the builder node's sshd
    ssh_private_key_file: Path | None = None  # local: the key the builder node authorizes
    ansible_tags: tuple[str, ...] = ()  # local: only these tags of ansible/image.yml (a layer's groups); () all


def ansible_playbook_command() -> str:
    """ansible-playbook of the venv clusterbake runs from."""
    return str(Path(sys.executable).with_name("ansible-playbook"))


@runtime_checkable
class Builder(Protocol):
    name: str  # the provider it builds for: local, aws, azure
    source: str  # the Packer source it builds (-only=...)

    def inputs_digest(self, config: ClusterConfig) -> str:
        """Everything that changes the image: an image of the same digest is reused."""
        ...

    def packer_vars(self, config: ClusterConfig, run: PackerRun) -> dict[str, str]:
        """The -var values of its Packer source for this config and run."""
        ...

    def build(self, config: ClusterConfig, state: StateDir, *, force: bool = False) -> ImageRecord:
        """Bake the image (or find it in the store for the same inputs, unless force) and record it."""
        ...


def get_builder(name: str) -> Builder:
    """The builder for a provider name (config.provider)."""
    if name == "local":
        from clusterbake.images.local import LocalBuilder

        return LocalBuilder()
    if name == "aws":
        from clusterbake.images.aws import AwsBuilder

        return AwsBuilder()
    if name == "azure":
        from clusterbake.images.azure import AzureBuilder

        return AzureBuilder()
    raise ValueError(f"no image builder for {name!r} (builders: {', '.join(BUILDERS)})")
