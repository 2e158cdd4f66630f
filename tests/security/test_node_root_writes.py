"""Security review finding 4: the local provider's host-side writes into a node's root followed the
node's own links (`ln -sf /etc/shadow /etc/clusterbake/node-join.json` in a node had the host write
the bundle over its own /etc/shadow at the node's next start). src/clusterbake/nspawn/rootfs.py
on a node root planted as the exploit plants it."""

from __future__ import annotations

import os

import pytest

from clusterbake.errors import ClusterbakeError
from clusterbake.nspawn import machines, rootfs

BUNDLE = "/etc/clusterbake/node-join.json"


def test_a_link_in_place_of_the_bundle_is_replaced_not_written_through(tmp_path):
    host_file = tmp_path / "host-shadow"
    host_file.write_text("root:secret:\n")
    root = tmp_path / "node"
    (root / "etc/clusterbake").mkdir(parents=True)
    (root / "etc/clusterbake/node-join.json").symlink_to(host_file)
    assert rootfs.write_in_root(root, BUNDLE, b'{"munge": "key"}', 0o600)
    assert host_file.read_text() == "root:secret:\n"
    bundle = root / "etc/clusterbake/node-join.json"
    assert not bundle.is_symlink() and bundle.read_bytes() == b'{"munge": "key"}'
    assert os.stat(bundle).st_mode & 0o777 == 0o600
    assert not rootfs.write_in_root(root, BUNDLE, b'{"munge": "key"}', 0o600)  # unchanged: not rewritten


@pytest.mark.parametrize("planted", ["etc", "etc/clusterbake"])
def test_a_link_in_place_of_a_directory_on_the_way_is_refused(tmp_path, planted):
    outside = tmp_path / "host-etc"
    outside.mkdir()
    root = tmp_path / "node"
    (root / planted).parent.mkdir(parents=True, exist_ok=True)
    (root / planted).symlink_to(outside)
    with pytest.raises(ClusterbakeError, match="not a directory of the node's own"):
        rootfs.write_in_root(root, BUNDLE, b"bundle", 0o600)
    assert list(outside.iterdir()) == []


def test_removing_the_notice_removes_a_link_never_its_target(tmp_path):
    target = tmp_path / "host-file"
    target.write_text("keep\n")
    root = tmp_path / "node"
    (root / "var/lib/clusterbake").mkdir(parents=True)
    (root / "var/lib/clusterbake/notice.json").symlink_to(target)
    rootfs.remove_in_root(root, "/var/lib/clusterbake/notice.json")
    assert target.read_text() == "keep\n" and not (root / "var/lib/clusterbake/notice.json").exists()
    rootfs.remove_in_root(root, "/var/lib/clusterbake/notice.json")  # gone already: nothing to do


def test_masking_a_unit_never_writes_through_the_nodes_links(tmp_path):
    outside = tmp_path / "host-systemd"
    outside.mkdir()
    root = tmp_path / "node"
    (root / "etc/systemd").mkdir(parents=True)
    (root / "etc/systemd/system").symlink_to(outside)
    with pytest.raises(ClusterbakeError):
        machines.mask_in_root(root, units=("fstrim.timer",))
    assert list(outside.iterdir()) == []
