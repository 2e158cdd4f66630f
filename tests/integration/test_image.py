"""The baked image: versioned name, manifest, reuse, and no baked secrets."""

import json
import re

from localtest import CONFIG, cb


def image_dir():
    from clusterbake.config import load_config
    from clusterbake.images.inputs import local_inputs_digest as inputs_digest
    from clusterbake.images.store import ImageStore
    from clusterbake.state import StateDir

    config = load_config(CONFIG)
    return ImageStore(StateDir.for_config(config)).lookup(inputs_digest(config))


def test_image_is_versioned_with_manifest(image):
    path = image_dir()
    assert path is not None
    assert re.fullmatch(r"clusterbake-debian-12-\d{8}-\d{6}-(\w{10}|nogit)", path.name)
    manifest = json.loads((path / "manifest.json").read_text())
    packages = manifest["versions"]["packages"]
    for name in ("slurmctld", "slurmd", "munge"):
        assert re.match(r"\d", packages[name]), packages
    assert manifest["packer_version"] and manifest["inputs_digest"]


def test_image_carries_no_identity_or_secret(image):
    root = image_dir() / "rootfs"
    assert not list(root.glob("etc/ssh/ssh_host_*"))
    assert not (root / "etc/munge/munge.key").exists()
    assert (root / "etc/machine-id").read_text() == ""
    assert not (root / "root/.ssh/authorized_keys").exists()


def test_unchanged_inputs_reuse_the_image(image):
    before = image_dir().name
    again = cb("image", "build")
    assert "is up to date" in again.stderr
    assert image_dir().name == before
