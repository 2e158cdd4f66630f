"""The GPU image roles in check mode on this machine: rendered files, join parts,
versions.json's gpu section, the validation and failure paths.

One `ansible-playbook --check --diff --skip-tags fetch` run of
tests/playbooks/gpu_check.yml (about 20 s here). Nothing on the host changes:
check mode, the tasks that reach a vendor (tag `fetch`) skipped, the validation
probes read only and meet the fake tools of tests/playbooks/fakebin. What needs
the vendors' packages or the hardware (driver load, EFA, Lustre and S3 mounts)
is not run here; see each role's README.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from playbook_run import ANSIBLE_PLAYBOOK, PLAYBOOKS, REPO, playbook_env

MANIFEST = REPO / "ansible" / "group_vars" / "all" / "versions.yml"
FIXTURES = PLAYBOOKS / "fixtures"
# Files the roles would write on a real builder; check mode must leave them alone.
HOST_FILES = [
    Path("/etc/fuse.conf"),
    Path("/etc/sysctl.d/99-clusterbake-efa.conf"),
    Path("/etc/clusterbake/efa.env"),
    Path("/etc/profile.d/clusterbake-cuda.sh"),
    Path("/etc/apt/preferences.d/clusterbake-nvidia-driver"),
    Path("/etc/systemd/system/nvidia-persistenced.service.d/clusterbake.conf"),
    Path("/etc/systemd/system/nvidia-fabricmanager.service"),
    Path("/etc/apt/preferences.d/clusterbake-nccl"),
    Path("/etc/apt/preferences.d/clusterbake-dcgm"),
    Path("/etc/systemd/system/nvidia-dcgm-exporter.service.d/clusterbake.conf"),
]

sys.path.insert(0, str(REPO / "roles" / "lustre_client" / "filter_plugins"))
sys.path.insert(0, str(REPO / "ansible" / "filter_plugins"))
from lustre_client import lustre_client_module_kernels  # noqa: E402
from systemd_units import systemd_escape_path, systemd_mount_unit  # noqa: E402


def _host_state() -> dict[str, tuple[int, int] | None]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) if p.exists() else None for p in HOST_FILES}


@pytest.fixture(scope="module")
def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())["clusterbake_gpu_versions"]


@pytest.fixture(scope="module")
def check_run(tmp_path_factory, manifest):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip("ansible-playbook is not in the venv (make venv)")
    if subprocess.run(["/usr/bin/python3", "-c", "import apt"], capture_output=True).returncode != 0:
        pytest.skip("the apt module's check mode needs python3-apt for /usr/bin/python3")
    tmp = tmp_path_factory.mktemp("gpu_check")
    record = tmp / "record.json"
    driver = manifest["nvidia_driver"]["version"]
    nccl = manifest["nccl"]["version"].rsplit("-", 1)[0] + "+cuda" + manifest["cuda"]["version"]
    env = playbook_env(
        tmp,
        PLAYBOOKS / "fakebin",
        record,
        FAKE_NVIDIA_SMI_VERSION=driver,
        FAKE_NVIDIA_MODULE_VERSION=driver,
        FAKE_NCCL_VERSION=nccl,
    )
    before = _host_state()
    proc = subprocess.run(
        [
            str(ANSIBLE_PLAYBOOK),
            "--check",
            "--diff",
            "--skip-tags=fetch",
            "-i",
            str(PLAYBOOKS / "inventory.yml"),
            str(PLAYBOOKS / "gpu_check.yml"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return {"records": json.loads(record.read_text()), "stdout": proc.stdout, "before": before, "after": _host_state()}


def records(run, task: str, role: str | None = None) -> list[dict]:
    found = [r for r in run["records"] if r["task"].endswith(task) and (role is None or r["role"] == role)]
    assert found, f"no task {task!r} ran"
    return found


def first_play(run) -> list[dict]:
    """Records up to the configure play (the failure cases re-run the roles)."""
    end = next(
        i for i, r in enumerate(run["records"]) if r["task"].endswith("Describe the GPU services for the join bundle")
    )
    return run["records"][:end]


def rendered(run, task: str) -> str:
    """What a template/lineinfile task of the install play would write (its diff in check mode)."""
    (record,) = [r for r in first_play(run) if r["task"].endswith(task)]
    assert record["status"] == "ok", record
    diff = record["result"]["diff"]
    return (diff[0] if isinstance(diff, list) else diff)["after"]


def fact(run, task: str, name: str):
    return records(run, task)[-1]["result"]["ansible_facts"][name]


def unit_files(part: dict) -> dict[str, str]:
    return {f["path"]: base64.b64decode(f["content_b64"]).decode() for f in part["files"]}


# --- the run as a whole ----------------------------------------------------------


def test_check_mode_changes_nothing_on_the_host(check_run):
    assert check_run["before"] == check_run["after"]
    changed = {r["task"].split(" : ", 1)[-1] for r in first_play(check_run) if r["result"].get("changed")}
    # Only file tasks report a change (what they would write); no package, download or service task ran.
    assert changed - {"Create the directory of the EFA environment file"} == {
        "Pin the driver packages to the manifest's version",
        "Create the persistence daemon's drop-in directory",
        "Run the persistence daemon with persistence mode on",
        "Keep the fabric manager out of multi-user.target's ordering",
        "Put the CUDA toolkit on login shells' PATH",
        "Allow ptrace between a user's processes (EFA shared-memory transport)",
        "Record the plugin's path for the node's fabric profile",
        "Pin NCCL to the manifest's version",
        "Pin DCGM to the manifest's version",
        "Create the drop-in directory of dcgm-exporter",
        "Point dcgm-exporter at the node's host engine",
        "Let FUSE mounts allow other users (user_allow_other)",
    }
    ran = {r["task"] for r in check_run["records"]}
    for fetching in (
        "Install the kernel headers and the open GPU kernel modules",
        "Run the EFA installer",
        "Install mount-s3",
        "Install dcgm-exporter",
    ):
        assert not any(fetching in task for task in ran)


def test_validation_passes_with_the_pinned_versions(check_run):
    for task in (
        "Check the nvidia module (open flavour, pinned version)",
        "Check that nvidia-smi works and reports the pinned version",
        "Check that the pinned driver supports this CUDA release",
        "Check that the efa kernel module is installed for this kernel",
        "Check that libfabric sees the EFA device",
        "Check that the aws-ofi-nccl plugin is installed",
        "Check that all_reduce_perf was built against NCCL",
        "Check that all_reduce_perf passed with the pinned NCCL",
        "Check that DCGM sees the GPUs",
        "Check that the repository has Lustre client modules for the kernel",
    ):
        assert records(check_run, task)[0]["status"] == "ok", task


# --- files the install half writes -------------------------------------------------


def test_driver_pin_holds_every_driver_package_at_the_manifest_version(check_run, manifest):
    pin = rendered(check_run, "Pin the driver packages to the manifest's version")
    assert "Package: nvidia-* libnvidia-* xserver-xorg-video-nvidia-* firmware-nvidia-*" in pin
    assert f"Pin: version {manifest['nvidia_driver']['version']}-*" in pin
    assert "Pin-Priority: 1001" in pin


def test_the_persistence_daemon_runs_with_persistence_mode_on(check_run):
    """Ubuntu's unit runs nvidia-persistenced --no-persistence-mode and stops when unneeded: the health
    check then drained every GPU node (hardware review item 2). The drop-in resets both."""
    dropin = rendered(check_run, "Run the persistence daemon with persistence mode on")
    lines = [line for line in dropin.splitlines() if line and not line.startswith("#")]
    assert lines == [
        "[Unit]",
        "StopWhenUnneeded=false",
        "[Service]",
        "ExecStart=",
        "ExecStart=/usr/bin/nvidia-persistenced --verbose",
    ]


def test_the_fabric_manager_unit_loses_its_ordering_after_multi_user_target(check_run):
    """slurmd waits for the fabric manager (role slurm) and is wanted by multi-user.target: the packaged
    unit's After=multi-user.target made a cycle (hardware review items 11, 12). The other orderings stay."""
    unit = rendered(check_run, "Keep the fabric manager out of multi-user.target's ordering")
    after = [line for line in unit.splitlines() if line.startswith("After=")]
    assert after == ["After=network-online.target"]
    assert "Requires=network-online.target" in unit and "WantedBy=multi-user.target" in unit
    assert "ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg" in unit


