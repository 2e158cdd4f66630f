"""An Azure cluster end to end on the Azure twin (issue 10's "done when").

`clusterbake twin up azure`, then examples/azure-twin.yaml as `ciaz`: the real CLI creates
everything through the azure-mgmt SDK against the twin's ARM fake; the VMs boot as local
nodes; Ansible configures only the head; the compute nodes read their join bundle from Key
Vault with their managed identity and join by themselves; /home and /shared are NFS Azure
file shares, /scratch an Azure Managed Lustre file system, /datasets and /results blob
containers mounted with blobfuse2 and the nodes' identity (on the twin: host directories
bound by its stand-ins, docs/twin.md). The tests run in order on one cluster; the last
takes it down and checks that nothing is left in the fake subscription or on the host.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from pathlib import Path

import pytest
from azuretwintest import AzureTwin, Environ, example_cluster
from polling import wait_for
from timetable import boots_cluster
from twintest import CheckpointedTraining, run

pytestmark = pytest.mark.integration
CLUSTER = "ciaz"
STORAGE = Path(os.environ.get("CLUSTERBAKE_STATE_DIR", "/var/lib/clusterbake")) / "twins" / "azure" / "storage"


@pytest.fixture(scope="module")
@boots_cluster("Azure twin 1+2 (azure-twin.yaml)")
def cluster(azure, tmp_path_factory):
    """examples/azure-twin.yaml under the tests' own cluster name and resource group, up for the module."""

    def spot(config: dict) -> None:
        config["node_groups"][0]["spot"] = True  # Spot VMs (eviction policy Delete): the eviction test below

    cluster = example_cluster(azure.env, tmp_path_factory.mktemp("aztwin"), "azure-twin.yaml", CLUSTER, spot)
    yield cluster
    cluster.cb("cluster", "down", timeout=600)


def _vm_id(azure: AzureTwin, node: str) -> str:
    vm = azure.vm(f"{CLUSTER}-{node}")
    assert vm is not None and vm["node"] == "running", vm
    return vm["vm_id"]


def test_compute_nodes_joined_by_themselves_from_key_vault(azure, cluster):
    assert f"cluster {CLUSTER} is up: 2 compute nodes idle" in cluster.up.stdout + cluster.up.stderr
    for name in ("cpu-1", "cpu-2"):
        vm_id = _vm_id(azure, name)
        logins = azure.inside(vm_id, "journalctl -u ssh --no-pager | grep -c 'Accepted publickey' || true")
        assert logins.stdout.strip() == "0", f"{name}: something logged in over SSH during cluster up"
        fetch = azure.inside(vm_id, "journalctl -u clusterbake-node-fetch --no-pager").stdout
        assert "joined from secret join-cpu in https://" in fetch and ".vault.azure.net" in fetch, fetch[-2000:]
    assert sorted(cluster.on("head", "srun -N2 hostname").stdout.split()) == ["cpu-1", "cpu-2"]


AZURE_IDENTITY_TOKEN = (
    "import urllib.request as u\n"
    "ask = u.Request('http://169.254.169.254/metadata/identity/oauth2/token?api-version=2018-02-01"
    "&resource=https%3A%2F%2Fvault.azure.net', headers={'Metadata': 'true'})\n"
    "try:\n"
    "    u.urlopen(ask, timeout=3).read(); print('token')\n"
    "except u.HTTPError as exc:\n"
    "    print('answered', exc.code)  # IMDS reached: it answered (no default identity)\n"
    "except Exception as exc:\n"
    "    print('refused:', exc)\n"
)


def test_only_root_reaches_the_metadata_service_and_on_the_head_the_power_programs_user(azure, cluster):
    """Security review finding 1 (critical), on Azure: a user took a Key Vault token from IMDS with
    the nodes' identity (its client id was in a world-readable file) and read the join bundle."""
    command = f"python3 -c {shlex.quote(AZURE_IDENTITY_TOKEN)}"
    for node in ("cpu-1", "head"):
        assert not cluster.on(node, command).stdout.startswith("refused"), node
        for user in ("researcher",):
            answer = cluster.on(node, f"runuser -u {user} -- {command}").stdout.strip()
            assert answer.startswith("refused:"), (node, user, answer)
        source = cluster.on(node, "runuser -u researcher -- cat /etc/clusterbake/join-source.json", check=False)
        assert source.returncode != 0, node  # the vault, the secret and the identity: root's to know
    assert not cluster.on("head", f"runuser -u slurm -- {command}").stdout.startswith("refused")


