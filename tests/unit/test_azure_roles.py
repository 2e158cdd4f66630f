"""The Azure image roles (doca_ofed, blobfuse2, amlfs_client, azure_sku) on this machine.

One `ansible-playbook --check --diff --skip-tags fetch,service` run (a playbook this
module writes into a temporary directory) of the roles' install and configure halves
and of their failure paths, each case in a block whose rescue records which task
failed. Nothing on the host changes: check mode, the tasks that reach a vendor
(tag `fetch`) and enable units (tag `service`) skipped; the probes only read and meet
stand-ins for the tools this machine lacks (dkms, ofed_info, ibstat, modinfo -k),
whose output is reconstructed from the tools' documented formats. The AMLFS kernel
check runs the real apt-cache against a small repository index written here.

The SKU boot program runs for real: with the settings file the role renders, against
an HTTP instance metadata service on 127.0.0.1 that, like Azure's, refuses requests
without `Metadata: true`, with systemctl and modprobe stand-ins that log their calls.
Not run here: any vendor package, an HCA, Azure, a Lustre server (role READMEs).
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import subprocess
import sys
import textwrap
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from playbook_run import ANSIBLE_PLAYBOOK, REPO, playbook_env

# The one version manifest (the roles' defaults read it), as ansible/ loads it.
MANIFEST = REPO / "ansible" / "group_vars" / "all" / "versions.yml"

ROLES = REPO / "roles"
PROGRAM = ROLES / "azure_sku" / "files" / "clusterbake-azure-sku"
KERNEL = "6.8.0-1021-azure"
CLIENT_ID = "0b4c2a5e-8f1d-4c3e-9a7b-2d6e1f0c9b8a"
# The manifest's client (its fixture index below: a build for each of six 6.8 kernels, which 2.17 supports too).
AMLFS = yaml.safe_load(MANIFEST.read_text())["clusterbake_gpu_versions"]["amlfs_client"]["version"]

sys.path.insert(0, str(ROLES / "doca_ofed" / "filter_plugins"))
sys.path.insert(0, str(ROLES / "amlfs_client" / "filter_plugins"))
sys.path.insert(0, str(ROLES / "azure_sku" / "filter_plugins"))
from amlfs_client import amlfs_client_kernel_sort  # noqa: E402
from doca_ofed import doca_ofed_dkms_status, doca_ofed_ibstat_ports  # noqa: E402

# `dkms status` of dkms 3.x after `apt install doca-ofed` on Ubuntu 24.04 (reconstructed).
DKMS_OK = f"""\
iser/25.10.OFED.25.10.1.7.1.1, {KERNEL}, x86_64: installed
isert/25.10.OFED.25.10.1.7.1.1, {KERNEL}, x86_64: installed
kernel-mft-dkms/4.34.0, {KERNEL}, x86_64: installed
knem/1.1.4.90mlnx3, {KERNEL}, x86_64: installed
mlnx-ofed-kernel/25.10.OFED.25.10.1.7.1.1, {KERNEL}, x86_64: installed
srp/25.10.OFED.25.10.1.7.1.1, {KERNEL}, x86_64: installed
"""
# Built for the kernel the builder ran before a newer one was pulled in.
DKMS_OTHER_KERNEL = "mlnx-ofed-kernel/25.10.OFED.25.10.1.7.1.1, 6.8.0-1017-azure, x86_64: installed\n"
# The build failed (no headers): added, never installed.
DKMS_ADDED = "knem/1.1.4.90mlnx3: added\nmlnx-ofed-kernel/25.10.OFED.25.10.1.7.1.1: added\n"

IBSTAT_ACTIVE = """\
CA 'mlx5_ib0'
\tCA type: MT4129
\tNumber of ports: 1
\tFirmware version: 28.39.2048
\tHardware version: 0
\tNode GUID: 0x00155dfffd341a2b
\tSystem image GUID: 0x946dae0300c3a1b2
\tPort 1:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tRate: 400
\t\tBase lid: 117
\t\tLMC: 0
\t\tSM lid: 1
\t\tCapability mask: 0xa651e848
\t\tPort GUID: 0x00155dfffd341a2b
\t\tLink layer: InfiniBand
"""
IBSTAT_DOWN = IBSTAT_ACTIVE.replace("State: Active", "State: Down").replace("LinkUp", "Polling")

PROC_MODULES = """\
mlx5_ib 487424 0 - Live 0x0000000000000000
ib_uverbs 196608 1 mlx5_ib, Live 0x0000000000000000
mlx5_core 2490368 1 mlx5_ib, Live 0x0000000000000000
hv_netvsc 106496 0 - Live 0x0000000000000000
"""
PROC_MODULES_INBOX_ONLY = "mlx5_core 2490368 0 - Live 0x0000000000000000\nhv_netvsc 106496 0 - Live 0x0\n"

FAKES = {
    "dkms": """\
#!/bin/sh
# Stand-in for `dkms status`: prints the file FAKE_DKMS_STATUS names.
[ "$1" = status ] || { echo "dkms: only status here" >&2; exit 2; }
cat "$FAKE_DKMS_STATUS"
""",
    "ofed_info": """\
#!/bin/sh
# Stand-in for `ofed_info -s`.
[ "$1" = -s ] || exit 2
echo "${FAKE_OFED_INFO:-OFED-internal-25.10-1.7.1:}"
""",
    "ibstat": """\
#!/bin/sh
# Stand-in for ibstat: the file FAKE_IBSTAT names, or no HCA as on most VM sizes.
if [ -n "${FAKE_IBSTAT:-}" ]; then cat "$FAKE_IBSTAT"; exit 0; fi
echo "ibpanic: [1234] main: stat of IB device 'mlx5_0' failed: No such file or directory" >&2
exit 255
""",
    "modinfo": """\
#!/bin/sh
# Stand-in for modinfo -k <kernel> --field=<f> <module>: DKMS builds live under updates/dkms.
[ "$1" = -k ] || exit 2
kernel=$2 field=${3#--field=} module=$4
case "$field" in
  filename)
    if [ -n "${FAKE_INBOX:-}" ]; then
      echo "/lib/modules/$kernel/kernel/drivers/net/ethernet/mellanox/mlx5/core/$module.ko.zst"
    else
      echo "/lib/modules/$kernel/updates/dkms/$module.ko.zst"
    fi ;;
  *) echo "modinfo: ERROR: Module $module not found." >&2; exit 1 ;;
