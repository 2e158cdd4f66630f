"""The shared_storage role: the .mount units and exports it puts in each node's join
bundle, through the real ansible/tasks/join.yml and node_join.

One ansible-playbook run of tests/playbooks/shared_storage.yml (a few seconds):
a head and two compute nodes, all with the local connection, whose join program is
a fake that keeps the bundle it gets on stdin, so the tests read each node's exact
bundle. The head's configure_head runs for real on directories under the test's
own. Nothing is mounted: this machine's kernel has no NFS (see the role's README).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from playbook_run import ANSIBLE_PLAYBOOK, REPO, playbook_env, run_playbook

sys.path.insert(0, str(REPO / "roles" / "shared_storage" / "filter_plugins"))
sys.path.insert(0, str(REPO / "ansible" / "filter_plugins"))
from shared_storage import shared_storage_amlfs_mounts, shared_storage_blob_mounts, shared_storage_lustre_mounts
from systemd_units import systemd_mount_unit

HEAD, CPU, GPU = "10.0.1.10", "10.0.1.11", "10.0.1.12"
STORAGE = [
    {"name": "home", "mount_point": "/home", "type": "efs", "file_system_id": None, "retain": False},
    {"name": "shared", "mount_point": "/shared", "type": "nfs"},
    {"name": "data", "mount_point": "/shared/data-2026", "type": "nfs"},
    {"name": "scratch", "mount_point": "/scratch", "type": "fsx_lustre", "deployment_type": "SCRATCH_2"},
    {"name": "cache", "mount_point": "/cache", "type": "hostdir"},
    {"name": "datasets", "mount_point": "/datasets", "type": "azure_files", "quota_gib": 100, "retain": False},
    {"name": "lustre", "mount_point": "/lustre", "type": "amlfs", "fs_name": "lustrefs", "mgs_address": None},
    {"name": "corpus", "mount_point": "/corpus", "type": "azure_blob", "read_only": True, "cache_size_mb": 2048},
]
BLOB_ACCOUNT = "cb00112233445566778899aa"
NODE_IDENTITY = "0b4c2a5e-8f1d-4c3e-9a7b-2d6e1f0c9b8a"
ENDPOINTS = {
    "home": {
        "type": "efs",
        "file_system_id": "fs-0123456789abcdef0",
        "address": "10.0.7.21",
        "dns_name": "fs-0123456789abcdef0.efs.us-east-1.amazonaws.com",
    },
    "scratch": {
        "type": "fsx_lustre",
        "file_system_id": "fs-0fedcba9876543210",
        "dns_name": "fs-0fedcba9876543210.fsx.us-east-1.amazonaws.com",
        "mount_name": "abcdefgh",
    },
    "datasets": {
        "dns_name": "cb0123456789abcdef012345.file.core.windows.net",
        "export": "/cb0123456789abcdef012345/datasets",
        "account": "cb0123456789abcdef012345",
    },
    "lustre": {"mgs_address": "10.0.1.4", "fs_name": "lustrefs", "file_system": "clusterbake-t-lustre"},
    "corpus": {
        "account": BLOB_ACCOUNT,
        "container": "corpus",
        "endpoint": f"https://{BLOB_ACCOUNT}.blob.core.windows.net",
        "read_only": True,
    },
}
# The `lustre` group's own mounts (the provider's inventory var), on gpu-1 only.
GROUP_LUSTRE = [{"dns_name": "fs-0aaaabbbbccccdddd.fsx.us-east-1.amazonaws.com", "mount_name": "zzzz", "path": "/fsx"}]

FAKE_JOIN = """#!{python}
# Keeps the bundle it gets on stdin at --bundle, as clusterbake-node-join --install does.
import json, sys
path = sys.argv[sys.argv.index("--bundle") + 1]
open(path, "w").write(sys.stdin.read())
print(json.dumps({{"changed": []}}))
"""
FAKE_EXPORTFS = """#!/bin/sh
echo "$@" >> {log}
"""


# What the plan gives every compute host (the head's slurm.conf, which its bundle carries, lists them).
SLURM_NODE = {"cpus": 2, "sockets": 1, "cores_per_socket": 2, "threads_per_core": 1, "real_memory": 4096,
              "gres": [], "features": []}  # fmt: skip


def inventory(tmp: Path) -> dict:
    entries = [dict(e, mount_point=f"{tmp}/fs{e['mount_point']}") for e in STORAGE]
    return {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": "/usr/bin/python3",
                "clusterbake_cluster_name": "t",
                "clusterbake_storage": STORAGE,
                "clusterbake_storage_endpoints": ENDPOINTS,
                "clusterbake_subnet_cidr": "10.0.0.0/16",
                "blobfuse2_identity_client_id": NODE_IDENTITY,
                "munge_key_file": str(tmp / "munge.key"),
                "node_join_program": str(tmp / "fake-join"),
                "node_join_bundle_path": str(tmp / "bundles") + "/{{ inventory_hostname }}.json",
                "shared_storage_test_dir": f"{tmp}/fs",
                "shared_storage_test_entries": entries,
            },
            "hosts": {
                "head": {"ansible_host": HEAD, "clusterbake_nodegroup": "head"},
                "cpu-1": {"ansible_host": CPU, "clusterbake_nodegroup": "cpu", "clusterbake_slurm_node": SLURM_NODE},
                "gpu-1": {
                    "ansible_host": GPU,
                    "clusterbake_nodegroup": "gpu",
                    "clusterbake_slurm_node": SLURM_NODE,
                    "lustre_client_mounts": GROUP_LUSTRE,
                },
            },
            "children": {
                "slurm_head": {"hosts": {"head": {}}},
                "slurm_compute": {"hosts": {"cpu-1": {}, "gpu-1": {}}},
                "lustre": {"hosts": {"gpu-1": {}}},
            },
        }
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip("ansible-playbook is not in the venv (make venv)")
    tmp = tmp_path_factory.mktemp("shared_storage")
    (tmp / "bundles").mkdir()
    (tmp / "bin").mkdir()
    (tmp / "munge.key").write_bytes(os.urandom(32))
    fake = tmp / "fake-join"
    fake.write_text(FAKE_JOIN.format(python=sys.executable))
    fake.chmod(0o755)
    exportfs = tmp / "bin" / "exportfs"
    exportfs.write_text(FAKE_EXPORTFS.format(log=tmp / "exportfs.log"))
    exportfs.chmod(0o755)
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory(tmp)))
    record = tmp / "record.json"
    env = playbook_env(tmp, tmp / "bin", record)
    run_playbook("shared_storage.yml", tmp / "inventory.yml", env)
    bundles = {p.stem: json.loads(p.read_text()) for p in (tmp / "bundles").glob("*.json")}
    log = tmp / "exportfs.log"
    return {
        "tmp": tmp,
        "bundles": bundles,
        "records": json.loads(record.read_text()),
        "exportfs": log.read_text().splitlines() if log.exists() else [],
    }


def decoded(specs: list[dict]) -> dict[str, str]:
    return {s["path"]: base64.b64decode(s["content_b64"]).decode(errors="replace") for s in specs}


def mount_section(unit: str) -> list[str]:
    lines = unit.split("[Mount]\n", 1)[1].split("\n\n", 1)[0]
    return lines.splitlines()


EFS_MOUNT = [
    f"What={ENDPOINTS['home']['address']}:/",
    "Where=/home",
    "Type=nfs4",
    "Options=nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2,noresvport,_netdev",
]
# Microsoft's options for NFS Azure file shares ("Mount NFS Azure file share on Linux"), plus hard and _netdev.
AZURE_FILES_MOUNT = [
    "What=cb0123456789abcdef012345.file.core.windows.net:/cb0123456789abcdef012345/datasets",
    "Where=/datasets",
    "Type=nfs4",
    "Options=vers=4,minorversion=1,sec=sys,nconnect=4,hard,_netdev",
]


LNET = "/etc/modprobe.d/lnet.conf"


def units(*names: str) -> list[str]:
    """The mount units' paths of `names` (systemd-escaped names)."""
    return [f"/etc/systemd/system/{name}.mount" for name in names]


