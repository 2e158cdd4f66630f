"""`clusterbake cluster up --provision-only` / `cluster down` for examples/azure-ndv5.yaml, end to end.

The real CLI runs as a subprocess against the ARM twin (conftest.py) through the real Azure
SDK; what it created is then read back from the twin (`/_twin/state`, raw ARM requests) and
through the inventory script. No VM boots here (the twin's VMs are records): SSH, Ansible
and Slurm are not part of these tests.
"""

from __future__ import annotations

import base64
import email
import importlib.util
import ipaddress
import json
import os
import secrets
import time
from pathlib import Path

import programs
import pytest
from azuretest import (
    LOCATION,
    REPO,
    SUBNET_PREFIX,
    example_config,
    gallery_image,
    inventory,
    needs_sdk,
    of_type,
    run_cb,
)

pytestmark = needs_sdk
CLUSTER = "ndv5demo"
RG = "ndv5demo-rg"
NODES_RG = f"{RG}-{CLUSTER}-nodes"  # the compute nodes' own group (security review finding 2)
H100 = "Standard_ND96isr_H100_v5"
GOLDEN = Path(__file__).resolve().parent / "golden"


def _config(twin):
    # A gallery image version (the path examples/azure-ndv5.yaml recommends): its resource provider answers
    # galleries' own api-versions only (review B3).
    config = example_config(twin, azure={"image": gallery_image(twin, "ndv5")})
    config["node_groups"].append(
        {"name": "cpu", "count": 1, "instance_type": "Standard_D4s_v5", "spot": True, "placement_group": False}
    )
    return config


@pytest.fixture(scope="module")
def ndv5(twin, tmp_path_factory):
    """The example cluster (plus a spot CPU group), up once for the module and down at its end."""
    state_dir = tmp_path_factory.mktemp("state-ndv5")
    config = _config(twin)
    first = run_cb(twin, state_dir, config, "cluster", "up", "--provision-only")
    yield {"state_dir": state_dir, "config": config, "first": first, "path": state_dir / f"{CLUSTER}.yaml"}
    run_cb(twin, state_dir, config, "cluster", "down")


def _vms(twin) -> dict[str, dict]:
    vms = of_type(twin.resources_of(CLUSTER), "Microsoft.Compute/virtualMachines")
    return {vm["tags"]["clusterbake-name"]: vm for vm in vms}


def test_vms_are_tagged_sized_and_placed(twin, ndv5):
    vms = _vms(twin)
    assert sorted(vms) == ["cpu-1", "gpu-1", "gpu-2", "head"]
    assert "4 nodes provisioned" in ndv5["first"].stdout
    assert "availability set clusterbake-ndv5demo-gpu created" in ndv5["first"].stderr
    head = vms["head"]
    assert head["tags"] == {
        "clusterbake-cluster": CLUSTER,
        "clusterbake-role": "head",
        "clusterbake-nodegroup": "head",
        "clusterbake-name": "head",
    }
    assert head["name"] == f"{CLUSTER}-head" and head["properties"]["osProfile"]["computerName"] == "head"
    assert head["properties"]["hardwareProfile"]["vmSize"] == "Standard_D8s_v5"
    assert "proximityPlacementGroup" not in head["properties"]
    fabric = f"clusterbake-{CLUSTER}-gpu"
    for name in ("gpu-1", "gpu-2"):
        vm = vms[name]
        props = vm["properties"]
        assert vm["tags"]["clusterbake-nodegroup"] == "gpu" and vm["tags"]["clusterbake-role"] == "compute"
        # In an availability set, not zonal: the zone is the placement group's (below).
        assert props["hardwareProfile"]["vmSize"] == H100 and "zones" not in vm
        assert props["priority"] == "Regular"
        # One availability set per InfiniBand group (one fabric), in the group's proximity placement group.
        assert props["availabilitySet"]["id"].endswith(f"/availabilitySets/{fabric}")
        assert props["proximityPlacementGroup"]["id"].endswith(f"/proximityPlacementGroups/{fabric}")
        assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
        assert props["osProfile"]["linuxConfiguration"]["disablePasswordAuthentication"] is True
        identities = list(vm["identity"]["userAssignedIdentities"])
        assert [i.rsplit("/", 1)[-1] for i in identities] == [f"clusterbake-{CLUSTER}-nodes"]
    spot = vms["cpu-1"]["properties"]
    assert (spot["priority"], spot["evictionPolicy"], spot["billingProfile"]["maxPrice"]) == ("Spot", "Delete", -1)
    assert "proximityPlacementGroup" not in spot and "availabilitySet" not in spot
    resources = twin.resources_of(CLUSTER)
    assert not of_type(resources, "Microsoft.Compute/virtualMachineScaleSets")
    sets = of_type(resources, "Microsoft.Compute/availabilitySets")
    assert [s["name"] for s in sets] == [fabric]
    assert sets[0]["sku"] == {"name": "Aligned"} and sets[0]["properties"]["platformFaultDomainCount"] == 1
    placement = of_type(resources, "Microsoft.Compute/proximityPlacementGroups")[0]
    assert placement["name"] == fabric and placement["zones"] == ["1"]
    # The twin's record of who shares an InfiniBand partition: both GPU nodes, one fabric (review B1).
    assert vms["gpu-1"]["_ib_fabric"] == vms["gpu-2"]["_ib_fabric"] == sets[0]["id"].lower()