# A stand-in for Debian's and Ubuntu's slurmd.service (slurm-wlm): what matters here is its install target.
SLURMD_UNIT = """[Unit]
Description=Slurm node daemon
After=munge.service network-online.target remote-fs.target
[Service]
ExecStart=/usr/sbin/slurmd -D
[Install]
WantedBy=multi-user.target
"""


def _ordering_cycles(tmp_path: Path, fabricmanager_unit: str) -> list[str]:
    """`systemd-analyze verify` of multi-user.target wanting slurmd (with role slurm's drop-in) and the
    fabric manager: the lines that report an ordering cycle."""
    import jinja2

    units = tmp_path / "units"
    (units / "slurmd.service.d").mkdir(parents=True)
    (units / "multi-user.target.wants").mkdir()
    (units / "slurmd.service").write_text(SLURMD_UNIT)
    template = (REPO / "roles/slurm/templates/slurm-daemon-override.conf.j2").read_text()
    (units / "slurmd.service.d/override.conf").write_text(jinja2.Template(template).render(slurm_daemon="slurmd"))
    (units / "nvidia-fabricmanager.service").write_text(
        fabricmanager_unit.replace("/usr/bin/nv-fabricmanager", "/bin/true")
    )
    for unit in ("slurmd.service", "nvidia-fabricmanager.service"):
        (units / "multi-user.target.wants" / unit).symlink_to(units / unit)
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(units / "slurmd.service"), "multi-user.target"],
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{units}:"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return [line for line in (proc.stdout + proc.stderr).splitlines() if "ordering cycle" in line]


