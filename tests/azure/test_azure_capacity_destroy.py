"""All or nothing per node group when Azure has no capacity, and `cluster down` leaves nothing behind.

Runs on a twin of its own (it changes the twin's capacity switch). The CLI runs as a subprocess.
"""

from __future__ import annotations

import base64

import pytest
from azuretest import example_config, needs_sdk, of_type, run_cb

pytestmark = needs_sdk
CLUSTER = "capdemo"
H100 = "Standard_ND96isr_H100_v5"


def _compute(twin) -> dict[str, list[str]]:
    """Node names of the cluster's VMs, NICs and disks in the twin."""
    resources = twin.resources_of(CLUSTER)
    return {
        "vms": sorted(r["tags"]["clusterbake-name"] for r in of_type(resources, "Microsoft.Compute/virtualMachines")),
        "nics": sorted(
            r["tags"]["clusterbake-name"] for r in of_type(resources, "Microsoft.Network/networkInterfaces")
        ),
        "disks": sorted(r["name"].split("_OsDisk")[0] for r in of_type(resources, "Microsoft.Compute/disks")),
    }


@pytest.mark.parametrize("code", ["AllocationFailed", "SkuNotAvailable"])
def test_a_group_without_capacity_is_rolled_back_and_named(own_twin, tmp_path, code):
    twin = own_twin
    config = example_config(twin, cluster_name=CLUSTER)
    config["azure"]["resource_group"] = f"{CLUSTER}-rg"
    config["node_groups"][0]["count"] = 3
    twin.set_capacity({H100: {"limit": 1, "code": code}})
    result = run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only", check=False)
    assert result.returncode == 1, result.stderr
    assert (
        f"node group gpu: Azure could not create 3 x {H100} in eastus zone 1 (gpu-2: {code}:" in result.stderr
        or f"node group gpu: Azure could not create 3 x {H100} in eastus zone 1 (gpu-3: {code}:" in result.stderr
    ), result.stderr
    assert "none of the group's new VMs was kept" in result.stderr
    assert "Traceback" not in result.stderr
    # The head's group succeeded and stays; nothing of the gpu group is left (VMs, NICs, disks).
    assert _compute(twin) == {"vms": ["head"], "nics": ["head"], "disks": [f"{CLUSTER}-head"]}
    # With capacity back, the next run creates the group, and keeps the head.
    head_id = of_type(twin.resources_of(CLUSTER), "Microsoft.Compute/virtualMachines")[0]["properties"]["vmId"]
    twin.set_capacity(None)
    run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only")
    assert _compute(twin)["vms"] == ["gpu-1", "gpu-2", "gpu-3", "head"]
    vms = {
        v["tags"]["clusterbake-name"]: v
        for v in of_type(twin.resources_of(CLUSTER), "Microsoft.Compute/virtualMachines")
    }
    assert vms["head"]["properties"]["vmId"] == head_id
    run_cb(twin, tmp_path, config, "cluster", "down")
    _assert_nothing_left(twin, config)


def _assert_nothing_left(twin, config):
    state = twin.state()
    assert twin.resources_of(CLUSTER) == []
    assert config["azure"]["resource_group"].lower() not in state["groups"]
    assert f"{config['azure']['resource_group']}-{CLUSTER}-nodes".lower() not in state["groups"]
    assert state["deleted_vaults"] == {}
    assert not [k for k in state["resources"] if "/microsoft.compute/disks/" in k]
    # The existing network is not the cluster's: it stays.
    assert "net-rg" in state["groups"]