def test_every_vm_names_its_security_type_and_one_api_version(twin, ndv5):
    """Standard, sent explicitly: the twin (like Azure since Trusted Launch as default) would otherwise make a Gen2
    VM Trusted Launch with Secure Boot, and refuse it outright for the managed image the image build makes."""
    vms = _vms(twin)
    assert {n: vm["properties"]["securityProfile"] for n, vm in vms.items()} == {
        n: {"securityType": "Standard"} for n in vms
    }
    from clusterbake.providers.azure.power import API_VERSIONS

    assert {vm["_api_version"] for vm in vms.values()} == {API_VERSIONS["compute"]}


def test_nics_have_the_planned_static_addresses(twin, ndv5):
    nics = {
        n["tags"]["clusterbake-name"]: n
        for n in of_type(twin.resources_of(CLUSTER), "Microsoft.Network/networkInterfaces")
    }
    addresses = {name: nic["properties"]["ipConfigurations"][0]["properties"] for name, nic in nics.items()}
    # From the top of the subnet, in plan order: head, gpu-1, gpu-2, cpu-1 (Azure allocates from the bottom).
    assert {n: a["privateIPAddress"] for n, a in addresses.items()} == {
        "head": "10.70.0.254",
        "gpu-1": "10.70.0.253",
        "gpu-2": "10.70.0.252",
        "cpu-1": "10.70.0.251",
    }
    assert all(a["privateIPAllocationMethod"] == "Static" for a in addresses.values())
    assert all(a["subnet"]["id"].endswith("/subnets/nodes") for a in addresses.values())
    state = json.loads((ndv5["state_dir"] / "clusters" / CLUSTER / "state.json").read_text())
    assert {n: v["address"] for n, v in state["nodes"].items()}["gpu-2"] == "10.70.0.252"
    assert SUBNET_PREFIX == "10.70.0.0/24"


def test_nsg_admits_ssh_from_the_cidrs_and_the_cluster_only(twin, ndv5):
    resources = twin.resources_of(CLUSTER)
    nsg = of_type(resources, "Microsoft.Network/networkSecurityGroups")[0]
    asg = of_type(resources, "Microsoft.Network/applicationSecurityGroups")[0]
    rules = {r["name"]: r["properties"] for r in nsg["properties"]["securityRules"]}
    assert rules["ssh-0"]["sourceAddressPrefix"] == "203.0.113.0/24"
    assert (rules["ssh-0"]["destinationPortRange"], rules["ssh-0"]["access"]) == ("22", "Allow")
    assert rules["cluster"]["sourceApplicationSecurityGroups"] == [{"id": asg["id"]}]
    assert rules["cluster"]["destinationApplicationSecurityGroups"] == [{"id": asg["id"]}]
    assert (rules["deny-vnet"]["sourceAddressPrefix"], rules["deny-vnet"]["access"]) == ("VirtualNetwork", "Deny")
    assert rules["ssh-0"]["priority"] < rules["cluster"]["priority"] < rules["deny-vnet"]["priority"]
    for nic in of_type(resources, "Microsoft.Network/networkInterfaces"):
        assert nic["properties"]["networkSecurityGroup"]["id"] == nsg["id"]
        assert nic["properties"]["ipConfigurations"][0]["properties"]["applicationSecurityGroups"] == [
            {"id": asg["id"]}
        ]