def cloud_service_mounts(mounts: dict[str, str]) -> tuple[list[str], list[str]]:
    """The [Mount] sections of the efs entry (home) and the azure_files entry (datasets)."""
    home, datasets = units("home", "datasets")
    return mount_section(mounts[home]), mount_section(mounts[datasets])


# --- compute nodes ----------------------------------------------------------------


def test_compute_nodes_mount_efs_azure_files_and_the_heads_exports(run):
    for host in ("cpu-1", "gpu-1"):
        mounts = decoded(run["bundles"][host]["mounts"])
        # One unit per efs, azure_files and nfs entry (cloud services first), then amlfs_client's part (its LNet
        # settings and the Lustre unit); none for hostdir, fsx_lustre (lustre_client's files) or azure_blob.
        assert list(mounts) == [*units("home", "datasets", "shared", "shared-data\\x2d2026"), LNET, *units("lustre")]
        assert cloud_service_mounts(mounts) == (EFS_MOUNT, AZURE_FILES_MOUNT)
        docs = "https://learn.microsoft.com/azure/storage/files/storage-files-how-to-mount-nfs-shares"
        assert f"Documentation={docs}" in mounts["/etc/systemd/system/datasets.mount"]
        assert mount_section(mounts["/etc/systemd/system/shared.mount"]) == [
            f"What={HEAD}:/shared",
            "Where=/shared",
            "Type=nfs4",
            "Options=nfsvers=4.2,hard,_netdev",
        ]
        assert mount_section(mounts["/etc/systemd/system/shared-data\\x2d2026.mount"]) == [
            f"What={HEAD}:/shared/data-2026",
            "Where=/shared/data-2026",
            "Type=nfs4",
            "Options=nfsvers=4.2,hard,_netdev",
        ]
        assert all(s["mode"] == "0644" for s in run["bundles"][host]["mounts"])


