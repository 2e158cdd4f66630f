"""The twins' mount.lustre stand-in (twins/mount_helper.py): a node the file system's servers cannot reach
(the Azure twin's NSG check puts it under the map's "refused") gets mount.lustre's failure, not a bind.

The node's own address is what the kernel routes it from: here the file system's MGS is 127.0.0.5, so this
machine reaches it from 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from clusterbake.twins import mount_helper

SPEC = "127.0.0.5@tcp:/lustrefs"
WHY = "rule deny-vnet (priority 4000) of network security group clusterbake-c denies inbound TCP 988"


@pytest.fixture
def storage(tmp_path, monkeypatch):
    (tmp_path / "amlfs" / "scratch").mkdir(parents=True)
    monkeypatch.setattr(mount_helper, "STORAGE", tmp_path)
    return tmp_path


def write_map(storage, refused: dict) -> None:
    entry = {"dir": "amlfs/scratch", "fs_name": "lustrefs", "refused": refused}
    (storage / "endpoints.json").write_text(json.dumps({"127.0.0.5": entry}))


def test_a_node_the_servers_cannot_reach_gets_mount_lustres_failure(storage, tmp_path, capsys):
    write_map(storage, {"127.0.0.1": WHY})
    assert mount_helper.main([SPEC, str(tmp_path / "mnt"), "-o", "noatime,flock"]) == mount_helper.EXIT_FAILURE
    err = capsys.readouterr().err
    assert f"mount.lustre: mount {SPEC} at {tmp_path / 'mnt'} failed: Input/output error" in err
    assert f"clusterbake twin: {WHY}" in err


def test_other_nodes_refusals_do_not_stop_this_one(storage):
    write_map(storage, {"10.70.0.9": WHY})
    entry, source = mount_helper.lookup(SPEC)
    assert source == storage / "amlfs" / "scratch"
    assert mount_helper.refusal(entry, SPEC) is None
    write_map(storage, {})
    assert mount_helper.refusal(mount_helper.lookup(SPEC)[0], SPEC) is None
    assert mount_helper.lookup("127.0.0.5@tcp:/otherfs") is None  # the wrong file system name