def test_home_and_shared_are_the_clusters_nfs_file_shares(azure, cluster):
    accounts = [p for p in (STORAGE / "files").iterdir()] if (STORAGE / "files").is_dir() else []
    assert len(accounts) == 1 and sorted(p.name for p in accounts[0].iterdir()) == ["home", "shared"]
    account = accounts[0].name
    for node in ("head", "cpu-1"):
        units = cluster.on(
            node, "grep -h -e ^What= -e ^Options= /etc/systemd/system/home.mount /etc/systemd/system/shared.mount"
        )
        assert units.stdout.split() == [
            f"What={account}.file.core.windows.net:/{account}/home",
            "Options=vers=4,minorversion=1,sec=sys,nconnect=4,hard,_netdev",
            f"What={account}.file.core.windows.net:/{account}/shared",
            "Options=vers=4,minorversion=1,sec=sys,nconnect=4,hard,_netdev",
        ]
        active = cluster.on(node, "systemctl is-active home.mount shared.mount")
        assert active.stdout.split() == ["active", "active"]
        assert cluster.on(node, "findmnt -n -o TARGET /home; findmnt -n -o TARGET /shared").stdout.split() == [
            "/home",
            "/shared",
        ]
    # The users' homes were made by the joins on the share itself: every node sees the same one.
    assert (accounts[0] / "home" / "researcher").is_dir()


def _twin_resources(azure: AzureTwin, kind: str) -> list[dict]:
    """The cluster's resources of a type, as the ARM fake holds them."""
    return [
        r
        for r in azure.arm_state()["resources"].values()
        if r["type"] == kind and (r.get("tags") or {}).get("clusterbake-cluster") == CLUSTER
    ]


def test_scratch_is_the_managed_lustre_file_system(azure, cluster):
    (fs,) = _twin_resources(azure, "Microsoft.StorageCache/amlFilesystems")
    directory = STORAGE / "amlfs" / fs["name"].lower()
    assert directory.is_dir()
    for node in ("head", "cpu-1"):
        unit = cluster.on(node, "cat /etc/systemd/system/scratch.mount").stdout
        what = next(line for line in unit.splitlines() if line.startswith("What="))
        assert what.endswith("@tcp:/lustrefs") and what.startswith("What=10.91.1.")  # the twin's amlfs subnet
        assert "Type=lustre\n" in unit and "Options=noatime,flock,_netdev\n" in unit
        lnet = cluster.on(node, "grep -v '^#' /etc/modprobe.d/lnet.conf").stdout.strip()
        assert lnet == 'options lnet networks="tcp(eth0)"'
        assert cluster.on(node, "systemctl is-active scratch.mount").stdout.strip() == "active"
    cluster.on("cpu-1", "echo from-cpu-1 > /scratch/hello")
    assert cluster.on("head", "cat /scratch/hello").stdout.strip() == "from-cpu-1"
    assert (directory / "hello").read_text().strip() == "from-cpu-1"


