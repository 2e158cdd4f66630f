"""Findings 7 and 3 of the security review, at the join program (root, on the head): it writes
into trees a cluster user owns (~/.ssh) or could have created (/shared/jobs). Each test plants
what the review's exploit plants, then runs the real program on a node root (--root)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "roles" / "node_join" / "files" / "clusterbake-node-join"
ALICE, MALLORY = 2101, 2102  # uids no account of this machine has: a file of theirs is nobody's here


@pytest.fixture
def root():
    """A head's root with two cluster users (the accounts exist: no useradd needed) and their homes,
    in a directory the users can reach (pytest's own are root's only)."""
    assert os.geteuid() == 0, "these tests chown to the cluster users' uids: run them as root (CI does)"
    top = Path(tempfile.mkdtemp(prefix="cb-join-"))
    top.chmod(0o755)
    node = top / "node"
    (node / "etc").mkdir(parents=True)
    (node / "etc/passwd").write_text(
        f"root:x:0:0::/root:/bin/sh\nalice:x:{ALICE}:{ALICE}::/home/alice:/bin/sh\n"
        f"mallory:x:{MALLORY}:{MALLORY}::/home/mallory:/bin/sh\n"
    )
    (node / "etc/group").write_text(f"root:x:0:\nalice:x:{ALICE}:\nmallory:x:{MALLORY}:\n")
    (node / "root/.ssh").mkdir(parents=True, mode=0o700)
    (node / "root/.ssh/authorized_keys").write_text("ssh-ed25519 AAAA controller\n")
    for name, uid in (("alice", ALICE), ("mallory", MALLORY)):
        (node / "home" / name).mkdir(parents=True, mode=0o700)
        os.chown(node / "home" / name, uid, uid)
    (node / "shared").mkdir(mode=0o777)
    (node / "shared").chmod(0o1777)
    yield node
    shutil.rmtree(top)


def bundle(**extra) -> dict:
    users = [
        {"name": "alice", "uid": ALICE, "gid": ALICE, "ssh_authorized_keys": ["ssh-ed25519 AAAA alice"]},
        {"name": "mallory", "uid": MALLORY, "gid": MALLORY, "ssh_authorized_keys": ["ssh-ed25519 AAAA mallory"]},
    ]
    return {"format": 1, "cluster": "t", "manage_homes": True, "users": users, **extra}


def join(root: Path, data: dict) -> tuple[subprocess.CompletedProcess, dict]:
    path = root.parent / "bundle.json"
    path.write_text(json.dumps(data))
    result = subprocess.run([sys.executable, PROGRAM, "--root", str(root), "--bundle", str(path)],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr  # a user's plant never stops the node joining
    return result, json.loads(result.stdout)


def as_user(uid: int, action) -> None:
    """Plant as the user would (their uid owns what they create)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            action()
            os._exit(0)
        except BaseException:
            os._exit(1)
    assert os.waitpid(pid, 0)[1] == 0


def test_a_users_ssh_link_to_roots_ssh_is_refused_not_written_through(root):
    """Exploit: `ln -s /root/.ssh ~/.ssh`; the next join replaced root's authorized_keys with a file
    the user owns (the controller locked out of the head)."""
    as_user(MALLORY, lambda: os.symlink(root / "root/.ssh", root / "home/mallory/.ssh"))
    result, out = join(root, bundle())
    assert (root / "root/.ssh/authorized_keys").read_text() == "ssh-ed25519 AAAA controller\n"
    assert os.stat(root / "root/.ssh/authorized_keys").st_uid == 0
    assert any("/home/mallory/.ssh/authorized_keys not written" in w for w in out["warnings"]), out
    assert "warning" in result.stderr
    # The other user's keys are written as before, theirs and private.
    keys = root / "home/alice/.ssh/authorized_keys"
    assert keys.read_text() == "ssh-ed25519 AAAA alice\n"
    assert (os.stat(keys).st_uid, os.stat(keys).st_mode & 0o777) == (ALICE, 0o600)
    assert (os.stat(keys.parent).st_uid, os.stat(keys.parent).st_mode & 0o777) == (ALICE, 0o700)


def test_a_link_in_place_of_authorized_keys_is_replaced_not_followed(root):
    (root / "etc/shadow").write_text("root:secret:\n")
    os.chmod(root / "etc/shadow", 0o600)

    def plant():
        (root / "home/mallory/.ssh").mkdir(mode=0o700)
        os.symlink(root / "etc/shadow", root / "home/mallory/.ssh/authorized_keys")

    as_user(MALLORY, plant)
    join(root, bundle())
    assert (root / "etc/shadow").read_text() == "root:secret:\n" and os.stat(root / "etc/shadow").st_uid == 0
    keys = root / "home/mallory/.ssh/authorized_keys"
    assert not keys.is_symlink() and keys.read_text() == "ssh-ed25519 AAAA mallory\n"


def test_each_user_gets_a_private_job_and_checkpoint_directory_only_root_can_make(root):
    _, out = join(root, bundle(user_directories=["/shared/jobs", "/shared/checkpoints"]))
    for parent in ("shared/jobs", "shared/checkpoints"):
        info = os.lstat(root / parent)
        assert (info.st_uid, info.st_mode & 0o7777) == (0, 0o755), parent  # nobody else makes entries
        for name, uid in (("alice", ALICE), ("mallory", MALLORY)):
            mine = os.lstat(root / parent / name)
            assert (mine.st_uid, mine.st_gid, mine.st_mode & 0o7777) == (uid, uid, 0o700), (parent, name)
    assert out["warnings"] == []
    _, again = join(root, bundle(user_directories=["/shared/jobs", "/shared/checkpoints"]))
    assert again["changed"] == []


def test_a_jobs_directory_a_user_planted_is_not_used(root):
    """Exploit (finding 3): a user creates /shared/jobs before the first submit, with their link in
    it; the review's fix: root never uses a directory a user made. Here the join refuses it (and
    `job submit`, which then finds no directory of the job's user, fails saying so)."""

    def plant():
        (root / "shared/jobs").mkdir(mode=0o777)
        os.symlink(root / "etc", root / "shared/jobs/alice")

    as_user(MALLORY, plant)
    _, out = join(root, bundle(user_directories=["/shared/jobs"]))
    assert any("/shared/jobs: not used: " in w and f"owned by uid {MALLORY}" in w for w in out["warnings"]), out
    assert os.lstat(root / "shared/jobs").st_uid == MALLORY  # left for the operator to look at
    assert (root / "shared/jobs/alice").is_symlink() and os.stat(root / "etc").st_uid == 0


def test_a_users_directory_planted_by_another_user_is_refused(root):
    """With an old cluster's /shared/jobs (root's, 1777), mallory made alice's directory first:
    alice's jobs must not go where mallory can swap the script."""
    (root / "shared/jobs").mkdir()
    (root / "shared/jobs").chmod(0o1777)
    as_user(MALLORY, lambda: (root / "shared/jobs/alice").mkdir(mode=0o777))
    _, out = join(root, bundle(user_directories=["/shared/jobs"]))
    assert os.lstat(root / "shared/jobs").st_mode & 0o7777 == 0o755  # root's again: no new plants
    assert any("/shared/jobs/alice: not used" in w for w in out["warnings"]), out
    assert os.lstat(root / "shared/jobs/mallory").st_uid == MALLORY