def test_down_removes_everything_and_is_safe_to_repeat(own_twin, tmp_path):
    """With a login node: its VM beside the head's (the head's power identity writes neither), its NIC in
    the cluster's application security group and its own, which the NSG opens to the users' networks."""
    twin = own_twin
    config = example_config(twin, cluster_name=CLUSTER)
    config["azure"]["resource_group"] = f"{CLUSTER}-rg"
    config["login_nodes"] = {"count": 1, "instance_type": "Standard_D4s_v5", "ssh_cidrs": ["198.51.100.0/24"]}
    run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only")
    resources = twin.resources_of(CLUSTER)
    vms = {r["tags"]["clusterbake-name"]: r for r in of_type(resources, "Microsoft.Compute/virtualMachines")}
    assert (
        f"/resourceGroups/{CLUSTER}-rg/" in vms["login-1"]["id"]
        and vms["login-1"]["tags"]["clusterbake-role"] == "login"
    )
    asgs = {r["name"]: r["id"] for r in of_type(resources, "Microsoft.Network/applicationSecurityGroups")}
    nics = {r["tags"]["clusterbake-name"]: r for r in of_type(resources, "Microsoft.Network/networkInterfaces")}
    member_of = lambda node: [  # noqa: E731
        g["id"] for g in nics[node]["properties"]["ipConfigurations"][0]["properties"]["applicationSecurityGroups"]
    ]
    assert member_of("login-1") == [asgs[f"clusterbake-{CLUSTER}"], asgs[f"clusterbake-{CLUSTER}-login"]]
    assert member_of("head") == [asgs[f"clusterbake-{CLUSTER}"]]
    nsg = of_type(resources, "Microsoft.Network/networkSecurityGroups")[0]
    rules = {r["name"]: r["properties"] for r in nsg["properties"]["securityRules"]}
    login_ssh = rules["login-ssh-0"]
    assert (login_ssh["sourceAddressPrefix"], login_ssh["destinationPortRange"]) == ("198.51.100.0/24", "22")
    assert login_ssh["destinationApplicationSecurityGroups"] == [{"id": asgs[f"clusterbake-{CLUSTER}-login"]}]
    assert login_ssh["priority"] < rules["deny-vnet"]["priority"]
    _, body, _ = twin.request("GET", f"/_twin/vms/{CLUSTER}-login-1/custom-data")
    assert b'"secret_name": "join-login"' in base64.b64decode(body["userData"])  # it joins by itself
    kinds = sorted({r["type"] for r in resources})
    assert kinds == [
        "Microsoft.Compute/availabilitySets",
        "Microsoft.Compute/disks",
        "Microsoft.Compute/proximityPlacementGroups",
        "Microsoft.Compute/virtualMachines",
        "Microsoft.KeyVault/vaults",
        "Microsoft.ManagedIdentity/userAssignedIdentities",
        "Microsoft.Network/applicationSecurityGroups",
        "Microsoft.Network/networkInterfaces",
        "Microsoft.Network/networkSecurityGroups",
    ]
    down = run_cb(twin, tmp_path, config, "cluster", "down")
    output = down.stdout + down.stderr
    for what in (f"virtualMachines {CLUSTER}-head", "resource group capdemo-rg", "key vault cbcapdemo"):
        assert what in output, output
    _assert_nothing_left(twin, config)
    again = run_cb(twin, tmp_path, config, "cluster", "down")
    assert again.returncode == 0
    _assert_nothing_left(twin, config)


def test_down_keeps_a_resource_group_it_did_not_create(own_twin, tmp_path):
    """A resource group that existed before (shared with other things) is emptied of the cluster, not deleted."""
    twin = own_twin
    token = twin.token()
    status, _, _ = twin.request(
        "PUT",
        f"/subscriptions/{twin.subscription}/resourceGroups/shared-rg?api-version=2024-07-01",
        {"location": "eastus"},
        token,
    )
    assert status == 201
    config = example_config(twin, cluster_name=CLUSTER)
    config["azure"]["resource_group"] = "shared-rg"
    run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only")
    run_cb(twin, tmp_path, config, "cluster", "down")
    state = twin.state()
    assert "shared-rg" in state["groups"]
    assert twin.resources_of(CLUSTER) == [] and state["deleted_vaults"] == {}


