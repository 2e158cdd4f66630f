"""The job templates' durable checkpoint copies in S3 (scripts/jobs/checkpoint-copy), against
moto_server over HTTP with boto3: what a node with the cluster's node role does on AWS. The
template's use of it is tests/unit/test_job_templates.py; the node role's access to the bucket
and a restore after the shared file system is lost, on real nodes, tests/twin/test_aws_twin.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "scripts" / "jobs" / "checkpoint-copy"
GONE = 2**22 + 7  # no such process: `follow` copies once and stops


def checkpoint(directory: Path, step: int) -> None:
    tag = directory / f"step{step}"
    (tag / "zero").mkdir(parents=True, exist_ok=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"model %d" % step)
    (tag / "zero" / "optim_states.pt").write_bytes(b"optim %d" % step)
    (directory / "latest").write_text(f"step{step}")


def copy(moto, *args: str) -> subprocess.CompletedProcess:
    env = {**moto.env, "CLUSTERBAKE_S3_ENDPOINT_URL": moto.url}
    return subprocess.run([sys.executable, str(PROGRAM), *args], env=env, capture_output=True, text=True, timeout=60)


def keys(s3, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", []))


def test_checkpoints_are_copied_latest_last_pruned_and_restored(moto, tmp_path):
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="ckpt-copies")
    local = tmp_path / "ckpt"
    checkpoint(local, 10)
    first = copy(moto, "follow", str(local), "s3://ckpt-copies/runs/job", "--while-pid", str(GONE))
    assert first.returncode == 0, first.stderr
    assert "copied checkpoint step10 to s3://ckpt-copies/runs/job" in first.stderr
    assert keys(s3, "ckpt-copies") == [
        "runs/job/latest",
        "runs/job/step10/mp_rank_00_model_states.pt",
        "runs/job/step10/zero/optim_states.pt",
    ]
    # The next checkpoint; the training pruned the old one: so does the copy.
    checkpoint(local, 20)
    for old in (local / "step10").rglob("*"):
        if old.is_file():
            old.unlink()
    (local / "step10" / "zero").rmdir()
    (local / "step10").rmdir()
    assert copy(moto, "follow", str(local), "s3://ckpt-copies/runs/job", "--while-pid", str(GONE)).returncode == 0
    assert keys(s3, "ckpt-copies") == [
        "runs/job/latest",
        "runs/job/step20/mp_rank_00_model_states.pt",
        "runs/job/step20/zero/optim_states.pt",
    ]
    assert s3.get_object(Bucket="ckpt-copies", Key="runs/job/latest")["Body"].read() == b"step20\n"
    # The shared file system is lost: a new run's directory is empty, the copy brings it back.
    fresh = tmp_path / "fresh"
    restored = copy(moto, "restore", str(fresh), "s3://ckpt-copies/runs/job")
    assert restored.returncode == 0, restored.stderr
    assert "restored checkpoint step20 from s3://ckpt-copies/runs/job" in restored.stderr
    assert (fresh / "latest").read_text() == "step20\n"
    assert (fresh / "step20" / "zero" / "optim_states.pt").read_bytes() == b"optim 20"


def test_a_directory_that_has_its_checkpoint_is_not_overwritten(moto, tmp_path):
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="ckpt-keep")
    s3.put_object(Bucket="ckpt-keep", Key="job/latest", Body=b"step90\n")
    local = tmp_path / "ckpt"
    checkpoint(local, 30)
    assert copy(moto, "restore", str(local), "s3://ckpt-keep/job").returncode == 0
    assert (local / "latest").read_text() == "step30"  # the newer local one wins
    assert not (local / "step90").exists()


def test_a_failed_copy_is_said_and_the_exit_status_tells(moto, tmp_path):
    local = tmp_path / "ckpt"
    checkpoint(local, 5)
    result = copy(moto, "follow", str(local), "s3://no-such-bucket-here/job", "--while-pid", str(GONE))
    assert result.returncode == 1
    assert "copy to s3://no-such-bucket-here/job failed: " in result.stderr
    assert "The specified bucket does not exist" in result.stderr


def test_a_restore_never_writes_outside_the_checkpoint_directory(moto, tmp_path):
    """Security review finding 5: another user with write access to the copies names a `latest` of
    ../../.., or keys with ../ in them; the victim's restore wrote where those pointed (~/.ssh)."""
    s3 = moto.client("s3")
    s3.create_bucket(Bucket="ckpt-shared")
    home = tmp_path / "home" / "victim"
    local = home / "checkpoints" / "job"
    s3.put_object(Bucket="ckpt-shared", Key="victim/job/latest", Body=b"../../../.ssh\n")
    s3.put_object(Bucket="ckpt-shared", Key="victim/job/../../../.ssh/authorized_keys", Body=b"ssh-ed25519 AAAA x\n")
    tagged = copy(moto, "restore", str(local), "s3://ckpt-shared/victim/job")
    assert tagged.returncode == 1 and "not a checkpoint tag" in tagged.stderr, tagged.stderr
    # A good tag whose keys climb out.
    s3.put_object(Bucket="ckpt-shared", Key="victim/job/latest", Body=b"step5\n")
    s3.put_object(Bucket="ckpt-shared", Key="victim/job/step5/../../../../.ssh/authorized_keys", Body=b"x\n")
    s3.put_object(Bucket="ckpt-shared", Key="victim/job/step5/mp_rank_00_model_states.pt", Body=b"model\n")
    keyed = copy(moto, "restore", str(local), "s3://ckpt-shared/victim/job")
    assert keyed.returncode == 1 and "not a path inside the checkpoint" in keyed.stderr, keyed.stderr
    assert not (home / ".ssh").exists() and not (tmp_path / "home" / ".ssh").exists()
    assert not (local / "step5").exists()  # every key checked before anything is written