def test_slurmd_waits_for_the_fabric_manager_without_an_ordering_cycle(check_run, tmp_path):
    """Role slurm orders slurmd after the fabric manager and persistenced (item 11); with the packaged
    fabric manager unit (After=multi-user.target) that is a cycle systemd breaks by dropping slurmd's or
    the fabric manager's start (item 12); with the unit the role writes it is none."""
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze is missing (apt install systemd)")
    packaged = (FIXTURES / "systemd" / "nvidia-fabricmanager.service").read_text()
    assert _ordering_cycles(tmp_path / "packaged", packaged), "the stand-in unit should make the cycle"
    written = rendered(check_run, "Keep the fabric manager out of multi-user.target's ordering")
    assert _ordering_cycles(tmp_path / "written", written) == []


def test_nccl_and_dcgm_pins(check_run, manifest):
    nccl = rendered(check_run, "Pin NCCL to the manifest's version")
    assert "Package: libnccl2 libnccl-dev" in nccl
    assert f"Pin: version {manifest['nccl']['version']}+cuda{manifest['cuda']['version']}" in nccl
    dcgm = rendered(check_run, "Pin DCGM to the manifest's version")
    assert f"Pin: version {manifest['dcgm']['version']}\n" in dcgm
    # dcgm-exporter at the release NVIDIA pairs with it, with or without an epoch.
    exporter = dcgm.split("Package: datacenter-gpu-manager-exporter\n", 1)[1]
    assert exporter.startswith(f"Pin: version *{manifest['dcgm_exporter']['version']}-*\nPin-Priority: 1001")


def test_dcgm_exporter_talks_to_the_nodes_host_engine(check_run):
    unit = rendered(check_run, "Point dcgm-exporter at the node's host engine")
    assert "Requires=nvidia-dcgm.service\nAfter=nvidia-dcgm.service\n" in unit
    lines = unit.splitlines()
    assert lines[lines.index("ExecStart=") + 1] == (
        "ExecStart=/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv -a :9400 -r localhost:5555"
    )


