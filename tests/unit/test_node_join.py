"""clusterbake-node-join applied to a root directory: files, CA certificates, sudo, idempotence."""

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "roles" / "node_join" / "files" / "clusterbake-node-join"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def root(tmp_path):
    """A node root whose users already exist (creating users needs useradd and root: integration tests)."""
    me, my_group = os.getuid(), os.getgid()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text(
        f"root:x:{me}:{my_group}::/root:/bin/sh\nalice:x:{me}:{my_group}::/home/alice:/bin/sh\n"
    )
    (tmp_path / "etc/group").write_text(f"root:x:{my_group}:\nalice:x:{my_group}:\n")
    return tmp_path


def bundle(**overrides) -> dict:
    data = {
        "format": 1,
        "cluster": "t",
        "manage_homes": False,
        "files": [
            {"path": "/etc/hosts", "content_b64": b64("10.0.0.1 head\n"), "mode": "0644"},
            {"path": "/etc/secret.key", "content_b64": b64("s3cret"), "mode": "0400", "restart": ["munge"]},
        ],
        "ca_certificates": [{"name": "corp.crt", "content_b64": b64("-----BEGIN CERTIFICATE-----\n")}],
        "users": [{"name": "alice", "uid": os.getuid(), "gid": os.getgid(), "sudo": True}],
        "services": ["munge"],
    }
    data.update(overrides)
    return data


def join(root: Path, data: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(data))
    return subprocess.run(
        [sys.executable, PROGRAM, "--root", str(root), "--bundle", str(path)], capture_output=True, text=True
    )


def changed(result) -> list[str]:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["changed"]


def test_applies_files_with_their_modes(root, tmp_path):
    first = changed(join(root, bundle(), tmp_path))
    assert "/etc/hosts" in first and "/etc/secret.key" in first
    assert (root / "etc/hosts").read_text() == "10.0.0.1 head\n"
    assert (root / "etc/secret.key").stat().st_mode & 0o777 == 0o400
    assert (root / "etc/sudoers.d/alice").read_text() == "alice ALL=(ALL:ALL) NOPASSWD: ALL\n"
    assert (root / "usr/local/share/ca-certificates/clusterbake/corp.crt").exists()


def test_second_run_changes_nothing(root, tmp_path):
    changed(join(root, bundle(), tmp_path))
    assert changed(join(root, bundle(), tmp_path)) == []


def test_removed_entries_are_revoked(root, tmp_path):
    changed(join(root, bundle(), tmp_path))
    users = [{"name": "alice", "uid": os.getuid(), "gid": os.getgid(), "sudo": False}]
    result = changed(join(root, bundle(ca_certificates=[], users=users), tmp_path))
    assert "sudo alice revoked" in result
    assert not (root / "etc/sudoers.d/alice").exists()
    assert not list((root / "usr/local/share/ca-certificates/clusterbake").iterdir())


def test_changed_mode_is_repaired(root, tmp_path):
    changed(join(root, bundle(), tmp_path))
    (root / "etc/secret.key").chmod(0o644)
    assert changed(join(root, bundle(), tmp_path)) == ["/etc/secret.key"]
    assert (root / "etc/secret.key").stat().st_mode & 0o777 == 0o400


def test_uid_conflict_is_an_error_not_a_silent_change(root, tmp_path):
    users = [{"name": "alice", "uid": os.getuid() + 1, "gid": os.getgid()}]
    result = join(root, bundle(users=users), tmp_path)
    assert result.returncode == 1
    assert "user alice exists with uid" in result.stderr


def test_unknown_bundle_format_is_refused(root, tmp_path):
    result = join(root, bundle(format=99), tmp_path)
    assert result.returncode == 1 and "bundle format 99" in result.stderr


def test_install_keeps_the_bundle_from_stdin_private(root, tmp_path):
    kept = tmp_path / "kept" / "node-join.json"
    text = json.dumps(bundle())
    run = subprocess.run(
        [sys.executable, PROGRAM, "--root", str(root), "--install", "--bundle", str(kept.relative_to(root))],
        input=text, capture_output=True, text=True,
    )  # fmt: skip
    assert "join bundle" in changed(run)
    assert kept.read_text() == text and kept.stat().st_mode & 0o777 == 0o600
    again = subprocess.run(
        [sys.executable, PROGRAM, "--root", str(root), "--install", "--bundle", str(kept.relative_to(root))],
        input=text, capture_output=True, text=True,
    )  # fmt: skip
    assert changed(again) == []
