"""Container jobs on the suite's shared cluster (tests/integration/cluster.yaml): an image archive made
here the way `docker save` writes one, imported by a researcher on the login node with
clusterbake-container, then run by Slurm (`srun --container`, the job templates' --container) on the
compute nodes through crun, as the researcher, with the node's network, storage and fabric profile.

The image: the suite's node image (Debian 12 with the training environment: torch, on PATH through the
image's Env) and a second layer that adds a marker file and deletes Slurm's commands (whiteouts), so a
job can tell it ran in the image and not on the node, and the templates must find the rendezvous
host outside it, as with an NGC image.
"""

import hashlib
import io
import json
import shlex
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from localtest import CONFIG, cb, on
from polling import poll

from clusterbake.config import load_config
from clusterbake.images.store import find_local_image
from clusterbake.state import StateDir

USER = "researcher"
MARKER = "/etc/clusterbake-test-image"
IMAGE = f"/home/{USER}/images/suite"
# What the image leaves out of the node image: documentation, and the head's database files.
EXCLUDED = ["./usr/share/doc", "./usr/share/man", "./usr/share/locale", "./var/lib/mysql", "./var/cache/apt"]
REMOVED_BY_LAYER = ["usr/bin/scontrol", "usr/bin/sinfo", "usr/bin/srun"]


def as_user(command: str, node: str = "login-1", check: bool = True, timeout: int = 600):
    return on(node, f"runuser -l {USER} -c {shlex.quote(command)}", check=check, timeout=timeout)


def _second_layer() -> bytes:
    """The marker file, and whiteouts (`.wh.NAME`, the image format's deletions) of Slurm's commands."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as layer:
        marker = b"made by tests/integration/test_containers.py\n"
        info = tarfile.TarInfo(MARKER.lstrip("/"))
        info.size, info.mode = len(marker), 0o644
        layer.addfile(info, io.BytesIO(marker))
        for path in REMOVED_BY_LAYER:
            parent, name = path.rsplit("/", 1)
            layer.addfile(tarfile.TarInfo(f"{parent}/.wh.{name}"), io.BytesIO(b""))
    return buffer.getvalue()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_docker_archive(rootfs: Path, work: Path) -> Path:
    """A `docker save` archive (manifest.json, the image config, one tar per layer) of two layers."""
    base = work / "base" / "layer.tar"
    base.parent.mkdir(parents=True)
    excludes = [f"--exclude={path}" for path in EXCLUDED]
    subprocess.run(["tar", "-C", str(rootfs), *excludes, "--numeric-owner", "-cf", str(base), "."], check=True)
    top = work / "top" / "layer.tar"
    top.parent.mkdir()
    top.write_bytes(_second_layer())
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/opt/clusterbake/train/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": ["/bin/bash"],
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{_sha256(base)}", f"sha256:{_sha256(top)}"]},
    }
    config_bytes = json.dumps(config).encode()
    config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
    (work / config_name).write_bytes(config_bytes)
    manifest = [
        {"Config": config_name, "RepoTags": ["clusterbake-test:1"], "Layers": ["base/layer.tar", "top/layer.tar"]}
    ]
    (work / "manifest.json").write_text(json.dumps(manifest))
    archive = work / "image.tar"
    members = ["manifest.json", config_name, "base/layer.tar", "top/layer.tar"]
    subprocess.run(["tar", "-C", str(work), "--remove-files", "-cf", str(archive), *members], check=True)
    return archive


@pytest.fixture(scope="module")
def imported(cluster):
    """The archive on the cluster's /shared, imported by the researcher on the login node into their home."""
    config = load_config(CONFIG)
    state = StateDir.for_config(config)
    shared = state.cluster(config.cluster_name).root / "storage" / "shared"
    work = shared / "container-test"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir()
    started = time.monotonic()
    archive = write_docker_archive(find_local_image(config, state) / "rootfs", work)
    archive.chmod(0o644)
    written = time.monotonic() - started
    as_user(f"rm -rf {IMAGE} && mkdir -p {Path(IMAGE).parent}")
    started = time.monotonic()
    result = as_user(f"clusterbake-container import /shared/container-test/image.tar {IMAGE}")
    print(f"archive {archive.stat().st_size >> 20} MiB written in {written:.0f} s, imported in "
          f"{time.monotonic() - started:.0f} s")  # fmt: skip
    subprocess.run(["rm", "-rf", str(work)], check=True)
    yield result
    as_user(f"rm -rf {Path(IMAGE).parent}")


def test_an_image_archive_is_imported_with_its_layers_by_the_user(imported):
    assert f"imported /shared/container-test/image.tar into {IMAGE}" in imported.stdout, imported.stdout
    listing = as_user(
        f"stat -c %U {IMAGE}/rootfs/etc; cat {IMAGE}/rootfs{MARKER}; ls {IMAGE}/rootfs/usr/bin/ | grep -c '^s' ;"
        f" for p in {' '.join(REMOVED_BY_LAYER)}; do test -e {IMAGE}/rootfs/$p && echo still-there $p; done;"
        f" ls -a {Path(IMAGE).parent}"
    ).stdout
    assert listing.splitlines()[0] == USER, listing  # unpacked as the user (rootless), no root-owned files
    assert "made by tests/integration/test_containers.py" in listing
    assert "still-there" not in listing, listing  # the top layer's whiteouts were applied
    assert ".suite.import-" not in listing  # the work directory beside it is gone


