"""Security review finding 5, for copies in a mounted bucket or container (scripts/jobs/checkpoint-copy
with a directory as the store): a `latest` naming a path, or a link in the copy, must not make a
restore write outside the checkpoint directory or copy what a link names. (The S3 store's half is
tests/aws/test_checkpoint_copy.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "scripts" / "jobs" / "checkpoint-copy"


def restore(local: Path, store: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PROGRAM), "restore", str(local), str(store)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_latest_that_names_a_path_is_not_restored(tmp_path):
    store, local = tmp_path / "bucket" / "alice" / "job", tmp_path / "ckpt" / "job"
    (tmp_path / "bucket" / "planted").mkdir(parents=True)
    (tmp_path / "bucket" / "planted" / "authorized_keys").write_text("ssh-ed25519 AAAA mallory\n")
    store.mkdir(parents=True)
    (store / "latest").write_text("../../planted\n")
    result = restore(local, store)
    assert result.returncode == 1 and "not a checkpoint tag" in result.stderr, result.stderr
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").rglob("authorized_keys"))


def test_a_link_in_the_copy_is_copied_as_a_link_never_followed(tmp_path):
    store, local = tmp_path / "bucket" / "job", tmp_path / "ckpt" / "job"
    (store / "step5").mkdir(parents=True)
    (store / "latest").write_text("step5\n")
    (store / "step5" / "model.pt").write_bytes(b"model")
    secret = tmp_path / "secret"
    secret.write_text("not for the store\n")
    os.symlink(secret, store / "step5" / "optim.pt")
    assert restore(local, store).returncode == 0
    assert (local / "step5" / "model.pt").read_bytes() == b"model"
    assert (local / "step5" / "optim.pt").is_symlink()  # the reader decides; no copy of its target
    os.symlink(tmp_path, store / "step6")
    (store / "latest").write_text("step6\n")
    (local / "latest").unlink()
    result = restore(local, store)
    assert result.returncode == 1 and "is a link" in result.stderr, result.stderr