def test_custom_data_says_where_the_bundle_is_never_the_bundle(twin, ndv5):
    munge = (ndv5["state_dir"] / "clusters" / CLUSTER / "secrets" / "munge.key").read_bytes()
    resources = twin.resources_of(CLUSTER)
    identity = of_type(resources, "Microsoft.ManagedIdentity/userAssignedIdentities")[0]
    vault = of_type(resources, "Microsoft.KeyVault/vaults")[0]
    for name in ("gpu-1", "head"):
        _, body, _ = twin.request("GET", f"/_twin/vms/{CLUSTER}-{name}/custom-data")
        raw = base64.b64decode(body["customData"])
        # userData (what Azure's IMDS serves the boot service) is the same pointer-only document.
        assert base64.b64decode(body["userData"]) == raw
        assert base64.b64encode(munge)[:40] not in raw and munge[:32] not in raw
        message = email.message_from_bytes(raw)
        parts = {
            p.get_content_type(): p.get_payload(decode=True).decode() for p in message.walk() if not p.is_multipart()
        }
        ours = json.loads(parts["text/x-clusterbake"])
        assert ours["hostname"] == name and ours["ssh_user"] == "azureuser"
        if name == "head":
            assert ours["join"] is None
        else:
            assert ours["join"] == {
                "cloud": "azure",
                "vault_url": vault["properties"]["vaultUri"],
                "secret_name": "join-gpu",
                "client_id": identity["properties"]["clientId"],
            }


def test_vault_grants_the_nodes_get_and_the_controller_set(twin, ndv5):
    state = twin.state()
    resources = twin.resources_of(CLUSTER)
    identity = of_type(resources, "Microsoft.ManagedIdentity/userAssignedIdentities")[0]
    vault = of_type(resources, "Microsoft.KeyVault/vaults")[0]
    policies = {p["objectId"]: sorted(p["permissions"]["secrets"]) for p in vault["properties"]["accessPolicies"]}
    assert policies == {
        state["controller_oid"]: ["delete", "get", "list", "set"],
        identity["properties"]["principalId"]: ["get"],
    }
    assert vault["name"].startswith("cbndv5demo") and len(vault["name"]) <= 24


def test_rerun_writes_nothing(twin, ndv5):
    before = twin.state()
    again = run_cb(twin, ndv5["state_dir"], ndv5["config"], "cluster", "up", "--provision-only")
    after = twin.state()
    assert "all 4 nodes exist" in again.stderr
    assert "created" not in again.stderr
    # Every write of the twin draws an id (etags, operations, resources): no write at all.
    assert after["counter"] == before["counter"]
    assert after["resources"] == before["resources"]


def _node_boot():
    return programs.load_program(
        "clusterbake_node_boot_azure_twin", REPO / "roles/cloud_boot/files/clusterbake-node-boot"
    )


class _VmIdentity:
    """A token of the node's managed identity for Key Vault: the twin's managed identity endpoint stands
    in for the VM's IMDS (the boot program's own IMDS requests: tests/unit/test_node_boot_azure.py)."""

    def __init__(self, twin):
        self.twin = twin

    def token(self, client_id: str | None, refresh: bool = False) -> str:
        return self.twin.token(client_id, resource="https://vault.azure.net")


def _node_reads_its_bundle(twin, node: str = "gpu-1") -> str:
    """The join bundle as the node's boot program reads it from the twin's Key Vault: where the VM's
    userData says it is, with the nodes' identity (its access policy: get)."""
    _, body, _ = twin.request("GET", f"/_twin/vms/{CLUSTER}-{node}/custom-data")
    message = email.message_from_bytes(base64.b64decode(body["userData"]))
    part = next(p for p in message.walk() if p.get_content_type() == "text/x-clusterbake")
    source = json.loads(part.get_payload(decode=True))["join"]
    return _node_boot().azure_bundle(source, _VmIdentity(twin))


