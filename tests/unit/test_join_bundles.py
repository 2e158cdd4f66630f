"""The join bundles are the same on every render of the same inventory: their bytes decide whether a
re-run of `cluster up` changes anything (a bundle that differs is rewritten and re-applied), so no
part may depend on a Python set's order, which differs from process to process (PYTHONHASHSEED)."""

from __future__ import annotations

import json

import pytest
from join_run import files, host, play
from playbook_run import ANSIBLE_PLAYBOOK

HOSTS = {"head": host("10.0.1.10", "head"), "cpu-1": host("10.0.1.11", "cpu")}
GROUPS = {"slurm_head": ["head"], "slurm_compute": ["cpu-1"]}
STORAGE = [
    {"name": "shared", "mount_point": "/shared", "type": "hostdir"},
    {"name": "scratch", "mount_point": "/scratch", "type": "hostdir"},
    {"name": "datasets", "mount_point": "/datasets", "type": "hostdir", "read_only": True},
    {"name": "apps", "mount_point": "/apps", "type": "hostdir"},
]
VARIABLES = {
    "clusterbake_storage": STORAGE,
    "clusterbake_accounting": {"enabled": False},
    "clusterbake_monitoring": {"enabled": False},
}


def test_a_compute_bundle_renders_the_same_in_every_process(tmp_path, monkeypatch):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.fail("ansible-playbook is not in the venv: run `make venv`")
    bundles = []
    for seed in ("1", "2"):
        monkeypatch.setenv("PYTHONHASHSEED", seed)
        (tmp_path / seed).mkdir()
        bundles.append(play(tmp_path / seed, HOSTS, GROUPS, VARIABLES)["bundles"]["cpu-1"])
    health = json.loads(files(bundles[0])["/etc/clusterbake/health.json"]["text"])
    # The config's order, /home first; the read-only entry only among the read-only mounts.
    assert health["mounts"] == ["/home", "/shared", "/scratch", "/apps"]
    assert health["read_only_mounts"] == ["/datasets"]
    # Byte for byte, but for the munge key: join_run makes a new one for each play.
    first, second = ({**b, "files": [f for f in b["files"] if f["path"] != "/etc/munge/munge.key"]} for b in bundles)
    assert first == second
