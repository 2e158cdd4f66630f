"""What the image builders' unit tests (tests/unit/test_images_*.py) share: a PackerRun and the
azure: section of a config."""

from __future__ import annotations

from pathlib import Path

from clusterbake.images.base import PackerRun

REPO = Path(__file__).resolve().parents[1]
SUBSCRIPTION = "11111111-2222-3333-4444-555555555555"
# A cloud build's staged template directory: both cloud templates (their one build in cloud.pkr.hcl
# names both sources), the shared variables and the plugin requirements.
STAGED_FILES = ["ansible.pkr.hcl", "aws.pkr.hcl", "azure.pkr.hcl", "cloud.pkr.hcl", "required_plugins.pkr.hcl"]


def azure_section() -> dict:
    """A config's azure: section (an existing subnet by vnet and subnet name)."""
    return {
        "subscription_id": SUBSCRIPTION,
        "location": "eastus",
        "resource_group": "demo-rg",
        "vnet_name": "vnet",
        "subnet_name": "nodes",
    }


def packer_run(tmp_path: Path, name: str, revision: str) -> PackerRun:
    """A PackerRun of image `name` with its files under tmp_path."""
    return PackerRun(
        name=name,
        image_vars_file=tmp_path / "v.yml",
        artifacts_dir=tmp_path / "a",
        revision=revision,
        versions_digest="d" * 64,
        repo_root=REPO,
    )