def test_amlfs_entries_mount_through_amlfs_client_on_every_node(run):
    # No host is in group `amlfs`: the storage entry alone brings the Lustre part, LNet over TCP on eth0.
    for host in ("head", "cpu-1", "gpu-1"):
        mounts = decoded(run["bundles"][host]["mounts"])
        lnet = [line for line in mounts["/etc/modprobe.d/lnet.conf"].splitlines() if not line.startswith("#")]
        assert lnet == ['options lnet networks="tcp(eth0)"']
        assert mount_section(mounts["/etc/systemd/system/lustre.mount"]) == [
            "What=10.0.1.4@tcp:/lustrefs",
            "Where=/lustre",
            "Type=lustre",
            "Options=noatime,flock,_netdev",  # Microsoft's "Connect clients" options, plus _netdev
        ]


def test_blob_entries_mount_through_blobfuse2_with_the_nodes_identity(run):
    for host in ("head", "cpu-1", "gpu-1"):
        bundle = run["bundles"][host]
        files = decoded(bundle["files"])
        config = yaml.safe_load(files["/etc/blobfuse2/corpus.yaml"])
        assert config["azstorage"] == {
            "type": "block",
            "account-name": BLOB_ACCOUNT,
            "container": "corpus",
            "endpoint": f"https://{BLOB_ACCOUNT}.blob.core.windows.net",
            "mode": "msi",
            "appid": NODE_IDENTITY,
        }
        assert config["read-only"] is True
        assert config["file_cache"]["max-size-mb"] == 2048
        assert "clusterbake-blobfuse2-corpus.service" in bundle["services"]
        assert "/corpus" not in {_unit_where(u) for u in decoded(bundle["mounts"]).values()}


def _unit_where(unit: str) -> str:
    return next((line[6:] for line in unit.splitlines() if line.startswith("Where=")), "")


def test_units_wait_for_the_network_and_mount_at_boot(run):
    for path, unit in decoded(run["bundles"]["cpu-1"]["mounts"]).items():
        if not path.endswith(".mount"):
            continue
        assert "Wants=network-online.target\nAfter=network-online.target\n" in unit
        assert unit.endswith("[Install]\nWantedBy=remote-fs.target\n")


def test_compute_nodes_serve_nothing(run):
    bundle = run["bundles"]["cpu-1"]
    assert not any("exports" in f["path"] for f in bundle["files"])
    assert "nfs-server" not in bundle["services"]


