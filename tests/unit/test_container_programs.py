"""Role containers' node programs: what the runtime program makes of the bundle slurmstepd writes
(Slurm 22.05's shape, with crun spec's namespaces), and how the import command tells archives apart.
The programs run for real on the suite's cluster (tests/integration/test_containers.py)."""

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
from programs import load_program

FILES = Path(__file__).resolve().parents[2] / "roles" / "containers" / "files"


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    program = load_program("clusterbake_oci_runtime", FILES / "clusterbake-oci-runtime")
    mounts = tmp_path / "containers.json"
    (tmp_path / "shared").mkdir()
    mounts.write_text(json.dumps({"read_write": [str(tmp_path / "shared"), "/nonexistent-home"], "read_only": []}))
    monkeypatch.setattr(program, "MOUNTS_FILE", str(mounts))
    return program


def step_config(rootfs: Path, env: list[str] = ()) -> dict:
    return {
        "root": {"path": str(rootfs), "readonly": False},
        "hostname": "crun",
        "process": {"user": {"uid": 0, "gid": 0}, "args": ["id"], "cwd": "/", "env": ["SLURM_JOB_ID=7", *env]},
        "mounts": [
            {"destination": "/tmp", "type": "bind", "source": "/somewhere"},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs"},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"},
        ],
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "user", "mount")],
        },
    }


def test_a_step_runs_as_its_user_with_the_node_network_and_mounts(runtime, tmp_path):
    image = tmp_path / "image"
    (image / "rootfs").mkdir(parents=True)
    # umoci's bundle config: the image's Env, and HOME and TERM of its own.
    (image / "config.json").write_text(json.dumps({"process": {"env": ["PATH=/img/bin", "HOME=/root", "TERM=x"]}}))
    workdir = tmp_path / "shared" / "run"
    job_env = ["PATH=/usr/bin", f"HOME={tmp_path}", f"PWD={workdir}"]
    config = runtime.hpc_config(step_config(image / "rootfs", job_env))
    uid, gid = os.getuid(), os.getgid()
    assert [ns["type"] for ns in config["linux"]["namespaces"]] == ["pid", "user", "mount"]
    assert config["linux"]["uidMappings"] == [{"containerID": uid, "hostID": uid, "size": 1}]
    assert config["linux"]["gidMappings"] == [{"containerID": gid, "hostID": gid, "size": 1}]
    assert config["process"]["user"] == {"uid": uid, "gid": gid}
    assert "resources" not in config["linux"]
    assert config["root"]["readonly"] is True
    by_destination = {m["destination"]: m for m in config["mounts"]}
    assert by_destination["/tmp"]["type"] == "tmpfs"  # the image's own /tmp bind replaced
    assert by_destination["/sys"]["source"] == "/sys" and "ro" in by_destination["/sys"]["options"]
    assert "/dev/mqueue" not in by_destination and "hostname" not in config
    assert by_destination[str(tmp_path / "shared")]["options"][-1] == "rw"
    assert "/nonexistent-home" not in by_destination  # not on this node: left out
    assert config["process"]["cwd"] == str(workdir)  # under a node mount: where the job was submitted
    # The image's variables over the job's, but the job's own HOME.
    assert config["process"]["env"] == [
        "SLURM_JOB_ID=7", "PATH=/img/bin", f"HOME={tmp_path}", f"PWD={workdir}", f"CLUSTERBAKE_IN_CONTAINER={image}"
    ]  # fmt: skip


def test_a_bundle_without_its_image_says_how_to_import_one(runtime, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        runtime.hpc_config(step_config(tmp_path / "gone" / "rootfs"))
    assert exit_info.value.code == 2
    assert "clusterbake-container import FILE DIR" in capsys.readouterr().err


def _tar(path: Path, names: list[str]) -> Path:
    with tarfile.open(path, "w") as archive:
        for name in names:
            archive.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
    return path


def test_the_import_command_tells_docker_and_oci_archives_apart(tmp_path, capsys):
    program = load_program("clusterbake_container", FILES / "clusterbake-container")
    assert (
        program.archive_transport(str(_tar(tmp_path / "d.tar", ["manifest.json", "a/layer.tar"]))) == "docker-archive"
    )
    assert (
        program.archive_transport(str(_tar(tmp_path / "o.tar", ["oci-layout", "index.json", "blobs/"])))
        == "oci-archive"
    )
    with pytest.raises(SystemExit):
        program.archive_transport(str(_tar(tmp_path / "x.tar", ["etc/hostname"])))
    assert "neither a docker save archive" in capsys.readouterr().err