def test_a_file_that_is_not_an_image_is_refused_and_leaves_nothing(imported):
    result = as_user(
        "echo hello > /tmp/not-an-image && clusterbake-container import /tmp/not-an-image ~/images/bad",
        check=False,
    )
    assert result.returncode == 2
    assert "/tmp/not-an-image: not an image archive" in result.stderr, result.stderr
    assert as_user("ls -A ~/images").stdout.split() == ["suite"]


def test_srun_runs_a_step_in_the_image_as_the_user_with_the_node_network_and_storage(imported):
    probe = (
        f"cat {MARKER}; id -u; hostname; command -v scontrol || echo no-scontrol; "
        "cat /proc/self/uid_map | tr -s ' '; ls -d /shared /home/" + USER + "; "
        "ip -o -4 addr show host0 | wc -l; touch /usr/bin/x 2>&1 | grep -c 'Read-only'; "
        "python3 -c 'import torch; print(\"torch\", torch.__version__)'"
    )
    result = as_user(f"cd /shared && srun -N1 -w cpu-1 --container={IMAGE} bash -c {shlex.quote(probe)}")
    lines = result.stdout.splitlines()
    assert lines[0] == "made by tests/integration/test_containers.py", result.stdout
    assert lines[1] == "2001" and lines[2] == "cpu-1", result.stdout  # the user, the node's hostname
    assert lines[3] == "no-scontrol", result.stdout  # in the image, not on the node
    assert lines[4].split() == ["2001", "2001", "1"], result.stdout  # only the user mapped: no root inside
    assert sorted(lines[5:7]) == [f"/home/{USER}", "/shared"], result.stdout
    assert lines[7] == "1", result.stdout  # the node's interface: no network namespace
    assert lines[8] == "1", result.stdout  # the image is read-only
    assert lines[9].startswith("torch "), result.stdout


def test_a_job_template_runs_in_the_image_over_the_same_transport_as_on_the_node(imported):
    reports = {}
    for container in (None, IMAGE):
        extra = ["--container", container] if container else []
        result = cb("job", "submit", "hello-distributed", "--nodes", "2", *extra, "--wait", timeout=600)
        job = result.stdout.split("submitted job ")[1].split()[0]
        reports[container] = json.loads(cb("job", "report", job, "--json").stdout)["transport"]
        assert "transport: gloo over TCP" in result.stdout, result.stdout
    outside, inside = reports[None], reports[IMAGE]
    assert inside["container"] == IMAGE and outside["container"] is None
    assert {k: inside[k] for k in ("library", "transport", "fabric")} == {
        k: outside[k] for k in ("library", "transport", "fabric")
    }
    assert inside["mismatch"] is False


def test_oci_conf_stays_where_slurmd_reads_it_and_a_step_it_lost_refuses_to_run_outside(imported):
    link = "/var/spool/slurmd/conf-cache/oci.conf"
    # Without it Slurm 22.05 runs a --container step on the node itself: the templates refuse. (Removed
    # before any reconfigure of this test: after one, slurmd's rename and the path unit's link, which a
    # new slurm.conf in the cache sets off, once put it back between the rm and the job: it ran inside.)
    nodes = ("cpu-1", "cpu-2")
    for node in nodes:
        on(node, f"rm {link}")
    try:
        result = cb("job", "submit", "hello-distributed", "--nodes", "1", "--container", IMAGE, "--wait", check=False)
    finally:
        for node in nodes:
            on(node, "systemctl start clusterbake-oci-conf.service")
    assert result.returncode != 0
    assert "ran this step outside its container" in result.stdout + result.stderr, result.stdout[-3000:]
    # slurmd rewrites its conf-cache at each reconfigure, oci.conf among it (the controller's, a file
    # renamed into place; the path unit links the node's own there too: the same text, whichever
    # lands last). Asserted once slurmd has rewritten the cache's slurm.conf: oci.conf is then there
    # with the node's text. (Looking for the link right after the reconfigure raced slurmd's rename.)
    cached_at = lambda: on("cpu-1", "stat -c %.9Y /var/spool/slurmd/conf-cache/slurm.conf").stdout  # noqa: E731
    before = float(cached_at())
    on("head", "scontrol reconfigure")
    assert poll(lambda: float(cached_at()) > before, 30), "slurmd did not rewrite its conf-cache"
    back = lambda: on("cpu-1", f"cmp -s {link} /etc/slurm/oci.conf", check=False).returncode == 0  # noqa: E731
    assert poll(back, 30), "oci.conf did not come back to slurmd's conf-cache"