def test_cuda_profile_puts_the_pinned_toolkit_on_path(check_run, manifest, tmp_path):
    profile = rendered(check_run, "Put the CUDA toolkit on login shells' PATH")
    home = f"/usr/local/cuda-{manifest['cuda']['version']}"
    assert f"export CUDA_HOME={home}\n" in profile
    assert f"export PATH={home}/bin${{PATH:+:${{PATH}}}}" in profile
    # Sourcing it twice does not grow PATH.
    (tmp_path / "cuda.sh").write_text(profile)
    script = f'PATH=/usr/bin:/bin; . {tmp_path}/cuda.sh; . {tmp_path}/cuda.sh; echo "$PATH"'
    sourced = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert sourced.stdout.strip() == f"{home}/bin:/usr/bin:/bin"


def test_efa_turns_off_ptrace_protection_after_ubuntus_default(check_run):
    record = next(r for r in first_play(check_run) if "Allow ptrace" in r["task"])
    assert record["result"]["invocation"]["module_args"]["dest"] == "/etc/sysctl.d/99-clusterbake-efa.conf"
    lines = [
        line for line in rendered(check_run, "(EFA shared-memory transport)").splitlines() if not line.startswith("#")
    ]
    assert lines == ["kernel.yama.ptrace_scope = 0"]
    # Sorted after Ubuntu's 10-ptrace.conf (kernel.yama.ptrace_scope = 1), so it wins.
    assert "99-clusterbake-efa.conf" > "10-ptrace.conf"


def test_efa_records_where_the_installer_put_aws_ofi_nccl(check_run):
    """Newer installers: lib/<multiarch>/libnccl-net-ofi.so (libnccl-net.so beside it), preferred;
    the node's fabric profile sources the file (tests/aws/test_gpu_join.py runs that part)."""
    plugin = f"{FIXTURES}/efa/ofi-nccl/lib/{platform.machine()}-linux-gnu/libnccl-net-ofi.so"
    assert fact(check_run, "Keep the plugin's path", "efa_ofi_nccl_plugin") == plugin
    record = next(
        r for r in first_play(check_run) if r["task"].endswith("Record the plugin's path for the node's fabric profile")
    )
    assert record["result"]["invocation"]["module_args"]["dest"] == "/etc/clusterbake/efa.env"
    lines = [
        line for line in rendered(check_run, "for the node's fabric profile").splitlines() if not line.startswith("#")
    ]
    assert lines == [f"CLUSTERBAKE_OFI_NCCL_PLUGIN={plugin}"]


def test_efa_finds_the_plugin_of_older_and_newer_installers(check_run):
    layouts = fact(check_run, "Keep both layouts' plugins", "efa_ofi_nccl_layouts")
    assert layouts == {
        # The first prefix is missing: the second one's lib/libnccl-net.so.
        "older": f"{FIXTURES}/efa/ofi-nccl-flat/lib/libnccl-net.so",
        "newer": f"{FIXTURES}/efa/ofi-nccl/lib/{platform.machine()}-linux-gnu/libnccl-net-ofi.so",
    }


