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


def node_with_a_link(tmp_path, inside: str, text: str):
    """(node root, host file): the node's `inside` is a link to a host file holding `text`."""
    host_file = tmp_path / "host-file"
    host_file.write_text(text)
    root = tmp_path / "node"
    (root / inside.lstrip("/")).parent.mkdir(parents=True)
    (root / inside.lstrip("/")).symlink_to(host_file)
    return root, host_file


def test_a_link_in_place_of_the_bundle_is_replaced_not_written_through(tmp_path):
    root, host_file = node_with_a_link(tmp_path, BUNDLE, "root:secret:\n")
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
    root, target = node_with_a_link(tmp_path, "/var/lib/clusterbake/notice.json", "keep\n")
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