def test_fsx_lustre_entries_go_through_lustre_client_on_every_node(run):
    # cpu-1 is not in group `lustre`: the storage entry alone brings the Lustre part.
    cpu = decoded(run["bundles"]["cpu-1"]["files"])
    unit = cpu["/etc/systemd/system/scratch.mount"]
    assert f"What={ENDPOINTS['scratch']['dns_name']}@tcp:/abcdefgh\nWhere=/scratch\nType=lustre\n" in unit
    assert "scratch.mount" in run["bundles"]["cpu-1"]["services"]
    # gpu-1 (group lustre) keeps its group's own mount besides the storage entry.
    gpu = decoded(run["bundles"]["gpu-1"]["files"])
    assert "/etc/systemd/system/fsx.mount" in gpu and "/etc/systemd/system/scratch.mount" in gpu


# --- the head -------------------------------------------------------------------


def test_head_mounts_efs_and_azure_files_but_not_its_own_exports(run):
    mounts = decoded(run["bundles"]["head"]["mounts"])
    assert list(mounts) == [*units("home", "datasets"), LNET, *units("lustre")]
    assert cloud_service_mounts(mounts) == (EFS_MOUNT, AZURE_FILES_MOUNT)


def test_head_exports_the_nfs_entries_with_root_squash(run):
    bundle = run["bundles"]["head"]
    files = {f["path"]: f for f in bundle["files"]}
    exports = files["/etc/exports.d/clusterbake.exports"]
    assert exports["restart"] == ["nfs-server"] and exports["mode"] == "0644"
    lines = [line for line in decoded([exports])[exports["path"]].splitlines() if not line.startswith("#")]
    assert lines == [
        "/shared 10.0.0.0/16(rw,sync,no_subtree_check,root_squash)",
        "/shared/data-2026 10.0.0.0/16(rw,sync,no_subtree_check,root_squash)",
    ]
    assert "nfs-server" in bundle["services"]


def test_nfs_units_are_bundle_mounts_not_files(run):
    # The join program mounts `mounts` before it creates the users; `files` come after them.
    for bundle in run["bundles"].values():
        assert not any("Type=nfs4" in text for text in decoded(bundle["files"]).values())
        units = [text for path, text in decoded(bundle["mounts"]).items() if path.endswith(".mount")]
        assert all("Type=nfs4" in text or "Type=lustre" in text for text in units)


def test_head_sets_the_root_directory_modes_after_the_join(run):
    fs = run["tmp"] / "fs"
    assert stat.S_IMODE((fs / "home").stat().st_mode) == 0o755
    for directory in ("shared", "shared/data-2026", "scratch", "lustre"):
        assert stat.S_IMODE((fs / directory).stat().st_mode) == 0o1777, directory
    assert not (fs / "cache").exists()  # hostdir: the provider's
    assert not (fs / "corpus").exists()  # a blob container has no modes to set


def test_head_exports_new_directories_once(run):
    # The first configure_head created the nfs directories: exportfs -r, once; the second changed nothing.
    assert run["exportfs"] == ["-r"]
    results = [
        r for r in run["records"] if r["task"].endswith("Set the mode of each shared file system's root directory")
    ]
    assert [r["result"]["changed"] for r in results] == [True, False]


# --- what the role leaves alone, and its checks ----------------------------------------


def test_hostdir_storage_produces_nothing(run):
    parts = [
        r["result"]["ansible_facts"]
        for r in run["records"]
        if r["task"].endswith("Describe the shared storage for the join bundle")
    ][-3:]
    assert len(parts) == 3  # the last play: head, cpu-1, gpu-1 with hostdir storage only
    # The head alone (the record has no host: one of the three) makes each user's private job and
    # checkpoint directory (the join program).
    private = sorted((f["shared_storage_join_part"]["user_directories"] for f in parts), key=len)
    assert private == [[], [], ["/shared/jobs", "/shared/checkpoints"]]
    for facts in parts:
        part = {k: v for k, v in facts["shared_storage_join_part"].items() if k != "user_directories"}
        assert part == {"mounts": [], "files": [], "services": []}
        assert facts["shared_storage_lustre_mounts"] == []


@pytest.mark.parametrize("case", ["efs-no-endpoint", "azure-files-no-export", "relative-path"])
def test_bad_entries_fail_in_the_check(run, case):
    assert not any(r["task"].endswith("Case did not fail") and r["status"] != "skipped" for r in run["records"])
    (rescued,) = [r for r in run["records"] if r["task"].endswith(f"Case {case} failed as expected")]
    assert rescued["result"]["msg"].endswith("Check the storage entries and their endpoints")