def test_a_node_the_file_systems_servers_cannot_reach_cannot_mount_it(azure, cluster):
    """The twin's NSG check on a node's own mount (twins/azure/lustre.py, mount_helper.py): the cluster's NSG
    without its Lustre rule (as clusterbake made it before the rule) keeps the file system's servers out, and
    the node's mount.lustre fails; with the rule back it mounts."""
    (fs,) = _twin_resources(azure, "Microsoft.StorageCache/amlFilesystems")
    (nsg,) = _twin_resources(azure, "Microsoft.Network/networkSecurityGroups")
    spec = f"{fs['properties']['clientInfo']['mgsAddress']}@tcp:/lustrefs"
    probe = f"mkdir -p /mnt/probe && mount -t lustre {spec} /mnt/probe; echo rc=$?; umount /mnt/probe 2>/dev/null; true"
    rules = [{"name": r["name"], "properties": r["properties"]} for r in nsg["properties"]["securityRules"]]
    network = azure.clients()[1]
    vm_id = _vm_id(azure, "cpu-2")

    def put_rules(kept: list[dict]) -> None:
        body = {"location": nsg["location"], "tags": nsg["tags"], "properties": {"securityRules": kept}}
        with Environ(azure.env):
            network.network_security_groups.begin_create_or_update(f"{CLUSTER}-rg", nsg["name"], body).result()

    def mounts(rc: int):
        result = azure.inside(vm_id, probe, check=False)
        return result if f"rc={rc}" in result.stdout else None

    put_rules([r for r in rules if not r["name"].startswith("amlfs-")])
    try:
        refused = wait_for("cpu-2's mount refused", lambda: mounts(32), timeout=30)
        assert f"mount.lustre: mount {spec} at /mnt/probe failed: Input/output error" in refused.stderr
        assert f"network security group {nsg['name']} denies inbound TCP 988" in refused.stderr
    finally:
        put_rules(rules)
    wait_for("cpu-2's mount with the rule back", lambda: mounts(0), timeout=30)


def test_blob_containers_are_mounted_with_the_nodes_identity(azure, cluster):
    (account,) = [a for a in _twin_resources(azure, "Microsoft.Storage/storageAccounts") if a["kind"] == "StorageV2"]
    blobs = STORAGE / "blobs" / account["name"]
    (blobs / "datasets" / "corpus.txt").write_text("tokens\n")
    for node in ("head", "cpu-1", "cpu-2"):
        active = cluster.on(
            node, "systemctl is-active clusterbake-blobfuse2-datasets.service clusterbake-blobfuse2-results.service"
        )
        assert active.stdout.split() == ["active", "active"], node
        config = cluster.on(node, "cat /etc/blobfuse2/datasets.yaml").stdout
        assert "mode: msi" in config and f"account-name: {account['name']}" in config
        journal = cluster.on(node, "journalctl -u clusterbake-blobfuse2-datasets --no-pager").stdout
        assert f"{account['name']}/datasets mounted at /datasets (bind,ro)" in journal, journal[-2000:]
        assert cluster.on(node, "cat /datasets/corpus.txt").stdout == "tokens\n"
    # Storage Blob Data Reader on datasets: the mount is read-only; Contributor on results.
    refused = cluster.on("cpu-1", "touch /datasets/x", check=False)
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr
    cluster.on("cpu-2", "echo step12 > /results/metrics.txt")
    assert (blobs / "results" / "metrics.txt").read_text() == "step12\n"


def test_second_cluster_up_changes_nothing(azure, cluster):
    before = {n: azure.vm(f"{CLUSTER}-{n}")["vm_id"] for n in ("head", "cpu-1", "cpu-2")}
    result = cluster.cb("cluster", "up", timeout=900)
    assert "0 changed tasks" in result.stdout, result.stdout + result.stderr[-3000:]
    assert "creating" not in result.stderr
    assert {n: azure.vm(f"{CLUSTER}-{n}")["vm_id"] for n in before} == before


def test_deepspeed_trains_across_both_nodes_with_checkpoint_on_the_file_share(azure, cluster):
    result = cluster.train_deepspeed("ciaz-ds")
    assert "nodes: cpu-1, cpu-2 (world size 2)" in result.stdout, result.stdout[-3000:]
    assert "transport: gloo over TCP on eth0 [fabric tcp]" in result.stdout
    checkpoints = "/shared/checkpoints/researcher/ciaz-ds"
    listing = cluster.on("head", f"ls {checkpoints} && stat -c %U {checkpoints}")
    assert "step12" in listing.stdout.split() and listing.stdout.split()[-1] == "researcher"
    (share,) = [p for p in (STORAGE / "files").iterdir()]
    assert (share / "shared" / "checkpoints" / "researcher" / "ciaz-ds" / "step12").is_dir()