def test_gdrcopy_comes_from_nvidias_packages_for_the_cuda_major_after_the_driver(check_run, manifest):
    downloads = fact(check_run, "Name the GDRCopy downloads", "gdrcopy_downloads")
    version = f"{manifest['gdrcopy']['version']}-{manifest['gdrcopy']['release']}"
    cuda_major = manifest["cuda"]["version"].split(".")[0]
    arch, deb_arch = {"x86_64": ("x64", "amd64"), "aarch64": ("aarch64", "arm64")}[platform.machine()]
    facts = records(check_run, "Gather the minimal facts (distribution, architecture, kernel)")
    # Rendered with this machine's facts (Debian 12): on the AWS builder, ubuntu24_04 and Ubuntu24_04.
    os_release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    distro, release = os_release["ID"].strip('"'), os_release["VERSION_ID"].strip('"').replace(".", "_")
    tag = f"{distro.capitalize()}{release}"
    base = (
        f"https://developer.download.nvidia.com/compute/redist/gdrcopy/CUDA%20{cuda_major}.0/{distro}{release}/{arch}/"
    )
    assert facts  # the role gathered what the names need
    assert downloads == {
        "gdrdrv-dkms": f"{base}gdrdrv-dkms_{version}_{deb_arch}.{tag}.deb",
        "libgdrapi": f"{base}libgdrapi_{version}_{deb_arch}.{tag}.deb",
        # NVIDIA's name for the test programs carries the CUDA series, '+' escaped in the URL.
        "gdrcopy-tests": f"{base}gdrcopy-tests_{version}_{deb_arch}.{tag}%2Bcuda{cuda_major}.0.deb",
        "gdrcopy": f"{base}gdrcopy_{version}_{deb_arch}.{tag}.deb",
    }
    # After the driver it is built against, before the EFA installer (AWS's order).
    install_play = first_play(check_run)
    install_end = [r["task"] for r in install_play].index("Collect the GPU stack's versions from its roles")
    roles = [r["role"] for r in install_play[:install_end]]
    gdrcopy = roles.index("gdrcopy")
    assert max(i for i, role in enumerate(roles) if role == "nvidia_driver") < gdrcopy
    assert gdrcopy < roles.index("efa")
    image = (REPO / "ansible" / "image.yml").read_text()
    assert image.index("name: nvidia_driver") < image.index("name: gdrcopy") < image.index("name: efa\n")


def test_gdrcopy_records_its_module_and_says_what_is_not_pinned(check_run):
    (unpinned,) = [r for r in first_play(check_run) if r["task"].endswith("Name the packages that are not pinned yet")]
    assert "GDRCopy gdrdrv-dkms, libgdrapi, gdrcopy-tests, gdrcopy: no sha256" in unpinned["result"]["msg"]
    record = fact(check_run, "Record GDRCopy's versions for versions.json", "gdrcopy_versions")
    assert record["kernel_module"] == "2.6"  # the stand-in modinfo's answer for the image's kernel


def test_an_infiniband_image_builds_nccl_tests_with_docas_open_mpi_not_the_distributions(check_run):
    (case,) = [r for r in check_run["records"] if r["task"].endswith("Case nccl-doca-mpi recorded")]
    assert case["result"]["nccl_versions"]["mpi_home"] == str(FIXTURES / "doca-mpi" / "one" / "openmpi-4.1.7a1")
    # The distribution's Open MPI is installed only when neither EFA's nor DOCA's is there.
    task = (REPO / "roles" / "nccl" / "tasks" / "install.yml").read_text()
    assert "(__nccl_system_mpi_packages if nccl_mpi == 'system' else [])" in task


def test_efa_removes_the_distributions_open_mpi_first(check_run):
    (record,) = [r for r in first_play(check_run) if r["task"].endswith("Remove the distribution's Open MPI")]
    assert record["status"] == "ok"
    assert {"openmpi-bin", "libopenmpi-dev"} <= set(record["result"]["invocation"]["module_args"]["name"])


def test_fuse_allows_other_users(check_run):
    assert (
        "user_allow_other" in rendered(check_run, "Let FUSE mounts allow other users (user_allow_other)").splitlines()
    )


# --- the gpu section of versions.json -------------------------------------------------


def test_versions_json_gets_a_gpu_section_from_every_role(check_run, manifest):
    gpu = fact(check_run, "Add the version manifest's digest", "image_gpu_versions")
    assert set(gpu) == {
        "nvidia_driver",
        "cuda_toolkit",
        "gdrcopy",
        "nccl",
        "efa",
        "dcgm",
        "lustre_client",
        "mountpoint_s3",
        "manifest_sha256",
    }
    assert gpu["manifest_sha256"] == hashlib.sha256(MANIFEST.read_bytes()).hexdigest()
    assert gpu["nvidia_driver"]["version"] == manifest["nvidia_driver"]["version"]
    assert gpu["nvidia_driver"]["kernel_module"] == manifest["nvidia_driver"]["version"]
    assert gpu["nvidia_driver"]["flavour"] == "open"
    assert gpu["cuda_toolkit"]["minimum_driver"] == "580.65.06"
    assert gpu["nccl"]["nccl"] == f"{manifest['nccl']['version']}+cuda{manifest['cuda']['version']}"
    assert gpu["nccl"]["mpi_home"] == "/opt/amazon/openmpi"  # EFA image: the installer's Open MPI
    assert gpu["efa"]["installer"] == manifest["efa_installer"]["version"]
    assert gpu["gdrcopy"]["version"] == f"{manifest['gdrcopy']['version']}-{manifest['gdrcopy']['release']}"
    assert gpu["efa"]["ofi_nccl_plugin"].endswith(
        "/ofi-nccl/lib/" + platform.machine() + "-linux-gnu/libnccl-net-ofi.so"
    )
    assert gpu["lustre_client"]["candidate"] == "2.15.6-1fsx1"
    assert gpu["mountpoint_s3"]["version"] == manifest["mountpoint_s3"]["version"]
    assert gpu["dcgm"]["exporter"] == manifest["dcgm_exporter"]["version"]