esac
""",
}


def amlfs_index(root: Path) -> list[str]:
    """A reconstructed subset of packages.microsoft.com/repos/amlfs-noble, and apt-cache options reading only it."""
    lists = root / "lists"
    lists.mkdir(parents=True)
    (root / "empty.d").mkdir()
    prefix = "packages.microsoft.com_repos_amlfs-noble_dists_noble"
    (lists / f"{prefix}_Release").write_text(
        "Origin: amlfs-noble (test fixture)\nSuite: noble\nCodename: noble\nArchitectures: amd64\nComponents: main\n"
    )
    stanzas = []
    for kernel in (
        "6.8.0-1009-azure",
        "6.8.0-1012-azure",
        "6.8.0-1018-azure",
        KERNEL,
        "6.8.0-1026-azure",
        "6.8.0-999-azure",
    ):
        stanzas.append(
            f"Package: amlfs-lustre-client-{AMLFS}\nVersion: {kernel}\nArchitecture: amd64\nSection: metapackages\n"
            f"Maintainer: fixture\nDepends: lustre-client-{AMLFS}, linux-image-{kernel}, "
            f"kmod-lustre-client-{kernel}-{AMLFS}\n"
            f"Filename: pool/main/a/amlfs-lustre-client-{AMLFS}/amlfs-lustre-client-{AMLFS}_{kernel}_amd64.deb\n"
            f"Size: 1\nDescription: Metapackage for kernel {kernel} (fixture)\n"
        )
    # Another client version for a newer kernel must not count.
    stanzas.append(
        "Package: amlfs-lustre-client-2.17.0-24-gf517bc4\nVersion: 6.8.0-1056-azure\nArchitecture: amd64\n"
        "Maintainer: fixture\nFilename: pool/x.deb\nSize: 1\nDescription: newer client (fixture)\n"
    )
    (lists / f"{prefix}_main_binary-amd64_Packages").write_text("\n".join(stanzas))
    (root / "sources.list").write_text(
        "deb [trusted=yes] https://packages.microsoft.com/repos/amlfs-noble noble main\n"
    )
    options = {
        "Dir::State::Lists": str(lists),
        "Dir::Etc::SourceList": str(root / "sources.list"),
        "Dir::Etc::SourceParts": str(root / "empty.d"),
        "Dir::Etc::Preferences": "/dev/null",
        "Dir::Etc::PreferencesParts": str(root / "empty.d"),
        "Dir::State::status": "/dev/null",
        "Dir::Cache::pkgcache": "",
        "Dir::Cache::srcpkgcache": "",
        "APT::Architecture": "amd64",
    }
    return [arg for key, value in options.items() for arg in ("-o", f"{key}={value}")]


def case(name: str, role: str, tasks_from: str, variables: dict | None = None, env: dict | None = None) -> dict:
    """A block that must fail inside the role; its rescue names the failed task."""
    block: dict = {
        "name": f"Case {name}",
        "block": [
            {
                "name": f"Run {role} {tasks_from}",
                "ansible.builtin.include_role": {"name": role, "tasks_from": tasks_from},
                **({"vars": variables} if variables else {}),
            },
            {"name": "Case did not fail", "ansible.builtin.fail": {"msg": f"case {name} did not fail"}},
        ],
        "rescue": [
            {
                "name": f"Case {name} failed as expected",
                "ansible.builtin.debug": {"msg": "{{ ansible_failed_task.name }}"},
            }
        ],
    }
    if env:
        block["environment"] = env
    return block


def blobfuse_mounts() -> list[dict]:
    return [
        {"account": "cbtrainingdata", "container": "datasets", "path": "/data/blob", "read_only": True},
        {
            "account": "cbcheckpoints",
            "container": "ckpt-2026",
            "path": "/shared/ckpt/",
            "cache_size_mb": 51200,
            "options": {"libfuse": {"attribute-expiration-sec": 300}},
        },
    ]


@pytest.fixture(scope="module")
def azure_run(tmp_path_factory):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.fail("ansible-playbook is not in the venv: run make venv")
    if subprocess.run(["apt-cache", "--version"], capture_output=True).returncode != 0:
        pytest.fail("the AMLFS kernel check needs apt-cache (Debian package apt)")
    tmp = tmp_path_factory.mktemp("azure_roles")
    fake_bin = tmp / "bin"
    fake_bin.mkdir()
    for name, script in FAKES.items():
        (fake_bin / name).write_text(script)
        (fake_bin / name).chmod(0o755)
    data = tmp / "data"
    data.mkdir()
    for name, text in {
        "dkms-ok": DKMS_OK,
        "dkms-other-kernel": DKMS_OTHER_KERNEL,
        "dkms-added": DKMS_ADDED,
        "ibstat-active": IBSTAT_ACTIVE,
        "ibstat-down": IBSTAT_DOWN,
        "modules": PROC_MODULES,
        "modules-inbox": PROC_MODULES_INBOX_ONLY,
    }.items():
        (data / name).write_text(text)
    apt_options = amlfs_index(tmp / "amlfs-repo")

    doca_vars = {
        "doca_ofed_kernel": KERNEL,
        "doca_ofed_distro_tag": "ubuntu2404",
        "doca_ofed_proc_modules": str(data / "modules"),
        "doca_ofed_validation_file": "/opt/clusterbake/doca-ofed.json",
    }
    amlfs_vars = {"amlfs_client_kernel": KERNEL, "amlfs_client_apt_cache_options": apt_options}
    ok_env = {"FAKE_DKMS_STATUS": str(data / "dkms-ok")}
    plays = [
        {
            "name": "Install half of the Azure roles, as ansible/image.yml would run them",
            "hosts": "azure-builder",
            "vars_files": [str(MANIFEST)],
            "gather_facts": False,
            "environment": ok_env,
            "vars": {**doca_vars, **amlfs_vars},
            "tasks": [
                {"name": f"Install {role}", "ansible.builtin.import_role": {"name": role, "tasks_from": "install"}}
                for role in ("amlfs_client", "doca_ofed", "blobfuse2", "azure_sku")
            ]
            + [
                {
                    "name": "Keep the no-HCA record",
                    "ansible.builtin.set_fact": {"doca_no_hca": "{{ doca_ofed_versions }}"},
                }
            ],
        },
        {
            "name": "A builder with an HCA whose link is up",
            "hosts": "azure-builder",
            "vars_files": [str(MANIFEST)],
            "gather_facts": False,
            "environment": {**ok_env, "FAKE_IBSTAT": str(data / "ibstat-active")},
            "vars": {**doca_vars, "doca_ofed_require_link": True},
            "tasks": [
                {"name": "Install doca_ofed with an HCA", "ansible.builtin.import_role": {"name": "doca_ofed"}},
                {"name": "Keep the HCA record", "ansible.builtin.set_fact": {"doca_hca": "{{ doca_ofed_versions }}"}},
            ],
        },
        {
            "name": "Configure half, as ansible/tasks/join.yml would run it",
            "hosts": "azure-builder",
            "vars_files": [str(MANIFEST)],
            "gather_facts": False,
            "vars": {
                "blobfuse2_mounts": blobfuse_mounts(),
                "blobfuse2_identity_client_id": CLIENT_ID,
                "blobfuse2_cache_dir": "/mnt/resource/blobfuse2",
                "amlfs_client_mounts": [
                    {"mgs_address": "10.42.1.5", "path": "/shared"},
                    {"mgs_address": "10.42.2.6", "fs_name": "lustrefs", "path": "/scratch-fs", "options": ["ro"]},
                ],
            },
            "tasks": [
                {
                    "name": "Describe the blobfuse2 mounts",
                    "ansible.builtin.import_role": {"name": "blobfuse2", "tasks_from": "join_part"},
                },
                {
                    "name": "Describe the AMLFS mounts",
                    "ansible.builtin.import_role": {"name": "amlfs_client", "tasks_from": "join_part"},
                },
            ],
        },
        {
            "name": "Failure paths",
            "hosts": "azure-builder",
            "vars_files": [str(MANIFEST)],
            "gather_facts": False,
            "vars": {**doca_vars, **amlfs_vars},
            "environment": ok_env,
            "tasks": [
                case(
                    "doca-dkms-other-kernel",
                    "doca_ofed",
                    "install",
                    env={"FAKE_DKMS_STATUS": str(data / "dkms-other-kernel")},
                ),
                case("doca-dkms-not-built", "doca_ofed", "install", env={"FAKE_DKMS_STATUS": str(data / "dkms-added")}),
                case("doca-unverified", "doca_ofed", "install", {"doca_ofed_distro_tag": "ubuntu2204"}),
                case("doca-no-package", "doca_ofed", "install", {"doca_ofed_distro_tag": ""}),
                case(
                    "doca-other-ofed", "doca_ofed", "install", env={"FAKE_OFED_INFO": "MLNX_OFED_LINUX-24.01-0.3.3.1:"}
                ),
                case("doca-inbox-modules", "doca_ofed", "install", env={"FAKE_INBOX": "1"}),
                case(
                    "doca-hca-not-loaded",
                    "doca_ofed",
                    "install",
                    {"doca_ofed_proc_modules": str(data / "modules-inbox")},
                    env={"FAKE_IBSTAT": str(data / "ibstat-active")},
                ),
                case(
                    "doca-link-down",
                    "doca_ofed",
                    "install",
                    {"doca_ofed_require_link": True},
                    env={"FAKE_IBSTAT": str(data / "ibstat-down")},
                ),
                case("doca-bad-profile", "doca_ofed", "install", {"doca_ofed_profile": "doca-everything"}),
                case(
                    "blobfuse2-no-container",
                    "blobfuse2",
                    "join_part",
                    {
                        "blobfuse2_mounts": [{"account": "cbdata", "path": "/data"}],
                        "blobfuse2_identity_client_id": CLIENT_ID,
                    },
                ),
                case(
                    "blobfuse2-bad-account",
                    "blobfuse2",
                    "join_part",
                    {
                        "blobfuse2_mounts": [{"account": "CB_Data", "container": "data", "path": "/data"}],
                        "blobfuse2_identity_client_id": CLIENT_ID,
                    },
                ),
                case(
                    "blobfuse2-no-identity",
                    "blobfuse2",
                    "join_part",
                    {"blobfuse2_mounts": [{"account": "cbdata", "container": "data", "path": "/data"}]},
                ),
                case(
                    "blobfuse2-cache-in-mount",
                    "blobfuse2",
                    "join_part",
                    {
                        "blobfuse2_mounts": [{"account": "cbdata", "container": "data", "path": "/mnt"}],
                        "blobfuse2_identity_client_id": CLIENT_ID,
                        "blobfuse2_cache_dir": "/mnt/blobfuse2",
                    },
                ),
                case("amlfs-no-kernel", "amlfs_client", "install", {"amlfs_client_kernel": "6.8.0-1099-azure"}),
                case(
                    "amlfs-ib-interface",
                    "amlfs_client",
                    "join_part",
                    {
                        "amlfs_client_lnet_interface": "ib0",
                        "amlfs_client_mounts": [{"mgs_address": "10.0.0.4", "path": "/lustre"}],
                    },
                ),
                case(
                    "amlfs-mgs-hostname",
                    "amlfs_client",
                    "join_part",
                    {"amlfs_client_mounts": [{"mgs_address": "amlfs.example.com", "path": "/lustre"}]},
                ),
                case(
                    "amlfs-no-path", "amlfs_client", "join_part", {"amlfs_client_mounts": [{"mgs_address": "10.0.0.4"}]}
                ),
                case(
                    "sku-unknown-topology",
                    "azure_sku",
                    "install",
                    {"azure_sku_profiles": [{"name": "ndv6", "match": ["standard_nd128*"], "topology": "ndv6"}]},
                ),
                case(
                    "sku-no-match",
                    "azure_sku",
                    "install",
                    {"azure_sku_profiles": [{"name": "ndv5", "topology": "ndv5"}]},
                ),
            ],
        },
    ]
    playbook = tmp / "azure_check.yml"
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False, width=200))
    inventory = tmp / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {
                        "azure-builder": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                    },
                    "children": {
                        g: {"hosts": {"azure-builder": {}}} for g in ("azure", "ib", "doca_ofed", "blobfuse2", "amlfs")
                    },
                }
            }
        )
    )
    record = tmp / "record.json"
    env = playbook_env(tmp, fake_bin, record)
    proc = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "--check", "--diff", "--skip-tags=fetch,service", "-i", str(inventory), str(playbook)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-3000:]
    return {"records": json.loads(record.read_text()), "stdout": proc.stdout, "tmp": tmp}


def records(run, task: str) -> list[dict]:
    found = [r for r in run["records"] if r["task"].endswith(task)]
    assert found, f"no task {task!r} ran"
    return found


def fact(run, task: str, name: str):
    return records(run, task)[0]["result"]["ansible_facts"][name]


def rendered(run, task: str, index: int = 0, item=None) -> str:
    """What a file task of the first play would write (its diff in check mode)."""
    found = records(run, task)[index]
    assert found["status"] == "ok", found
    if item is not None:
        (result,) = [r for r in found["result"]["results"] if r["item"] == item]
    else:
        result = found["result"]
    diff = result["diff"]
    return (diff[0] if isinstance(diff, list) else diff)["after"]


def files_of(part: dict, key: str = "files") -> dict[str, tuple[str, str]]:
    return {f["path"]: (base64.b64decode(f["content_b64"]).decode(), f["mode"]) for f in part[key]}


# --- doca_ofed --------------------------------------------------------------------------------


def test_doca_gate_and_validation_pass_with_the_modules_built_for_the_kernel(azure_run):
    gate = records(azure_run, "Check that DKMS installed the DOCA-OFED modules for the kernel")[0]
    assert gate["status"] == "ok"
    assert gate["result"]["msg"] == f"DKMS installed mlnx-ofed-kernel for {KERNEL}"
    for task in (
        "Check that ofed_info reports the pinned OFED release",
        "Check that the kernel modules are DKMS's builds for the kernel",
    ):
        assert records(azure_run, task)[0]["status"] == "ok", task


def test_doca_without_an_hca_reports_and_still_builds(azure_run):
    report = records(azure_run, "Report the HCA ports")[0]["result"]["msg"]
    assert report.startswith("No HCA on the builder (ibstat: ibpanic:")
    assert "the image is still built" in report
    assert records(azure_run, "Check the HCA links and the loaded modules (only with an HCA)")[0]["status"] == "skipped"
    record = fact(azure_run, "Keep the no-HCA record", "doca_no_hca")
    assert record["hca"] is False and record["ports"] == []
    assert record["ofed"] == "OFED-internal-25.10-1.7.1"
    assert record["doca"] == "3.2.0-125000"
    assert record["host_package"] == "doca-host_3.2.0-125000-25.10-ubuntu2404_amd64.deb"
    assert record["host_package_sha256"] == "5a72f90c39994893b3bcafd07ac3112b5a53076d484ea1051075e6ded70fd666"
    assert [e["module"] for e in record["dkms"]] == [
        "iser",
        "isert",
        "kernel-mft-dkms",
        "knem",
        "mlnx-ofed-kernel",
        "srp",
    ]
    assert record["modules"]["mlx5_ib"] == f"/lib/modules/{KERNEL}/updates/dkms/mlx5_ib.ko.zst"
    assert record["loaded"] == ["mlx5_core", "mlx5_ib", "ib_uverbs"]


def test_doca_with_an_active_hca_records_the_port(azure_run):
    checks = records(azure_run, "Check the HCA links and the loaded modules (only with an HCA)")
    assert checks[1]["status"] == "ok"
    record = fact(azure_run, "Keep the HCA record", "doca_hca")
    assert record["hca"] is True
    assert record["ports"] == [
        {
            "ca": "mlx5_ib0",
            "port": "1",
            "state": "Active",
            "physical_state": "LinkUp",
            "rate": "400",
            "link_layer": "InfiniBand",
        }
    ]
    assert "mlx5_ib0 port 1: Active / LinkUp 400" in records(azure_run, "Report the HCA ports")[1]["result"]["msg"]


def test_doca_writes_its_validation_record_and_keeps_distro_dkms(azure_run):
    written = json.loads(rendered(azure_run, "Write the validation record"))
    assert written == fact(azure_run, "Keep the no-HCA record", "doca_no_hca")
    record = records(azure_run, "Write the validation record")[0]
    assert record["result"]["invocation"]["module_args"]["dest"] == "/opt/clusterbake/doca-ofed.json"
    pin = rendered(azure_run, "Keep the distribution's dkms")
    assert "Package: dkms\nPin: release l=DOCA-HOST*\nPin-Priority: -1\n" in pin
    dropin = rendered(azure_run, "Restart openibd on failure, after udev has settled")
    assert "Restart=on-failure" in dropin and "After=systemd-udev-settle.service" in dropin
    dest = records(azure_run, "Restart openibd on failure, after udev has settled")[0]["result"]["invocation"][
        "module_args"
    ]["dest"]
    assert dest == "/etc/systemd/system/openibd.service.d/clusterbake.conf"
    # An openibd restart unloads nvidia_peermem with the IB stack: it is loaded again (hardware review item 4).
    assert "ExecStartPost=-/sbin/modprobe nvidia_peermem" in dropin


def test_the_image_installs_doca_ofed_before_the_nvidia_driver():
    """nvidia_peermem is built by the driver's DKMS against DOCA's ib_core only when DOCA is there first;
    built before, it loads with EINVAL (hardware review item 4; azhpc-images' order)."""
    (play,) = yaml.safe_load((REPO / "ansible" / "image.yml").read_text())
    roles = [t["ansible.builtin.import_role"]["name"] for t in play["tasks"] if "ansible.builtin.import_role" in t]
    assert roles.index("doca_ofed") < roles.index("nvidia_driver") < roles.index("cuda_toolkit")


def test_check_mode_skipped_every_download_install_and_service_task(azure_run):
    ran = {r["task"].split(" : ", 1)[-1] for r in azure_run["records"]}
    for fetching in (
        "Download the DOCA-Host package",
        "Install the kernel headers and the DOCA profile (DKMS builds its modules)",
        "Enable openibd (loads the DOCA driver stack at boot)",
        "Install FUSE 3 and blobfuse2",
        "Install the AMLFS client for the kernel (client, kmod, kernel in lockstep)",
        "Enable it (every boot, before slurmd)",
    ):
        assert fetching not in ran, fetching


# --- blobfuse2 ---------------------------------------------------------------------------------


def test_blobfuse2_config_files_use_the_managed_identity_and_the_local_disk(azure_run):
    part = fact(azure_run, "Describe the blobfuse2 mounts for the join bundle", "blobfuse2_join_part")
    assert part["services"] == ["clusterbake-blobfuse2-data-blob.service", "clusterbake-blobfuse2-shared-ckpt.service"]
    files = files_of(part)
    content, mode = files["/etc/blobfuse2/data-blob.yaml"]
    assert mode == "0600"
    assert content.startswith("# Managed by clusterbake (role blobfuse2)")
    config = yaml.safe_load(content)
    assert config["components"] == ["libfuse", "file_cache", "attr_cache", "azstorage"]
    assert config["azstorage"] == {
        "type": "block",
        "account-name": "cbtrainingdata",
        "container": "datasets",
        "endpoint": "https://cbtrainingdata.blob.core.windows.net",
        "mode": "msi",
        "appid": CLIENT_ID,
    }
    assert config["read-only"] is True and config["allow-other"] is True
    assert config["file_cache"] == {
        "path": "/mnt/resource/blobfuse2/data-blob",
        "timeout-sec": 120,
        "max-size-mb": 10240,
    }
    ckpt = yaml.safe_load(files["/etc/blobfuse2/shared-ckpt.yaml"][0])
    assert files["/etc/blobfuse2/shared-ckpt.yaml"][1] == "0600"
    assert ckpt["read-only"] is False
    assert ckpt["file_cache"]["max-size-mb"] == 51200
    # Extra settings merge into blobfuse2's sections instead of replacing them.
    assert ckpt["libfuse"] == {
        "attribute-expiration-sec": 300,
        "entry-expiration-sec": 120,
        "negative-entry-expiration-sec": 240,
    }
    assert ckpt["azstorage"]["container"] == "ckpt-2026"


def test_blobfuse2_units_mount_with_their_config(azure_run):
    part = fact(azure_run, "Describe the blobfuse2 mounts for the join bundle", "blobfuse2_join_part")
    unit, mode = files_of(part)["/etc/systemd/system/clusterbake-blobfuse2-data-blob.service"]
    assert mode == "0644"
    assert (
        "ExecStart=/usr/bin/blobfuse2 mount /data/blob --config-file=/etc/blobfuse2/data-blob.yaml --foreground=true\n"
        in unit
    )
    assert "ExecStop=/usr/bin/fusermount3 -u /data/blob\n" in unit
    assert "ExecStartPre=/usr/bin/mkdir -p /data/blob /mnt/resource/blobfuse2/data-blob\n" in unit
    assert "RequiresMountsFor=/mnt/resource/blobfuse2\n" in unit
    assert "After=network-online.target local-fs.target\n" in unit
    assert "WantedBy=remote-fs.target\n" in unit


def test_blobfuse2_lets_users_read_the_mounts(azure_run):
    assert (
        "user_allow_other" in rendered(azure_run, "Let FUSE mounts allow other users (user_allow_other)").splitlines()
    )


# --- amlfs_client --------------------------------------------------------------------------------


def test_amlfs_kernel_check_finds_the_kernels_build(azure_run):
    check = records(azure_run, "Check that the repository has the AMLFS client for the kernel")[0]
    assert check["status"] == "ok"
    madison = records(azure_run, "List the kernels the repository has the AMLFS client for")[0]["result"]["stdout"]
    assert f"amlfs-lustre-client-{AMLFS} | {KERNEL} |" in madison


def test_amlfs_lnet_over_tcp_and_mount_units(azure_run):
    part = fact(azure_run, "Describe the AMLFS mounts for the join bundle", "amlfs_client_join_part")
    # All in the bundle's mounts, the LNet settings first: written before any mount starts (mount.lustre loads
    # lnet with them), and mounted before the users are created, like every shared file system.
    assert set(part) == {"mounts"}
    assert [m["path"] for m in part["mounts"]] == [
        "/etc/modprobe.d/lnet.conf",
        "/etc/systemd/system/shared.mount",
        "/etc/systemd/system/scratch\\x2dfs.mount",
    ]
    files = files_of(part, "mounts")
    lnet, mode = files["/etc/modprobe.d/lnet.conf"]
    assert mode == "0644"
    assert [line for line in lnet.splitlines() if not line.startswith("#")] == ['options lnet networks="tcp(eth0)"']
    shared = files["/etc/systemd/system/shared.mount"][0]
    assert "What=10.42.1.5@tcp:/lustrefs\n" in shared
    assert "Where=/shared\n" in shared
    assert "Type=lustre\n" in shared
    assert "Options=noatime,flock,_netdev\n" in shared
    scratch = files["/etc/systemd/system/scratch\\x2dfs.mount"][0]
    assert "What=10.42.2.6@tcp:/lustrefs\n" in scratch
    assert "Options=noatime,flock,_netdev,ro\n" in scratch


# --- azure_sku: the role's files ---------------------------------------------------------------------

# Per NUMA node: CPU affinity and the (GPU, HCA) PCI bus ids behind each PCIe switch, as in the
# topology files Azure ships (azhpc-images topology/ndv5-topo.xml at d21d11e, ndv4-topo.xml at
# 4a4565a). ND H100/H200 v5: 2 sockets x 48 vCPUs, one GPU and one 400G HCA per switch.
VENDOR = {
    "ndv5": {
        "cpu": ("GenuineIntel", "6", "143"),
        "link_speed": "32.0 GT/s PCIe",
        "numa": [
            ("00000000,0000ffff,ffffffff", [["0001", "0101"], ["0002", "0102"], ["0003", "0103"], ["0008", "0104"]]),
            ("ffffffff,ffff0000,00000000", [["0009", "0105"], ["000a", "0106"], ["000b", "0107"], ["000c", "0108"]]),
        ],
    },
    "ndv4": {
        "cpu": ("AuthenticAMD", "23", "49"),
        "link_speed": "16 GT/s",
        "numa": [
            ("00000000,00000000,00ffffff", [["0003", "0103", "0004", "0104"]]),
            ("00000000,0000ffff,ff000000", [["0001", "0101", "0002", "0102"]]),
            ("000000ff,ffff0000,00000000", [["000d", "0107", "000e", "0108"]]),
            ("ffffff00,00000000,00000000", [["000b", "0105", "000c", "0106"]]),
        ],
    },
}


@pytest.mark.parametrize("name", sorted(VENDOR))
def test_topology_files_match_azures(azure_run, name):
    xml = rendered(azure_run, "Write the NCCL topology files", item=name)
    system = ET.fromstring(xml)
    assert system.tag == "system" and system.get("version") == "1"
    expected = VENDOR[name]
    cpus = system.findall("cpu")
    assert [c.get("numaid") for c in cpus] == [str(i) for i in range(len(expected["numa"]))]
    gpus = nics = 0
    for cpu, (affinity, switches) in zip(cpus, expected["numa"], strict=True):
        assert cpu.get("affinity") == affinity
        assert (cpu.get("vendor"), cpu.get("familyid"), cpu.get("modelid")) == expected["cpu"]
        assert cpu.get("arch") == "x86_64"
        bridges = cpu.findall("pci")
        assert [b.get("class") for b in bridges] == ["0x060400"] * len(switches)
        for bridge, devices in zip(bridges, switches, strict=True):
            children = bridge.findall("pci")
            assert [c.get("busid") for c in children] == [f"{d}:00:00.0" for d in devices]
            for child in children:
                assert child.get("link_speed") == expected["link_speed"] and child.get("link_width") == "16"
                is_nic = child.get("busid").startswith("01")
                assert child.get("class") == ("0x020700" if is_nic else "0x030200")
                nics += is_nic
                gpus += not is_nic
    assert (gpus, nics) == (8, 8)
    # Every NCCL_TOPO_FILE the settings name is a file the role writes.
    assert xml.startswith("<!-- Managed by clusterbake")


def test_sku_settings_and_unit(azure_run):
    settings = json.loads(rendered(azure_run, "Write the program's settings"))
    assert settings["imds_url"] == "http://169.254.169.254"
    assert settings["nccl_conf"] == "/etc/nccl.conf"
    ndv5, ndv4 = settings["profiles"]
    assert ndv5 == {
        "name": "ndv5",
        "match": ["standard_nd96is*_h[12]00_v5"],
        "topology_file": "/opt/microsoft/ndv5-topo.xml",
        "topology_link": "/opt/microsoft/ndv5/topo.xml",
        "nccl": {
            "NCCL_IB_PCI_RELAXED_ORDERING": "1",
            "NCCL_IGNORE_CPU_AFFINITY": "1",
            "NCCL_TOPO_FILE": "/opt/microsoft/ndv5/topo.xml",
        },
        "fabricmanager": True,
        "peermem": True,
        "infiniband": True,
    }
    assert settings["infiniband_class"] == "/sys/class/infiniband" and ndv4["infiniband"] is True
    assert ndv4["nccl"] == {"NCCL_IB_PCI_RELAXED_ORDERING": "1", "NCCL_TOPO_FILE": "/opt/microsoft/ndv4/topo.xml"}
    unit = rendered(azure_run, "Install its unit")
    assert "ExecStart=/usr/local/sbin/clusterbake-azure-sku --config /etc/clusterbake/azure-sku.json\n" in unit
    # Not ordered after the fabric manager (a cycle through multi-user.target, hardware review item 12).
    assert "After=network-online.target openibd.service\n" in unit and "After=nvidia-fabricmanager" not in unit
    assert "Before=slurmd.service\n" in unit
    assert "TimeoutStartSec=480\n" in unit


# --- failure paths ----------------------------------------------------------------------------------

FAILURES = {
    "doca-dkms-other-kernel": (
        "Check that DKMS installed the DOCA-OFED modules for the kernel",
        [
            f"DKMS has not installed mlnx-ofed-kernel for kernel {KERNEL}",
            "dkms status has mlnx-ofed-kernel/25.10.OFED.25.10.1.7.1.1 installed for 6.8.0-1017-azure",
            f"dkms autoinstall -k {KERNEL}",
        ],
    ),
    "doca-dkms-not-built": (
        "Check that DKMS installed the DOCA-OFED modules for the kernel",
        [
            f"DKMS has not installed mlnx-ofed-kernel for kernel {KERNEL}",
            "mlnx-ofed-kernel/25.10.OFED.25.10.1.7.1.1 added)",
        ],
    ),
    "doca-unverified": (
        "Check that the host package can be verified before it is installed",
        ["doca-host_3.2.0-125000-25.10-ubuntu2204_amd64.deb would be installed unverified", "no sha256 for ubuntu2204"],
    ),
    "doca-no-package": (
        "Check that NVIDIA publishes a DOCA-Host package for this OS",
        ["No DOCA-Host package is known for"],
    ),
    "doca-other-ofed": (
        "Check that ofed_info reports the pinned OFED release",
        ["ofed_info -s reports 'MLNX_OFED_LINUX-24.01-0.3.3.1:', DOCA 3.2.0 ships OFED 25.10"],
    ),
    "doca-inbox-modules": (
        "Check that the kernel modules are DKMS's builds for the kernel",
        [f"For kernel {KERNEL}, mlx5_core, mlx5_ib, ib_uverbs resolve(s) to", "the inbox driver would be loaded"],
    ),
    "doca-hca-not-loaded": (
        "Check the HCA links and the loaded modules (only with an HCA)",
        ["The builder has an HCA but mlx5_ib, ib_uverbs is not loaded"],
    ),
    "doca-link-down": (
        "Check the HCA links and the loaded modules (only with an HCA)",
        ["Ports not Active/LinkUp: mlx5_ib0 Down (doca_ofed_require_link)"],
    ),
    "doca-bad-profile": ("Validating arguments against arg spec 'install'", ["doca_ofed_profile", "doca-everything"]),
    "blobfuse2-no-container": (
        "Validating arguments against arg spec 'join_part'",
        ["missing required arguments: container", "blobfuse2_mounts"],
    ),
    "blobfuse2-bad-account": ("Check the blobfuse2 mounts", ["blobfuse2_mounts needs in each entry an account (3-24"]),
    "blobfuse2-no-identity": (
        "Check the managed identity and the cache directory",
        ["blobfuse2_identity_client_id must be the client id (a GUID)"],
    ),
    "blobfuse2-cache-in-mount": (
        "Check the managed identity and the cache directory",
        ["blobfuse2_cache_dir ('/mnt/blobfuse2') an absolute path on the local disk, outside every mount point"],
    ),
    "amlfs-no-kernel": (
        "Check that the repository has the AMLFS client for the kernel",
        [
            "No AMLFS client for kernel 6.8.0-1099-azure",
            f"no amlfs-lustre-client-{AMLFS}=6.8.0-1099-azure",
            # Version order (999 before 1009), not the other client version's kernel.
            "for 6 azure kernel(s), the newest: 6.8.0-1009-azure, 6.8.0-1012-azure, 6.8.0-1018-azure, "
            "6.8.0-1021-azure, 6.8.0-1026-azure.",
        ],
    ),
    "amlfs-ib-interface": (
        "Check the AMLFS mounts and the LNet interface",
        ["amlfs_client_lnet_interface ('ib0') must be the VM's Ethernet interface"],
    ),
    "amlfs-mgs-hostname": (
        "Check the AMLFS mounts and the LNet interface",
        ["amlfs.example.com", "the MGS IPv4 address"],
    ),
    "amlfs-no-path": (
        "Validating arguments against arg spec 'join_part'",
        ["missing required arguments: path", "amlfs_client_mounts"],
    ),
    "sku-unknown-topology": (
        "Check the SKU profiles",
        ["a topology of azure_sku_topologies (ndv5, ndv4)", "ndv6 -> ndv6"],
    ),
    "sku-no-match": (
        "Validating arguments against arg spec 'install'",
        ["missing required arguments: match", "azure_sku_profiles"],
    ),
}


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_failure_paths_stop_with_a_clear_message(azure_run, name):
    task, messages = FAILURES[name]
    tasks = [r["task"] for r in azure_run["records"]]
    end = tasks.index(f"Case {name} failed as expected")
    start = max([i for i, t in enumerate(tasks[:end]) if t.endswith("failed as expected")], default=0)
    failed = [r for r in azure_run["records"][start:end] if r["status"] == "failed"]
    assert len(failed) == 1, [r["task"] for r in failed]
    assert task in failed[0]["task"]
    for message in messages:
        assert message in failed[0]["result"]["msg"], failed[0]["result"]["msg"]


# --- the filters ----------------------------------------------------------------------------------------


def test_dkms_status_of_dkms_2_and_3():
    lines = [
        "mlnx-ofed-kernel/25.10.OFED.25.10.1.7.1.1, 6.8.0-1021-azure, x86_64: installed",
        "mlnx-ofed-kernel, 5.8, 5.15.0-1029-azure, x86_64: installed (original_module exists)",
        "knem/1.1.4.90mlnx3: added",
        "Error! Could not locate dkms.conf file.",
    ]
    assert doca_ofed_dkms_status(lines) == [
        {
            "module": "mlnx-ofed-kernel",
            "version": "25.10.OFED.25.10.1.7.1.1",
            "kernel": KERNEL,
            "arch": "x86_64",
            "status": "installed",
        },
        {
            "module": "mlnx-ofed-kernel",
            "version": "5.8",
            "kernel": "5.15.0-1029-azure",
            "arch": "x86_64",
            "status": "installed (original_module exists)",
        },
        {"module": "knem", "version": "1.1.4.90mlnx3", "kernel": "", "arch": "", "status": "added"},
    ]


def test_ibstat_ports_of_two_cas():
    text = IBSTAT_ACTIVE + IBSTAT_DOWN.replace("mlx5_ib0", "mlx5_ib1")
    assert [(p["ca"], p["state"], p["physical_state"]) for p in doca_ofed_ibstat_ports(text)] == [
        ("mlx5_ib0", "Active", "LinkUp"),
        ("mlx5_ib1", "Down", "Polling"),
    ]
    assert doca_ofed_ibstat_ports("") == []


def test_kernel_sort_is_numeric():
    assert amlfs_client_kernel_sort(
        ["6.8.0-1021-azure", "6.8.0-999-azure", "6.8.0-1021-azure", "6.11.0-1002-azure"]
    ) == [
        "6.8.0-999-azure",
        "6.8.0-1021-azure",
        "6.11.0-1002-azure",
    ]


# --- azure_sku: the boot program, run for real ---------------------------------------------------------


class _Imds(http.server.BaseHTTPRequestHandler):
    vm_size = ""

    def do_GET(self):
        if self.headers.get("Metadata") != "true":
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": "Bad request. Required metadata header not specified"}')
            return
        if not self.path.startswith("/metadata/instance/compute?api-version="):
            self.send_response(404)
            self.end_headers()
            return
        body = json.dumps({"vmSize": type(self).vm_size, "location": "eastus"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def imds():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Imds)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


@pytest.fixture
def node(tmp_path, azure_run):
    """A node's root with what the image carries (the role's rendered settings and topology files)
    and stand-ins for systemctl and modprobe that log their calls."""
    root = tmp_path / "root"
    settings = json.loads(rendered(azure_run, "Write the program's settings"))
    settings["fabricmanager_timeout"] = 6
    settings["imds_timeout"] = 3
    (root / "etc/clusterbake").mkdir(parents=True)
    (root / "etc/clusterbake/azure-sku.json").write_text(json.dumps(settings))
    (root / "opt/microsoft").mkdir(parents=True)
    for name in VENDOR:
        (root / f"opt/microsoft/{name}-topo.xml").write_text(
            rendered(azure_run, "Write the NCCL topology files", item=name)
        )
    # ND v5's RDMA devices as DOCA-OFED names them: eight InfiniBand HCAs, and accelerated networking's
    # Ethernet function (no azhpc-images rename to mlx5_ib0..7 / mlx5_an0).
    for index in range(9):
        port = root / f"sys/class/infiniband/mlx5_{index}/ports/1"
        port.mkdir(parents=True)
        (port / "link_layer").write_text("Ethernet\n" if index == 4 else "InfiniBand\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool, rc_var in (("systemctl", "FAKE_FM_INACTIVE"), ("modprobe", "FAKE_MODPROBE_FAIL")):
        (bin_dir / tool).write_text(
            f'#!/bin/sh\necho "{tool} $*" >> {log}\n'
            f'if [ -n "${{{rc_var}:-}}" ]; then echo "{tool}: failed ($*)" >&2; echo inactive; exit 3; fi\n'
            "echo active\n"
        )
        (bin_dir / tool).chmod(0o755)
    return {"root": root, "bin": bin_dir, "log": log}


def run_program(node, imds, vm_size: str, **env):
    _Imds.vm_size = vm_size
    return subprocess.run(
        [
            sys.executable,
            str(PROGRAM),
            "--root",
            str(node["root"]),
            "--config",
            "/etc/clusterbake/azure-sku.json",
            "--imds-url",
            f"http://127.0.0.1:{imds.server_address[1]}",
        ],
        env={**os.environ, "PATH": f"{node['bin']}:{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def calls(node) -> list[str]:
    return node["log"].read_text().splitlines() if node["log"].exists() else []


@pytest.mark.parametrize("vm_size", ["Standard_ND96isr_H100_v5", "Standard_ND96isr_H200_v5"])
def test_nd_v5_gets_the_v5_topology_nccl_conf_fabric_manager_and_peermem(node, imds, vm_size):
    proc = run_program(node, imds, vm_size)
    assert proc.returncode == 0, proc.stderr
    root = node["root"]
    conf = (root / "etc/nccl.conf").read_text().splitlines()
    assert conf[0].startswith(f"# Managed by clusterbake-azure-sku for {vm_size} (profile ndv5)")
    # NCCL_IB_HCA names exactly the node's InfiniBand HCAs (a prefix like mlx5_ib matched none of them,
    # and NCCL trained over TCP: hardware review item 3), in natural order; mlx5_4 is Ethernet.
    assert conf[1:] == [
        "NCCL_IB_PCI_RELAXED_ORDERING=1",
        "NCCL_IGNORE_CPU_AFFINITY=1",
        "NCCL_TOPO_FILE=/opt/microsoft/ndv5/topo.xml",
        "NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_5,mlx5_6,mlx5_7,mlx5_8",
    ]
    assert os.readlink(root / "opt/microsoft/ndv5/topo.xml") == "/opt/microsoft/ndv5-topo.xml"
    assert os.readlink(root / "etc/clusterbake/nccl-topo.xml") == "/opt/microsoft/ndv5/topo.xml"
    assert calls(node) == ["systemctl is-active nvidia-fabricmanager", "modprobe nvidia_peermem"]
    state = json.loads((root / "run/clusterbake/azure-sku.json").read_text())
    assert (state["vm_size"], state["profile"], state["topology_file"]) == (
        vm_size,
        "ndv5",
        "/opt/microsoft/ndv5-topo.xml",
    )


def test_nd_a100_v4_gets_the_v4_topology(node, imds):
    proc = run_program(node, imds, "Standard_ND96asr_v4")
    assert proc.returncode == 0, proc.stderr
    conf = (node["root"] / "etc/nccl.conf").read_text().splitlines()[1:]
    assert conf == [
        "NCCL_IB_PCI_RELAXED_ORDERING=1",
        "NCCL_TOPO_FILE=/opt/microsoft/ndv4/topo.xml",
        "NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_5,mlx5_6,mlx5_7,mlx5_8",
    ]
    assert os.readlink(node["root"] / "opt/microsoft/ndv4/topo.xml") == "/opt/microsoft/ndv4-topo.xml"
    assert calls(node) == ["systemctl is-active nvidia-fabricmanager", "modprobe nvidia_peermem"]


def test_other_sizes_get_nothing_and_lose_an_earlier_sizes_settings(node, imds):
    assert run_program(node, imds, "Standard_ND96isr_H100_v5").returncode == 0
    proc = run_program(node, imds, "Standard_D4s_v5")
    assert proc.returncode == 0, proc.stderr
    assert "no SKU customisation for Standard_D4s_v5" in proc.stdout
    assert not (node["root"] / "etc/nccl.conf").exists()
    assert not (node["root"] / "etc/clusterbake/nccl-topo.xml").is_symlink()
    state = json.loads((node["root"] / "run/clusterbake/azure-sku.json").read_text())
    assert state == {
        "vm_size": "Standard_D4s_v5",
        "profile": None,
        "removed": ["/etc/nccl.conf", "/etc/clusterbake/nccl-topo.xml"],
    }
    # Only the two calls of the first (ND v5) run.
    assert len(calls(node)) == 2


def test_an_nccl_conf_written_by_someone_else_is_left_alone(node, imds):
    (node["root"] / "etc/nccl.conf").write_text("NCCL_DEBUG=WARN\n")
    assert run_program(node, imds, "Standard_E8s_v5").returncode == 0
    assert (node["root"] / "etc/nccl.conf").read_text() == "NCCL_DEBUG=WARN\n"


def test_an_inactive_fabric_manager_fails_the_unit_without_loading_peermem(node, imds):
    proc = run_program(node, imds, "Standard_ND96isr_H100_v5", FAKE_FM_INACTIVE="1")
    assert proc.returncode == 1
    assert "nvidia-fabricmanager is not active after 6 s (inactive)" in proc.stderr
    assert "systemctl status nvidia-fabricmanager" in proc.stderr
    assert "modprobe nvidia_peermem" not in calls(node)
    assert len(calls(node)) >= 2  # it polled


def test_an_infiniband_size_without_an_infiniband_hca_fails_rather_than_train_over_tcp(node, imds):
    for layer in (node["root"] / "sys/class/infiniband").glob("*/ports/1/link_layer"):
        layer.write_text("Ethernet\n")
    proc = run_program(node, imds, "Standard_ND96isr_H100_v5")
    assert proc.returncode == 1
    assert "has InfiniBand, but no HCA in /sys/class/infiniband has an InfiniBand port" in proc.stderr
    assert "NCCL would train over TCP sockets" in proc.stderr


def test_a_failed_modprobe_is_reported(node, imds):
    proc = run_program(node, imds, "Standard_ND96isr_H200_v5", FAKE_MODPROBE_FAIL="1")
    assert proc.returncode == 1
    assert "modprobe nvidia_peermem failed (modprobe: failed (nvidia_peermem))" in proc.stderr


def test_no_metadata_service_exits_2(node):
    proc = subprocess.run(
        [sys.executable, str(PROGRAM), "--root", str(node["root"]), "--imds-url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert (
        "no instance metadata at http://127.0.0.1:9/metadata/instance/compute?api-version=2021-02-01 after 3 s"
        in proc.stderr
    )
    assert not (node["root"] / "etc/nccl.conf").exists()


def test_the_program_sends_the_metadata_header(imds):
    """The stand-in IMDS refuses a request without `Metadata: true`, as Azure's does."""
    import urllib.error
    import urllib.request

    url = f"http://127.0.0.1:{imds.server_address[1]}/metadata/instance/compute?api-version=2021-02-01"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    assert refused.value.code == 400
    assert 'headers={"Metadata": "true"}' in PROGRAM.read_text()


def test_program_source_is_documented_in_the_readme():
    readme = (ROLES / "azure_sku" / "README.md").read_text()
    for needle in ("compute.vmSize", "Standard_ND96isr_H100_v5", "azhpc-images"):
        assert needle in readme
    assert textwrap.dedent(PROGRAM.read_text()).startswith("#!/usr/bin/python3")