# --- unit names, without Ansible ------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/home", "home.mount"),
        ("/shared", "shared.mount"),
        ("/shared/data", "shared-data.mount"),
        ("/shared/fsx-scratch", "shared-fsx\\x2dscratch.mount"),
        ("/data/my data/ü", "data-my\\x20data-\\xc3\\xbc.mount"),
        ("/.hidden/x", "\\x2ehidden-x.mount"),
    ],
)
def test_unit_names_match_systemd_escape(path, expected):
    assert systemd_mount_unit(path) == expected
    if shutil.which("systemd-escape"):
        tool = subprocess.run(["systemd-escape", "--path", "--suffix=mount", path], capture_output=True, text=True)
        assert tool.stdout.strip() == expected


def test_amlfs_and_blob_mounts_from_storage_entries():
    assert shared_storage_amlfs_mounts(STORAGE, ENDPOINTS) == [
        {"mgs_address": "10.0.1.4", "fs_name": "lustrefs", "path": "/lustre"}
    ]
    assert shared_storage_blob_mounts(STORAGE, ENDPOINTS) == [
        {
            "account": BLOB_ACCOUNT,
            "container": "corpus",
            "endpoint": f"https://{BLOB_ACCOUNT}.blob.core.windows.net",
            "path": "/corpus",
            "read_only": True,
            "cache_size_mb": 2048,
        }
    ]


def test_lustre_mounts_from_storage_entries():
    assert shared_storage_lustre_mounts(STORAGE, ENDPOINTS) == [
        {"dns_name": ENDPOINTS["scratch"]["dns_name"], "mount_name": "abcdefgh", "path": "/scratch"}
    ]


# --- blobfuse2's config file against its documented schema ------------------------------

SCHEMA = json.loads((REPO / "tests" / "unit" / "data" / "blobfuse2-config-schema.json").read_text())


def schema_problems(config: dict) -> list[str]:
    """What of a blobfuse2 config is not in blobfuse2's documented schema (tests/unit/data/README.md)."""
    problems = [f"unknown top-level key {k}" for k in config if k not in SCHEMA["top_level"]]
    order = SCHEMA["components_order"]
    components = config.get("components", [])
    if [c for c in order if c in components] != components:
        problems.append(f"components {components} not in blobfuse2's order {order}")
    for group in SCHEMA["exclusive_components"]:
        if all(c in components for c in group):
            problems.append(f"components {group} cannot be used together")
    for section, keys in SCHEMA["sections"].items():
        problems += [f"unknown key {section}.{k}" for k in config.get(section, {}) if k not in keys]
    for dotted, allowed in SCHEMA["values"].items():
        section, key = dotted.split(".")
        if key in config.get(section, {}) and config[section][key] not in allowed:
            problems.append(f"{dotted}: {config[section][key]} is not one of {allowed}")
    for section, keys in SCHEMA["required"].items():
        problems += [f"{section}.{k} is required" for k in keys if k not in config.get(section, {})]
    problems += [f"{c} is configured but not a component" for c in SCHEMA["sections"] if c in config and c not in
                 components and c != "logging"]  # fmt: skip
    return problems


def test_blobfuse2_config_follows_blobfuse2s_documented_schema(run):
    config = yaml.safe_load(decoded(run["bundles"]["cpu-1"]["files"])["/etc/blobfuse2/corpus.yaml"])
    assert schema_problems(config) == []
    # The check itself finds what blobfuse2 would refuse.
    broken = {**config, "azstorage": {**config["azstorage"], "mode": "identity", "accountname": "x"}}
    broken["components"] = ["azstorage", "libfuse", "block_cache", "file_cache"]
    assert schema_problems(broken) == [
        "components ['azstorage', 'libfuse', 'block_cache', 'file_cache'] not in blobfuse2's order "
        f"{SCHEMA['components_order']}",
        "components ['block_cache', 'file_cache'] cannot be used together",
        "unknown key azstorage.accountname",
        "azstorage.mode: identity is not one of ['key', 'sas', 'spn', 'msi', 'azcli']",
        "attr_cache is configured but not a component",
    ]