def test_a_nodes_group_clusterbake_did_not_create_is_refused_before_anything_is_made(own_twin, tmp_path):
    """The head's power identity may write every VM of the compute nodes' group: one that holds someone
    else's VMs (or could) is refused, by the field that names it, before any resource is created."""
    twin = own_twin
    status, _, _ = twin.request(
        "PUT",
        f"/subscriptions/{twin.subscription}/resourceGroups/team-vms?api-version=2024-07-01",
        {"location": "eastus"},
        twin.token(),
    )
    assert status == 201
    config = example_config(twin, cluster_name=CLUSTER)
    config["azure"] |= {"resource_group": f"{CLUSTER}-rg", "nodes_resource_group": "team-vms"}
    result = run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only", check=False)
    assert result.returncode != 0
    assert (
        "azure.nodes_resource_group: resource group team-vms (the compute nodes') exists but clusterbake did not "
        "create it" in result.stderr
    ), result.stderr
    assert "Traceback" not in result.stderr
    assert twin.resources_of(CLUSTER) == [] and f"{CLUSTER}-rg" not in twin.state()["groups"]
    config["azure"]["nodes_resource_group"] = f"{CLUSTER}-rg"
    same = run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only", check=False)
    assert same.returncode != 0 and "azure.nodes_resource_group must differ from azure.resource_group" in same.stderr


def test_addresses_other_nics_hold_are_skipped(own_twin, tmp_path):
    """Someone else's NIC at the top of the subnet: the head takes the next free address instead."""
    twin = own_twin
    token = twin.token()
    subnet_id = example_config(twin)["azure"]["subnet_id"]
    status, body, _ = twin.request(
        "PUT",
        f"/subscriptions/{twin.subscription}/resourceGroups/net-rg/providers/Microsoft.Network/networkInterfaces/"
        "someone-else?api-version=2024-07-01",
        {
            "location": "eastus",
            "properties": {
                "ipConfigurations": [
                    {
                        "name": "ip",
                        "properties": {
                            "subnet": {"id": subnet_id},
                            "privateIPAllocationMethod": "Static",
                            "privateIPAddress": "10.70.0.254",
                        },
                    }
                ]
            },
        },
        token,
    )
    assert status == 201, body
    config = example_config(twin, cluster_name=CLUSTER)
    config["azure"]["resource_group"] = f"{CLUSTER}-rg"
    run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only")
    nics = {
        n["tags"]["clusterbake-name"]: n["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"]
        for n in of_type(twin.resources_of(CLUSTER), "Microsoft.Network/networkInterfaces")
    }
    assert nics == {"head": "10.70.0.253", "gpu-1": "10.70.0.252", "gpu-2": "10.70.0.251"}
    run_cb(twin, tmp_path, config, "cluster", "down")
    _assert_nothing_left(twin, config)


def test_a_soft_deleted_vault_is_recovered_not_a_conflict(own_twin, tmp_path):
    twin = own_twin
    config = example_config(twin, cluster_name=CLUSTER)
    config["azure"]["resource_group"] = f"{CLUSTER}-rg"
    run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only")
    vault = of_type(twin.resources_of(CLUSTER), "Microsoft.KeyVault/vaults")[0]
    status, _, _ = twin.request("DELETE", vault["id"] + "?api-version=2024-11-01", token=twin.token())
    assert status == 200 and vault["name"].lower() in twin.state()["deleted_vaults"]
    again = run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only")
    assert f"key vault {vault['name']} recovered" in again.stderr
    recovered = of_type(twin.resources_of(CLUSTER), "Microsoft.KeyVault/vaults")[0]
    assert recovered["properties"]["accessPolicies"] == vault["properties"]["accessPolicies"]
    run_cb(twin, tmp_path, config, "cluster", "down")
    _assert_nothing_left(twin, config)


def test_a_managed_image_by_id_is_used(own_twin, tmp_path):
    twin = own_twin
    token = twin.token()
    image_id = f"/subscriptions/{twin.subscription}/resourceGroups/net-rg/providers/Microsoft.Compute/images/cb-img"
    # Gen2, as the image build makes it (packer/azure.pkr.hcl): ARM's default V1 would not boot the ND size.
    image = {"location": "eastus", "properties": {"hyperVGeneration": "V2"}}
    status, body, _ = twin.request("PUT", f"{image_id}?api-version=2024-07-01", image, token)
    assert status == 201, body
    config = example_config(twin, cluster_name=CLUSTER)
    config["azure"] |= {"resource_group": f"{CLUSTER}-rg", "image": image_id}
    run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only")
    for vm in of_type(twin.resources_of(CLUSTER), "Microsoft.Compute/virtualMachines"):
        assert vm["properties"]["storageProfile"]["imageReference"] == {"id": image_id}
    run_cb(twin, tmp_path, config, "cluster", "down")
    _assert_nothing_left(twin, config)
