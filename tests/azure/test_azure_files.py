"""`azure_files` storage: NFS Azure file shares created by `cluster up`, found by the inventory, removed
by `cluster down`, through the real CLI and SDK against the ARM twin (conftest.py).

The fake enforces what Azure requires of an NFS share (a premium FileStorage account, a
virtual network rule only for a subnet with the Microsoft.Storage service endpoint); the
tests read back what the provider created from the twin's state.
"""

from __future__ import annotations

import pytest
from azuretest import (
    LOCATION,
    inventory,
    needs_sdk,
    of_type,
    one_node_config,
    provisioned,
    run_cb,
    subnet_id,
)
from azuretest import storage_subnet as make_storage_subnet

from clusterbake.config import ClusterConfig

pytestmark = needs_sdk
CLUSTER = "filesdemo"
STORAGE_SUBNET = "storage-nodes"
STORAGE = [
    {"name": "home", "mount_point": "/home", "type": "azure_files"},
    {"name": "shared", "mount_point": "/shared", "type": "azure_files", "quota_gib": 1024},
]


@pytest.fixture(scope="module")
def storage_subnet(twin) -> str:
    """A subnet of the existing network with the Microsoft.Storage service endpoint."""
    return make_storage_subnet(twin, STORAGE_SUBNET, "10.70.20.0/24")


def _config(twin, subnet_id: str, storage=STORAGE) -> dict:
    return one_node_config(twin, CLUSTER, subnet_id, storage)


@pytest.fixture(scope="module")
def files(twin, storage_subnet, tmp_path_factory):
    yield from provisioned(twin, tmp_path_factory.mktemp("state-files"), _config(twin, storage_subnet), CLUSTER)


def _accounts(twin) -> list[dict]:
    return of_type(twin.resources_of(CLUSTER), "Microsoft.Storage/storageAccounts")


def _shares(twin) -> dict[str, dict]:
    return {
        r["name"]: r
        for r in twin.state()["resources"].values()
        if r["type"] == "Microsoft.Storage/storageAccounts/fileServices/shares"
    }


def test_azure_files_is_an_azure_storage_type_only():
    base = {"cluster_name": "x", "node_groups": [{"name": "cpu", "count": 1}], "storage": STORAGE}
    with pytest.raises(ValueError, match=r"storage\.0.*azure_files"):
        ClusterConfig.model_validate({**base, "provider": "local"})
    with pytest.raises(ValueError, match="quota_gib"):
        ClusterConfig.model_validate({**base, "provider": "local", "storage": [{**STORAGE[0], "quota_gib": 50}]})


def test_subnet_without_the_storage_service_endpoint_is_refused_before_anything_is_made(twin, tmp_path):
    config = _config(twin, subnet_id(twin, "nodes"))
    config["cluster_name"] = "nofiles"
    config["azure"]["resource_group"] = "nofiles-rg"
    result = run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only", check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "azure.subnet_id: the subnet has no Microsoft.Storage service endpoint" in result.stderr
    assert "storage.0 (home)" in result.stderr
    assert twin.resources_of("nofiles") == []


def test_one_premium_nfs_account_reached_only_from_the_subnet(twin, files, storage_subnet):
    (account,) = _accounts(twin)
    assert account["name"].startswith("cb") and len(account["name"]) == 24
    assert account["kind"] == "FileStorage" and account["sku"]["name"] == "Premium_LRS"
    props = account["properties"]
    assert props["supportsHttpsTrafficOnly"] is False  # NFS has no TLS
    assert props["networkAcls"]["defaultAction"] == "Deny"
    assert [r["id"].lower() for r in props["networkAcls"]["virtualNetworkRules"]] == [storage_subnet.lower()]
    assert account["tags"]["clusterbake-cluster"] == CLUSTER


def test_each_entry_is_an_nfs_share_without_root_squash(twin, files):
    shares = _shares(twin)
    assert set(shares) == {"home", "shared"}
    for share in shares.values():
        assert share["properties"]["enabledProtocols"] == "NFS"
        assert share["properties"]["rootSquash"] == "NoRootSquash"
    assert shares["home"]["properties"]["shareQuota"] == 100
    assert shares["shared"]["properties"]["shareQuota"] == 1024