# --- configure: join parts ------------------------------------------------------------


def test_gpu_services_are_enabled_per_node_through_the_join_bundle(check_run):
    driver = fact(check_run, "Describe the GPU services for the join bundle", "nvidia_driver_join_part")
    assert driver == {"services": ["nvidia-fabricmanager", "nvidia-persistenced"]}
    assert fact(check_run, "Describe the DCGM host engine for the join bundle", "dcgm_join_part") == {
        "services": ["nvidia-dcgm", "nvidia-dcgm-exporter"]
    }


def test_s3_mount_units(check_run):
    part = fact(check_run, "Describe the S3 mounts for the join bundle", "mountpoint_s3_join_part")
    assert part["services"] == ["clusterbake-s3-data-train.service", "clusterbake-s3-data-checkpoints-2026.service"]
    units = unit_files(part)
    train = units["/etc/systemd/system/clusterbake-s3-data-train.service"]
    assert (
        "ExecStart=/usr/bin/mount-s3 --allow-other --read-only --region us-east-1 training-data /data/train\n" in train
    )
    assert "Type=forking\n" in train
    assert "After=network-online.target\n" in train
    assert "WantedBy=remote-fs.target\n" in train
    assert "ExecStop=/usr/bin/umount /data/train\n" in train
    assert all(f["mode"] == "0644" for f in part["files"])


def test_lustre_mount_units_are_named_as_systemd_requires(check_run):
    part = fact(check_run, "Describe the Lustre mounts for the join bundle", "lustre_client_join_part")
    assert part["services"] == ["fsx.mount", "shared-fsx\\x2dscratch.mount"]
    units = unit_files(part)
    fsx = units["/etc/systemd/system/fsx.mount"]
    assert "What=fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh\n" in fsx
    assert "Where=/fsx\n" in fsx
    assert "Type=lustre\n" in fsx
    assert "Options=relatime,flock,_netdev\n" in fsx
    scratch = units["/etc/systemd/system/shared-fsx\\x2dscratch.mount"]
    assert "Where=/shared/fsx-scratch\n" in scratch
    assert "Options=relatime,flock,_netdev,noatime\n" in scratch


# --- failure paths ------------------------------------------------------------------------