def _bundle(nodes: int, certificates: int = 0) -> str:
    """A compute node's bundle of the documented shape (roles/node_join/README.md, "The bundle") for
    `nodes` planned nodes, half of them an elastic group's: /etc/hosts from role common's own template,
    the munge key, users with SSH keys, `certificates` extra CA certificates (random, as keys are)."""
    from jinja2 import Template

    names = [f"gpu-{i}" for i in range(1, nodes // 2 + 1)] + [f"burst-{i}" for i in range(1, nodes - nodes // 2 + 1)]
    hostvars = {name: {"ansible_host": str(ipaddress.ip_address("10.70.0.4") + i)} for i, name in enumerate(names)}
    hosts = Template((REPO / "roles/common/templates/hosts.j2").read_text()).render(
        groups={"all": names}, hostvars=hostvars
    )

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    def pem(der: bytes) -> str:
        lines = [b64(der)[i : i + 64] for i in range(0, len(b64(der)), 64)]
        return "-----BEGIN CERTIFICATE-----\n" + "\n".join(lines) + "\n-----END CERTIFICATE-----\n"

    users = [
        {"name": f"user{i}", "uid": 2000 + i, "gid": 2000 + i, "groups": [], "shell": "/bin/bash", "sudo": False,
         "ssh_authorized_keys": [f"ssh-ed25519 {b64(secrets.token_bytes(51))} user{i}@corp"]}
        for i in range(20)
    ]  # fmt: skip
    bundle = {
        "format": 1,
        "cluster": CLUSTER,
        "files": [
            {"path": "/etc/hosts", "content_b64": b64(hosts.encode()), "mode": "0644"},
            {"path": "/etc/munge/munge.key", "content_b64": b64(secrets.token_bytes(1024)), "mode": "0400"},
        ],
        "users": users,
        "ca_certificates": [
            {"name": f"corp-{i}.crt", "content_b64": b64(pem(secrets.token_bytes(1400)).encode())}
            for i in range(certificates)
        ],
        "services": ["munge", "slurmd"],
        "after_controller": ["slurmd"],
    }
    return json.dumps(bundle)


def _versions(twin) -> dict[str, list[bool]]:
    vault = of_type(twin.resources_of(CLUSTER), "Microsoft.KeyVault/vaults")[0]
    stored = twin.state()["secrets"][vault["name"]]
    return {name: [v["attributes"]["enabled"] for v in versions] for name, versions in sorted(stored.items())}


def test_after_configure_publishes_the_bundle_the_nodes_can_read(twin, ndv5, monkeypatch):
    from azure.core.exceptions import HttpResponseError
    from azure.identity import ManagedIdentityCredential
    from azure.keyvault.secrets import SecretClient

    provider = _provider(twin, ndv5, monkeypatch)
    join = provider.cluster.join_bundles
    (join / "gpu.json").write_text('{"files": [], "users": []}')
    provider.after_configure()
    provider.after_configure()  # unchanged: not written again
    resources = twin.resources_of(CLUSTER)
    vault = of_type(resources, "Microsoft.KeyVault/vaults")[0]
    identity = of_type(resources, "Microsoft.ManagedIdentity/userAssignedIdentities")[0]
    versions = twin.state()["secrets"][vault["name"]]["join-gpu"]
    assert len(versions) == 1 and versions[0]["contentType"] == "application/json"
    # A node reads it with the group's identity (Key Vault's challenge, access policy get) and may not write.
    assert _node_reads_its_bundle(twin) == '{"files": [], "users": []}'
    node = SecretClient(
        vault["properties"]["vaultUri"], ManagedIdentityCredential(client_id=identity["properties"]["clientId"])
    )
    with pytest.raises(HttpResponseError) as info:
        node.set_secret("join-gpu", "x")
    assert info.value.status_code == 403 and "does not have secrets set permission" in str(info.value)

    # A new bundle (say, a rotated munge key): the replaced version is disabled, unreadable by its id.
    old = node.get_secret("join-gpu").properties.version
    (join / "gpu.json").write_text('{"files": [{"path": "/etc/munge/munge.key"}], "users": []}')
    assert provider.after_configure() == [
        "gpu: join bundle published (running VMs take it at their next boot)",
        "gpu: 1 replaced join bundle version(s) disabled",
    ]
    assert _node_reads_its_bundle(twin).startswith('{"files": [{"path"')
    with pytest.raises(HttpResponseError) as info:
        node.get_secret("join-gpu", old)
    assert info.value.status_code == 403 and "not allowed on a disabled secret" in str(info.value)
    versions = twin.state()["secrets"][vault["name"]]["join-gpu"]
    assert [v["attributes"]["enabled"] for v in versions] == [False, True]
    assert provider.after_configure() == []  # nothing left to disable, nothing written


def test_a_bundle_over_key_vaults_25_kb_is_compressed_or_split_and_reads_back_whole(twin, ndv5, monkeypatch):
    """Realcloud review B5: Key Vault holds 25 KB a secret (the twin refuses more, as Key Vault does). A bundle
    for hundreds of planned nodes is published gzipped; one that is still too big, in parts; a node reads
    back the very bundle; parts a smaller bundle no longer needs are disabled; one that cannot fit is
    refused before anything is written, naming what to change."""
    from clusterbake.errors import ClusterbakeError

    provider = _provider(twin, ndv5, monkeypatch)
    path = provider.cluster.join_bundles / "gpu.json"
    limit = 25 * 1024

    hundreds = _bundle(nodes=1200)
    assert len(hundreds) > limit
    path.write_text(hundreds)
    assert "gpu: join bundle published (running VMs take it at their next boot)" in provider.after_configure()
    assert _node_reads_its_bundle(twin) == hundreds
    assert not [name for name in _versions(twin) if name.startswith("join-gpu--")]  # one secret holds it

    big = _bundle(nodes=1200, certificates=16)  # CA certificates hardly compress
    path.write_text(big)
    provider.after_configure()
    versions = _versions(twin)
    parts = [name for name in versions if name.startswith("join-gpu--")]
    assert len(parts) >= 2 and parts == [f"join-gpu--{k}" for k in range(1, len(parts) + 1)]
    assert all(versions[name] == [True] for name in parts)
    assert versions["join-gpu"][-1] is True and True not in versions["join-gpu"][:-1]
    assert _node_reads_its_bundle(twin) == big
    assert _node_reads_its_bundle(twin, "gpu-2") == big
    assert provider.after_configure() == []  # the same bundle again: nothing written, nothing to disable

    path.write_text(hundreds)  # smaller again: the parts are disabled (the old munge key is in them)
    assert f"gpu: {1 + len(parts)} replaced join bundle version(s) disabled" in provider.after_configure()
    assert all(_versions(twin)[name] == [False] for name in parts)
    assert _node_reads_its_bundle(twin) == hundreds

    before = twin.state()["secrets"]
    path.write_text(_bundle(nodes=1200, certificates=120))
    with pytest.raises(ClusterbakeError) as refused:
        provider.after_configure()
    message = str(refused.value)
    assert message.startswith("join bundle of node group gpu: ") and "nothing was published" in message
    assert "Key Vault's 8 secrets of 25600 bytes" in message
    assert "node_groups[].count / max_count" in message and "image.extra_ca_certificates" in message
    assert twin.state()["secrets"] == before
    assert _node_reads_its_bundle(twin) == hundreds


def _provider(twin, ndv5, monkeypatch):
    from clusterbake.config import load_config
    from clusterbake.providers.azure.provider import AzureProvider
    from clusterbake.state import StateDir

    for key, value in twin.env.items():
        monkeypatch.setenv(key, value)
    # The node's boot program (urllib) trusts the system's CAs, which hold the twin's on a twin's node.
    monkeypatch.setenv("SSL_CERT_FILE", twin.env["REQUESTS_CA_BUNDLE"])
    return AzureProvider(load_config(ndv5["path"]), StateDir(ndv5["state_dir"]))


def test_a_nodes_host_keys_are_pinned_from_its_boot_diagnostics_before_anything_connects(twin, ndv5, monkeypatch):
    """Security review finding 8: host keys were trusted on first use on Azure. Every VM has boot
    diagnostics (managed storage); the controller reads the serial log by the SAS URI ARM gives and pins
    the keys the boot program printed there before it connects."""
    import requests
    from paramiko.hostkeys import HostKeys

    from clusterbake.errors import ClusterbakeError
    from clusterbake.providers import common

    vms = _vms(twin)
    assert all(vm["properties"]["diagnosticsProfile"] == {"bootDiagnostics": {"enabled": True}} for vm in vms.values())
    provider = _provider(twin, ndv5, monkeypatch)
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIF0k9mK7ZrWcP6sXzJ1Lq3bHn2Vd8Ty4Ue5Rg6Wa7Xb9"
    other = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQDpinnedtoo"
    twin.console(
        vms["gpu-1"]["properties"]["vmId"],
        f"[    5.1] cloud-init: ok\n-----BEGIN SSH HOST KEY KEYS-----\n{key} root@gpu-1\n{other} root@gpu-1\n"
        "-----END SSH HOST KEY KEYS-----\n",
    )
    endpoint = provider.endpoint("gpu-1")
    pinned = HostKeys(str(provider.cluster.known_hosts))
    assert pinned.lookup(endpoint.host)["ssh-ed25519"].get_base64() == key.split()[1]
    assert "ssh-rsa" in pinned.lookup("gpu-1")

    # A node whose log never shows its keys is not connected to at all.
    monkeypatch.setattr(common, "HOST_KEYS_POLL", 0.1)
    monkeypatch.setattr(common, "HOST_KEYS_TIMEOUT", 0.3)
    twin.console(vms["cpu-1"]["properties"]["vmId"], "[    0.000000] Linux version 6.8.0-1021-azure\n")
    with pytest.raises(ClusterbakeError, match="has not shown its SSH host keys on its serial console"):
        provider.endpoint("cpu-1")
    assert HostKeys(str(provider.cluster.known_hosts)).lookup("cpu-1") is None

    # The log is readable only by the SAS URI ARM handed out, as managed storage's blobs are.
    data = provider.clients.compute.virtual_machines.retrieve_boot_diagnostics_data(
        provider.nodes_group, vms["gpu-1"]["name"], sas_uri_expiration_time_in_minutes=5
    )
    assert requests.get(data.serial_console_log_blob_uri, timeout=30).text.count(key) == 1
    forged = data.serial_console_log_blob_uri.replace(
        vms["gpu-1"]["properties"]["vmId"], vms["head"]["properties"]["vmId"]
    )
    refused = requests.get(forged, timeout=30)
    assert refused.status_code == 403 and refused.headers["x-ms-error-code"] == "AuthenticationFailed"


def test_inventory_has_the_shared_shape(twin, ndv5):
    result = inventory(twin, ndv5["state_dir"], ndv5["path"])
    groups = {name: sorted(body.get("hosts", [])) for name, body in result.items() if name not in ("_meta", "all")}
    assert groups["slurm_head"] == ["head"]
    assert groups["slurm_compute"] == ["cpu-1", "gpu-1", "gpu-2"]
    assert groups["nodegroup_gpu"] == ["gpu-1", "gpu-2"] and groups["nodegroup_cpu"] == ["cpu-1"]
    assert groups["ib"] == ["gpu-1", "gpu-2"]
    assert groups["gpu"] == ["gpu-1", "gpu-2"] and groups["nvswitch"] == ["gpu-1", "gpu-2"]
    assert groups["train"] == ["gpu-1", "gpu-2"]
    hostvars = result["_meta"]["hostvars"]
    gpu = hostvars["gpu-1"]
    assert gpu["ansible_host"] == "10.70.0.253"
    assert gpu["clusterbake_node_role"] == "compute" and gpu["clusterbake_nodegroup"] == "gpu"
    assert gpu["clusterbake_instance_type"] == H100 and gpu["clusterbake_zone"] == "1"
    assert gpu["clusterbake_location"] == LOCATION
    assert gpu["clusterbake_placement_group"] == f"clusterbake-{CLUSTER}-gpu"
    assert gpu["clusterbake_availability_set"] == f"clusterbake-{CLUSTER}-gpu"
    assert gpu["clusterbake_running"] is True and gpu["clusterbake_power_state"] == "running"
    assert gpu["clusterbake_slurm_node"] == {
        "cpus": 96,
        "sockets": 1,
        "cores_per_socket": 96,
        "threads_per_core": 1,
        "real_memory": 1848320,  # 1,900 GiB less 5%
        "gres": ["gpu:h100:8"],
        "features": ["gpu", "train", "ib", H100],
    }
    assert gpu["clusterbake_elastic"] is False
    # The health check expects the size's 8 x 400 Gb/s InfiniBand ports (hardware review item 17).
    assert gpu["node_health_infiniband"] == {"ports": 8, "min_rate": 400}
    assert "node_health_infiniband" not in hostvars["cpu-1"]
    assert hostvars["head"]["clusterbake_slurm_node"]["real_memory"] == 31129  # 32 GiB less 5%
    cpu = hostvars["cpu-1"]["clusterbake_slurm_node"]
    assert cpu["real_memory"] == 15360  # 16 GiB less 1 GiB (5% would leave less than 1 GiB)
    assert (cpu["cpus"], cpu["cores_per_socket"], cpu["threads_per_core"], cpu["gres"]) == (4, 2, 2, [])
    variables = result["all"]["vars"]
    assert variables["clusterbake_provider"] == "azure" and variables["node_join_self_join"] is True
    # topology.conf: the InfiniBand group's nodes under a leaf named after its availability set (VMs reach
    # each other over InfiniBand only within one set: Azure's "Enable InfiniBand"); cpu-1, no fabric, apart.
    assert variables["clusterbake_topology"] == [
        {"name": f"clusterbake-{CLUSTER}-gpu", "nodes": "gpu-[1-2]"},
        {"name": "unplaced", "nodes": "cpu-1"},
        {"name": "root", "switches": f"clusterbake-{CLUSTER}-gpu,unplaced"},
    ]
    assert variables["ansible_user"] == "azureuser" and variables["clusterbake_subnet_cidr"] == SUBNET_PREFIX


def _filters():
    path = REPO / "roles" / "slurm" / "filter_plugins" / "slurm_conf.py"
    spec = importlib.util.spec_from_file_location("slurm_conf_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_slurm_node_and_gres_lines_for_nd_h100_v5_match_golden(twin, ndv5):
    """Microsoft's ND H100 v5 size: 96 vCPUs (physical cores, no SMT), 1,900 GiB, 8 x H100 80 GB; RealMemory
    95% of 1,900 GiB = 1,848,320 MiB. Rendered with the slurm role's own filters from the inventory."""
    result = inventory(twin, ndv5["state_dir"], ndv5["path"])
    hostvars = result["_meta"]["hostvars"]
    filters = _filters()
    hosts = ["gpu-1", "gpu-2"]
    lines = [*filters.slurm_node_lines(hostvars, hosts), "", *filters.slurm_gres_conf_lines(hostvars, hosts)]
    rendered = "\n".join(str(line) for line in lines) + "\n"
    golden = GOLDEN / "azure-ndv5.slurm-nodes"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert rendered == golden.read_text()
    assert "CPUs=96" in rendered and "RealMemory=1848320" in rendered and "Gres=gpu:h100:8" in rendered


def test_status_reads_power_from_the_instance_view(twin, ndv5, monkeypatch):
    from clusterbake.config import load_config
    from clusterbake.providers.azure.provider import AzureProvider
    from clusterbake.state import StateDir

    for key, value in twin.env.items():
        monkeypatch.setenv(key, value)
    provider = AzureProvider(load_config(ndv5["path"]), StateDir(ndv5["state_dir"]))
    status = {s.name: s for s in provider.status()}
    assert {n: s.state for n, s in status.items()} == {
        "head": "running",
        "gpu-1": "running",
        "gpu-2": "running",
        "cpu-1": "running",
    }
    assert status["gpu-1"].detail == f"{CLUSTER}-gpu-1 {H100} running"
    assert provider.azure.resource_group == RG


def _vm_action(twin, name: str, action: str) -> None:
    path = (
        f"/subscriptions/{twin.subscription}/resourceGroups/{NODES_RG}/providers/Microsoft.Compute/virtualMachines/"
        f"{CLUSTER}-{name}/{action}?api-version=2024-07-01"
    )
    status, body, _ = twin.request("POST", path, token=twin.token())
    assert status in (200, 202, 204), body


def _power(twin, name: str) -> str:
    path = (
        f"/subscriptions/{twin.subscription}/resourceGroups/{NODES_RG}/providers/Microsoft.Compute/virtualMachines/"
        f"{CLUSTER}-{name}/instanceView?api-version=2024-07-01"
    )
    _, view, _ = twin.request("GET", path, token=twin.token())
    return next(s["code"] for s in view["statuses"] if s["code"].startswith("PowerState/"))


def _as_another_operator_left_the_vault(twin) -> str:
    """The vault as another operator's `cluster up` left it: their access policy and the nodes', not this
    controller's. Returns their object id."""
    vault = of_type(twin.resources_of(CLUSTER), "Microsoft.KeyVault/vaults")[0]
    state = twin.state()
    tenant, controller = state["tenant"], state["controller_oid"]
    operator = "3b9d2c71-0e4f-4a6b-8c5d-7e2f1a0b9c8d"
    policies = [p for p in vault["properties"]["accessPolicies"] if p["objectId"] != controller]
    policies.append({"tenantId": tenant, "objectId": operator, "permissions": {"secrets": ["get", "set", "list"]}})
    body = {k: vault[k] for k in ("location", "tags")} | {
        "properties": {"tenantId": tenant, "sku": {"family": "A", "name": "standard"}, "accessPolicies": policies}
    }
    status, answer, _ = twin.request("PUT", f"{vault['id']}?api-version=2024-11-01", body, twin.token())
    assert status == 200, answer
    return operator


def test_cluster_up_starts_a_deallocated_node_and_keeps_another_operators_vault_access(twin, ndv5):
    """One re-run of `cluster up` for two things others changed. A deallocated node is started. And
    realcloud review B9: a PUT of the vault replaces every access policy, so this controller's policy is
    added with the vault's "add" operation and the other operator's stays."""
    _vm_action(twin, "gpu-2", "deallocate")
    operator = _as_another_operator_left_the_vault(twin)
    time.sleep(0.3)
    assert _power(twin, "gpu-2") == "PowerState/deallocated"
    again = run_cb(twin, ndv5["state_dir"], ndv5["config"], "cluster", "up", "--provision-only")
    assert "starting 1 stopped VM(s)" in again.stderr
    assert _power(twin, "gpu-2") == "PowerState/running"
    vault = of_type(twin.resources_of(CLUSTER), "Microsoft.KeyVault/vaults")[0]
    held = {p["objectId"]: sorted(p["permissions"]["secrets"]) for p in vault["properties"]["accessPolicies"]}
    assert held.get(operator) == ["get", "list", "set"]
    assert held[twin.state()["controller_oid"]] == ["delete", "get", "list", "set"]
    assert len(held) == 3  # and the nodes' identity's
    assert f"key vault {vault['name']}: access policies added for 1 principal(s)" in again.stderr


def test_an_evicted_spot_node_comes_back_at_its_address(twin, ndv5):
    before = _vms(twin)["cpu-1"]["properties"]["vmId"]
    _vm_action(twin, "cpu-1", "simulateEviction")  # evictionPolicy Delete: the VM (and its NIC) go
    assert "cpu-1" not in _vms(twin)
    run_cb(twin, ndv5["state_dir"], ndv5["config"], "cluster", "up", "--provision-only")
    vm = _vms(twin)["cpu-1"]
    assert vm["properties"]["vmId"] != before
    nics = of_type(twin.resources_of(CLUSTER), "Microsoft.Network/networkInterfaces")
    nic = next(n for n in nics if n["tags"]["clusterbake-name"] == "cpu-1")
    assert nic["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"] == "10.70.0.251"


def test_inventory_of_a_cluster_without_vms_has_no_hosts(twin, ndv5):
    result = inventory(twin, ndv5["state_dir"], ndv5["path"], CLUSTERBAKE_CLUSTER="nosuchcluster")
    assert result["_meta"]["hostvars"] == {}
    assert result["slurm_head"]["hosts"] == [] and result["all"]["vars"]["clusterbake_cluster_name"] == "nosuchcluster"