def test_inventory_names_each_share_as_the_nodes_mount_it(twin, files):
    (account,) = _accounts(twin)
    name = account["name"]
    result = inventory(twin, files["state_dir"], files["path"])
    endpoints = result["all"]["vars"]["clusterbake_storage_endpoints"]
    assert endpoints == {
        "home": {"dns_name": f"{name}.file.core.windows.net", "export": f"/{name}/home", "account": name},
        "shared": {"dns_name": f"{name}.file.core.windows.net", "export": f"/{name}/shared", "account": name},
    }
    assert [s["type"] for s in result["all"]["vars"]["clusterbake_storage"]] == ["azure_files", "azure_files"]


def test_rerun_creates_no_storage(twin, files):
    before = {r["id"]: r["etag"] for r in _accounts(twin)}
    again = run_cb(twin, files["state_dir"], files["config"], "cluster", "up", "--provision-only")
    assert "creating storage account" not in again.stdout + again.stderr
    assert "creating NFS file share" not in again.stdout + again.stderr
    assert {r["id"]: r["etag"] for r in _accounts(twin)} == before


def test_down_deletes_the_account_unless_an_entry_retains_it(twin, storage_subnet, tmp_path):
    storage = [STORAGE[0], {**STORAGE[1], "retain": True}]
    config = _config(twin, storage_subnet, storage)
    config["cluster_name"] = "keepfiles"
    config["azure"]["resource_group"] = "keepfiles-rg"
    run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only")
    (account,) = of_type(twin.resources_of("keepfiles"), "Microsoft.Storage/storageAccounts")
    assert account["tags"]["clusterbake-retain"] == "true"
    down = run_cb(twin, tmp_path, config, "cluster", "down")
    assert f"keeping {account['name']}" in down.stdout + down.stderr
    left = twin.resources_of("keepfiles")
    assert [r["name"] for r in of_type(left, "Microsoft.Storage/storageAccounts")] == [account["name"]]
    assert not of_type(left, "Microsoft.Compute/virtualMachines")
    # Clean up what the test kept, as a person would once the data is safe.
    status, _, _ = twin.request("DELETE", f"{account['id']}?api-version=2023-05-01", token=twin.token())
    assert status in (200, 204)
    assert of_type(twin.resources_of("keepfiles"), "Microsoft.Storage/storageAccounts") == []
    assert "keeping resource group keepfiles-rg" in down.stdout + down.stderr


# --- what the fake refuses, as Azure does ------------------------------------------------


def test_fake_refuses_what_azure_refuses_for_nfs_shares(twin, storage_subnet):
    from azure.core.exceptions import HttpResponseError
    from azure.identity import DefaultAzureCredential
    from azure.mgmt.resource.resources import ResourceManagementClient
    from azure.mgmt.storage import StorageManagementClient
    from azure.mgmt.storage.models import (
        FileShare,
        NetworkRuleSet,
        Sku,
        StorageAccountCreateParameters,
        VirtualNetworkRule,
    )

    with twin.sdk_env():
        credential = DefaultAzureCredential()
        ResourceManagementClient(credential, twin.subscription, base_url=twin.url).resource_groups.create_or_update(
            "refuse-rg", {"location": LOCATION}
        )
        storage = StorageManagementClient(credential, twin.subscription, base_url=twin.url)
        standard = storage.storage_accounts.begin_create(
            "refuse-rg", "cbrefusestd", {"location": LOCATION, "kind": "StorageV2", "sku": {"name": "Standard_LRS"}}
        ).result()
        with pytest.raises(HttpResponseError) as nfs_on_standard:
            storage.file_shares.create("refuse-rg", standard.name, "data", FileShare(enabled_protocols="NFS"))
        assert "FileStorage" in str(nfs_on_standard.value)
        with pytest.raises(HttpResponseError) as no_endpoint:
            storage.storage_accounts.begin_create(
                "refuse-rg",
                "cbrefuseacl",
                StorageAccountCreateParameters(
                    location=LOCATION,
                    kind="FileStorage",
                    sku=Sku(name="Premium_LRS"),
                    network_rule_set=NetworkRuleSet(
                        default_action="Deny",
                        virtual_network_rules=[
                            VirtualNetworkRule(virtual_network_resource_id=subnet_id(twin, "nodes"))
                        ],
                    ),
                ),
            ).result()
        assert no_endpoint.value.error.code == "NetworkAclsValidationFailure"
        with pytest.raises(HttpResponseError) as taken:
            storage.storage_accounts.begin_create(
                "net-rg", "cbrefusestd", {"location": LOCATION, "kind": "StorageV2", "sku": {"name": "Standard_LRS"}}
            ).result()
        assert taken.value.error.code == "StorageAccountAlreadyTaken"
        storage.storage_accounts.delete("refuse-rg", standard.name)