FAILURES = {
    "lustre-no-module": (
        "Check that the repository has Lustre client modules for the kernel",
        [
            "No Lustre client for kernel 6.8.0-1099-aws",
            "no lustre-client-modules-6.8.0-1099-aws",
            # The fixture index's newest aws kernels, in version order (not the azure one).
            "the newest: 6.8.0-1017-aws, 6.8.0-1021-aws, 6.8.0-1024-aws, 6.8.0-1029-aws, 6.8.0-1031-aws.",
            "reboot the builder before this role",
        ],
    ),
    "cuda-driver": (
        "Check that the pinned driver supports this CUDA release",
        ["CUDA 13.0 needs NVIDIA driver >= 580.65.06, the image would carry 570.172.08"],
    ),
    "driver-mismatch": (
        "Check that nvidia-smi works and reports the pinned version",
        ["the loaded driver is 570.86.15, the version manifest pins 580.159.04"],
    ),
    "driver-proprietary": (
        "Check the nvidia module (open flavour, pinned version)",
        ['licence is "NVIDIA": the proprietary flavour was installed'],
    ),
    "no-gpu": (
        "Check that nvidia-smi works and reports the pinned version",
        ["nvidia-smi failed (exit 9", "set nvidia_driver_validate=false"],
    ),
    "no-efa-device": (
        "Check that libfabric sees the EFA device",
        ["fi_info -p efa found no EFA device (exit 61", "set efa_validate=false"],
    ),
    "efa-no-plugin": (
        "Check that the aws-ofi-nccl plugin is installed",
        [
            "No aws-ofi-nccl plugin: none of ",
            "/fixtures/efa/no-ofi-nccl/lib/" + platform.machine() + "-linux-gnu/libnccl-net-ofi.so, ",
            "/nonexistent/aws-ofi-nccl/lib/libnccl-net.so exists",
            "NCCL would silently use TCP sockets instead of EFA",
        ],
    ),
    "gdrcopy-no-module": (
        "Check that DKMS built gdrdrv for the image's kernel",
        ["modinfo finds no gdrdrv module for kernel", "the DKMS build of gdrdrv-dkms failed"],
    ),
    "gdrcopy-bad-pins": (
        "Check the GDRCopy pins",
        ["must map package names (gdrdrv-dkms, libgdrapi, gdrcopy-tests, gdrcopy)"],
    ),
    "nccl-doca-two-mpis": (
        "Check that DOCA-OFED installed one Open MPI",
        ["/doca-mpi/two/openmpi-4.1.5rc2, ", "/doca-mpi/two/openmpi-4.1.7a1", "set nccl_mpi_home to the one"],
    ),
    "efa-unverified": (
        "Check that the installer can be verified before it runs",
        ["The EFA installer would run unverified"],
    ),
    "s3-bad-mount": (
        "Check the S3 mounts",
        ["mountpoint_s3_mounts needs a bucket and an absolute path"],
    ),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_failure_paths_stop_the_build_with_a_clear_message(check_run, case):
    task, messages = FAILURES[case]
    tasks = [r["task"] for r in check_run["records"]]
    end = tasks.index(f"Case {case} failed as expected")
    # The case's records start after the previous case (or after the configure play).
    start = max(i for i, task in enumerate(tasks[:end]) if task.endswith(("failed as expected", "for the join bundle")))
    failed = [r for r in check_run["records"][start:end] if r["status"] == "failed"]
    assert [r["task"].split(" : ", 1)[-1] for r in failed] == [task]
    for message in messages:
        assert message in failed[0]["result"]["msg"]


# --- filters --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/fsx", "/shared/fsx-scratch", "//data//set/", "/a b/.hidden/\u00fc", "/", "/x:y_z.w"]
)
def test_mount_unit_names_match_systemd_escape(path):
    expected = {
        "/fsx": "fsx.mount",
        "/shared/fsx-scratch": "shared-fsx\\x2dscratch.mount",
        "//data//set/": "data-set.mount",
        "/a b/.hidden/\u00fc": "a\\x20b-.hidden-\\xc3\\xbc.mount",
        "/": "-.mount",
        "/x:y_z.w": "x:y_z.w.mount",
    }[path]
    assert systemd_mount_unit(path) == expected
    if shutil.which("systemd-escape"):
        tool = subprocess.run(["systemd-escape", "--path", "--suffix=mount", path], capture_output=True, text=True)
        assert tool.stdout.strip() == expected
    assert systemd_escape_path(".x") == "\\x2ex"


def test_module_kernels_are_in_version_order_and_one_flavour():
    lines = [
        "lustre-client-modules-6.8.0-1031-aws - x",
        "lustre-client-modules-6.8.0-999-aws - x",
        "lustre-client-modules-aws - metapackage",
        "lustre-client-modules-6.8.0-1008-azure - x",
        "lustre-client-utils - x",
    ]
    assert lustre_client_module_kernels(lines, "aws") == ["6.8.0-999-aws", "6.8.0-1031-aws"]
    assert lustre_client_module_kernels(lines) == ["6.8.0-999-aws", "6.8.0-1008-azure", "6.8.0-1031-aws"]
