"""The EC2 twin's FSx automatic export (twins/aws/fsx.py export_changes): what a data repository
association with an AutoExportPolicy puts into S3, as FSx exports new and changed files."""

from __future__ import annotations

import os

from clusterbake.twins.aws.fsx import export_changes


def test_new_and_changed_files_are_exported_once_each(tmp_path):
    fs = tmp_path / "fsx" / "fs-0123"
    (fs / "ckpt" / "step-1").mkdir(parents=True)
    (fs / "ckpt" / "step-1" / "model.pt").write_bytes(b"weights-1")
    (fs / "outside.txt").write_text("not under the association's path")
    put: list[tuple[str, str, bytes]] = []

    def record(bucket, key, data):
        put.append((bucket, key, data))

    assert export_changes(fs, "/ckpt", "s3://team-data/run-7", record) == ["run-7/step-1/model.pt"]
    assert put == [("team-data", "run-7/step-1/model.pt", b"weights-1")]
    assert export_changes(fs, "/ckpt", "s3://team-data/run-7", record) == []  # unchanged: not again
    model = fs / "ckpt" / "step-1" / "model.pt"
    model.write_bytes(b"weights-2, longer")
    os.utime(model, (1, 1))
    (fs / "ckpt" / "step-2.pt").write_bytes(b"weights-3")
    assert sorted(export_changes(fs, "/ckpt", "s3://team-data/run-7", record)) == [
        "run-7/step-1/model.pt",
        "run-7/step-2.pt",
    ]
    assert put[-2:] == [("team-data", "run-7/step-1/model.pt", b"weights-2, longer"),
                        ("team-data", "run-7/step-2.pt", b"weights-3")]  # fmt: skip


def test_a_bucket_without_a_prefix_and_a_missing_directory(tmp_path):
    put = []
    assert export_changes(tmp_path / "gone", "/", "s3://team-data", lambda *a: put.append(a)) == []
    (tmp_path / "fs").mkdir()
    (tmp_path / "fs" / "a.txt").write_text("a")
    assert export_changes(tmp_path / "fs", "/", "s3://team-data", lambda *a: put.append(a)) == ["a.txt"]