def test_munge_key_rotation_reaches_running_vms_and_a_vm_that_boots_later(azure, cluster):
    """Security review finding 14: `ops munge_key` was refused on Azure, so a key a node's root may have read
    could never be replaced. Running VMs switch over SSH at once; a VM that boots later reads the new key
    from its join bundle in Key Vault."""
    key = cluster.provider.cluster.munge_key
    old = hashlib.sha256(key.read_bytes()).hexdigest()
    cluster.cb("ops", "munge_key", timeout=900)
    new = hashlib.sha256(key.read_bytes()).hexdigest()
    assert new != old and key.stat().st_mode & 0o777 == 0o600
    for node in ("head", "cpu-1", "cpu-2"):
        assert cluster.on(node, "sha256sum /etc/munge/munge.key").stdout.split()[0] == new, node
    cluster.cb("node", "stop", "cpu-2", timeout=600)
    cluster.cb("node", "start", "cpu-2", timeout=600)
    vm_id = _vm_id(azure, "cpu-2")
    wait_for(
        "cpu-2 joined again after its start",
        lambda: "joined from secret join-cpu" in azure.inside(vm_id, "journalctl -b -u clusterbake-node-fetch "
                                                              "--no-pager", check=False).stdout,
        300,
    )  # fmt: skip
    cluster.wait_idle({"cpu-1", "cpu-2"}, timeout=300)
    assert azure.inside(vm_id, "sha256sum /etc/munge/munge.key").stdout.split()[0] == new
    assert sorted(cluster.on("head", "srun -N2 hostname").stdout.split()) == ["cpu-1", "cpu-2"]


def test_a_spot_eviction_mid_training_checkpoints_requeues_and_the_group_is_whole_again(azure, cluster):
    """Azure's Preempt scheduled event (here 30 s ahead), then the Spot VM deleted as its eviction policy Delete
    says: the node's agent drains it while the VM runs, the job checkpoints and requeues, the head's reconcile
    loop creates the VM again at the node's address, the training resumes from its checkpoint and completes."""
    training = CheckpointedTraining(cluster, "az-evict")
    old = azure.vm(f"{CLUSTER}-cpu-2")
    azure.control(
        "PUT", f"/vms/{CLUSTER}-cpu-2/scheduledevents", {"EventType": "Preempt", "NotBeforeSeconds": 30, "Evict": True}
    )

    def reason() -> str:
        return cluster.on("head", "sinfo --noheader --Node --nodes cpu-2 --format=%E").stdout.strip()

    wait_for("cpu-2 drained", lambda: reason().startswith("clusterbake: spot reclaim at"), timeout=30, interval=0.25)
    assert azure.vm(f"{CLUSTER}-cpu-2")["vm_id"] == old["vm_id"], "drained only after the eviction"
    assert "Azure spot eviction" in reason()

    training.assert_resumed_from_the_notice_checkpoint()
    new = azure.vm(f"{CLUSTER}-cpu-2")
    assert new["vm_id"] != old["vm_id"] and new["address"] == old["address"]
    power_log = cluster.on("head", "cat /var/log/clusterbake/power.log").stdout
    assert "reconcile: cpu-2 lost: started again and returned to service" in power_log
    cluster.wait_idle({"cpu-1", "cpu-2"}, timeout=300)


def test_cluster_down_leaves_nothing_in_the_subscription_or_on_the_host(azure, cluster):
    cluster.cb("cluster", "down", timeout=600)
    *_, resources = azure.clients()
    with Environ(azure.env):
        tagged = list(resources.resources.list(filter=f"tagName eq 'clusterbake-cluster' and tagValue eq '{CLUSTER}'"))
        groups = [g.name for g in resources.resource_groups.list()]
    assert tagged == []
    assert f"{CLUSTER}-rg" not in groups and f"{CLUSTER}-rg-{CLUSTER}-nodes" not in groups
    wait_for("the cluster's VMs gone from the twin", lambda: azure.control("GET", "/status")["vms"] == [], 30)
    wait_for("the cluster's nodes gone", lambda: "cb-twin-azure-" not in run(["ip", "netns", "list"]).stdout, 30)
    wait_for("the file shares' directories gone", lambda: not any((STORAGE / "files").glob("*")), 30)
    wait_for("the Lustre and blob directories gone", lambda: not any(STORAGE.glob("[ab]*/*")), 30)
    # The nodes' identity went with its role assignments (Azure would keep them as "Identity not found").
    left = azure.arm_state()["role_assignments"]
    assert left == {}, left
