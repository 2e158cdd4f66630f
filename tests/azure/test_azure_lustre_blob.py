"""`amlfs` and `azure_blob` storage: Azure Managed Lustre file systems and Blob Storage containers made by
`cluster up`, the nodes' identity granted its data role, found by the inventory, removed by `cluster
down`, through the real CLI and SDK (azure-mgmt-storagecache, -storage, -authorization) against the ARM
twin (conftest.py).

The fake enforces what Azure requires (the SKU's size steps, one zone, a maintenance window, the subnet
check of checkAmlFSSubnets; private containers; role assignments by GUID at an existing scope) and
serves the blob service the nodes' blobfuse2 asks first: its answers depend on the account's network
rules and on the identity's role assignments (twins/azure/blob.py). A file system's servers reach only the
nodes whose NSGs admit them on Lustre's ports (`GET /_twin/amlfs`, what the twin's nodes' mounts obey:
twins/azure/lustre.py), and a file system in a subnet with NICs is a twin warning (`GET /_twin/state`).
"""

from __future__ import annotations

import http.client
import ssl
import urllib.parse

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

pytestmark = needs_sdk
CLUSTER = "lustreblob"
RG = "lustreblob-rg"
STORAGE_SUBNET = "lustre-nodes"
STORAGE_PREFIX = "10.70.30.0/24"
LUSTRE_PORTS = ["988", "1019-1023"]
SHARED_SUBNET_WARNING = "the Managed Lustre file system goes into the cluster's subnet"
READER = "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1"
CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
STORAGE = [
    {"name": "home", "mount_point": "/home", "type": "nfs"},
    {"name": "scratch", "mount_point": "/scratch", "type": "amlfs", "sku": "AMLFS-Durable-Premium-250",
     "storage_capacity_tib": 16, "zone": "2", "maintenance_day": "Saturday", "maintenance_time_utc": "03:30"},
    {"name": "datasets", "mount_point": "/datasets", "type": "azure_blob", "read_only": True},
    {"name": "checkpoints", "mount_point": "/checkpoints", "type": "azure_blob", "container": "ckpt-2026"},
]  # fmt: skip


@pytest.fixture(scope="module")
def storage_subnet(twin) -> str:
    """A subnet of the existing network with the Microsoft.Storage service endpoint."""
    return make_storage_subnet(twin, STORAGE_SUBNET, STORAGE_PREFIX)


@pytest.fixture(scope="module")
def lustre_subnet(twin) -> str:
    """A subnet of the file system's own (16 TiB: Microsoft's table wants a /27)."""
    return make_storage_subnet(twin, "lustre-own", "10.70.31.0/27")


def _config(twin, subnet_id: str, storage=STORAGE, cluster: str = CLUSTER) -> dict:
    config = one_node_config(twin, cluster, subnet_id, storage)
    config["azure"].pop("zone", None)
    return config


@pytest.fixture(scope="module")
def made(twin, storage_subnet, tmp_path_factory):
    yield from provisioned(twin, tmp_path_factory.mktemp("state-lustreblob"), _config(twin, storage_subnet), CLUSTER)


def _of(twin, kind: str, cluster: str = CLUSTER) -> list[dict]:
    return of_type(twin.resources_of(cluster), kind)


def _identity(twin, cluster: str = CLUSTER) -> dict:
    (identity,) = [i for i in _of(twin, "Microsoft.ManagedIdentity/userAssignedIdentities", cluster)
                   if i["name"].endswith("-nodes")]  # fmt: skip
    return identity["properties"]


def _assignments(twin, principal: str) -> list[dict]:
    return [a for a in twin.state()["role_assignments"].values() if a["properties"]["principalId"] == principal]


def _lustre_rules(twin, cluster: str = CLUSTER) -> dict[str, dict]:
    (nsg,) = _of(twin, "Microsoft.Network/networkSecurityGroups", cluster)
    return {r["name"]: r["properties"] for r in nsg["properties"]["securityRules"] if r["name"].startswith("amlfs-")}


def _node_addresses(twin, cluster: str = CLUSTER) -> list[str]:
    return sorted(c["properties"]["privateIPAddress"] for n in _of(twin, "Microsoft.Network/networkInterfaces", cluster)
                  for c in n["properties"]["ipConfigurations"])  # fmt: skip


def _reached(twin, fs: dict) -> dict[str, str | None]:
    """Each NIC address of the file system's network: None when its servers reach it, else the twin's why."""
    status, body, _ = twin.request("GET", "/_twin/amlfs")
    assert status == 200, body
    return body[fs["id"]]["clients"]


# --- the config -------------------------------------------------------------------------------


def test_amlfs_and_azure_blob_are_azure_storage_types_only():
    from clusterbake.config import ClusterConfig

    base = {"cluster_name": "x", "node_groups": [{"name": "cpu", "count": 1}], "provider": "local"}
    for entry in STORAGE[1:3]:
        with pytest.raises(ValueError, match=rf"storage\.0\.type: {entry['type']} is not for provider local"):
            ClusterConfig.model_validate({**base, "storage": [entry]})


def test_a_created_file_system_needs_a_zone(twin, storage_subnet, tmp_path):
    entry = {k: v for k, v in STORAGE[1].items() if k != "zone"}
    config = _config(twin, storage_subnet, [entry], cluster="nozone")
    result = run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only", check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "storage.0.zone: Azure Managed Lustre file systems live in one availability zone" in result.stderr


def test_azures_subnet_check_refuses_a_small_subnet_before_anything_is_made(twin, storage_subnet, tmp_path):
    # 10.70.9.0/29 ("tiny"): Microsoft's table wants a /26 or larger for 20-40 TiB.
    entry = {**STORAGE[1], "storage_capacity_tib": 32, "subnet_id": subnet_id(twin, "tiny")}
    config = _config(twin, storage_subnet, [entry], cluster="smallnet")
    result = run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only", check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "storage.0 (scratch).subnet_id: Azure refuses the subnet for the Managed Lustre file system" in result.stderr
    assert "is too small for a 32 TiB file system: it needs a /26 or larger" in result.stderr
    assert twin.resources_of("smallnet") == []


def test_an_existing_account_must_hold_the_container(twin, storage_subnet, tmp_path):
    entry = {**STORAGE[2], "storage_account": "cbnosuchaccount"}
    config = _config(twin, storage_subnet, [entry], cluster="noaccount")
    result = run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only", check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "storage.0 (datasets): storage account cbnosuchaccount does not exist in resource group" in result.stderr
    assert twin.resources_of("noaccount") == []


# --- what cluster up made -----------------------------------------------------------------------


def test_the_managed_lustre_file_system_as_microsoft_documents_it(twin, made, storage_subnet):
    (fs,) = _of(twin, "Microsoft.StorageCache/amlFilesystems")
    assert fs["name"] == f"clusterbake-{CLUSTER}-scratch"
    assert fs["sku"] == {"name": "AMLFS-Durable-Premium-250"} and fs["zones"] == ["2"]
    props = fs["properties"]
    assert props["storageCapacityTiB"] == 16
    assert props["filesystemSubnet"].lower() == storage_subnet.lower()
    assert props["maintenanceWindow"] == {"dayOfWeek": "Saturday", "timeOfDayUTC": "03:30"}
    assert props["rootSquashSettings"] == {"mode": "None"}
    assert props["provisioningState"] == "Succeeded"
    assert fs["tags"] == {"clusterbake-cluster": CLUSTER}
    output = made["first"].stdout + made["first"].stderr
    assert f"creating Managed Lustre {fs['name']} (16 TiB AMLFS-Durable-Premium-250, zone 2;" in output
    assert "nodes' identity: Storage Blob Data Reader on " in output


def test_the_clusters_blob_account_admits_only_the_subnet_and_entra_id(twin, made, storage_subnet):
    accounts = _of(twin, "Microsoft.Storage/storageAccounts")
    (account,) = [a for a in accounts if a["kind"] == "StorageV2"]
    props = account["properties"]
    assert account["sku"]["name"] == "Standard_LRS"
    assert props["supportsHttpsTrafficOnly"] is True and props["minimumTlsVersion"] == "TLS1_2"
    assert props["allowSharedKeyAccess"] is False and props["allowBlobPublicAccess"] is False
    assert props["networkAcls"]["defaultAction"] == "Deny"
    assert [r["id"].lower() for r in props["networkAcls"]["virtualNetworkRules"]] == [storage_subnet.lower()]
    containers = {
        c["name"]: c
        for c in twin.state()["resources"].values()
        if c["type"] == "Microsoft.Storage/storageAccounts/blobServices/containers"
        and c["id"].lower().startswith(account["id"].lower() + "/")
    }
    assert set(containers) == {"datasets", "ckpt-2026"}
    assert {c["properties"]["publicAccess"] for c in containers.values()} == {"None"}


def test_the_nodes_identity_gets_reader_or_contributor_on_each_container(twin, made):
    identity = _identity(twin)
    roles = {
        a["properties"]["scope"].rsplit("/", 1)[-1]: a["properties"]["roleDefinitionId"].rsplit("/", 1)[-1]
        for a in _assignments(twin, identity["principalId"])
    }
    assert roles == {"datasets": READER, "ckpt-2026": CONTRIBUTOR}
    for assignment in _assignments(twin, identity["principalId"]):
        assert assignment["properties"]["principalType"] == "ServicePrincipal"
        assert "/blobServices/default/containers/" in assignment["properties"]["scope"]


def test_inventory_names_what_the_nodes_mount(twin, made):
    (fs,) = _of(twin, "Microsoft.StorageCache/amlFilesystems")
    (account,) = [a for a in _of(twin, "Microsoft.Storage/storageAccounts") if a["kind"] == "StorageV2"]
    result = inventory(twin, made["state_dir"], made["path"])
    variables = result["all"]["vars"]
    endpoints = variables["clusterbake_storage_endpoints"]
    mgs = fs["properties"]["clientInfo"]["mgsAddress"]
    assert mgs.startswith("10.70.30.")
    assert endpoints["scratch"] == {"mgs_address": mgs, "fs_name": "lustrefs", "file_system": fs["name"]}
    blob = f"https://{account['name']}.blob.core.windows.net"
    assert endpoints["datasets"] == {"account": account["name"], "container": "datasets", "endpoint": blob,
                                     "read_only": True}  # fmt: skip
    assert endpoints["checkpoints"]["container"] == "ckpt-2026" and endpoints["checkpoints"]["read_only"] is False
    assert variables["blobfuse2_identity_client_id"] == _identity(twin)["clientId"]


def test_the_file_systems_address_is_no_nodes(twin, made):
    (fs,) = _of(twin, "Microsoft.StorageCache/amlFilesystems")
    nics = twin.state()["resources"].values()
    taken = {c["properties"]["privateIPAddress"] for n in nics if n["type"] == "Microsoft.Network/networkInterfaces"
             for c in n["properties"]["ipConfigurations"]}  # fmt: skip
    assert fs["properties"]["clientInfo"]["mgsAddress"] not in taken


def test_the_nsg_lets_the_file_systems_servers_reach_every_node(twin, made):
    """Azure Managed Lustre's servers open connections to their clients on TCP 988 and 1019-1023; the cluster's
    NSG denies the rest of the network (deny-vnet), so it admits them from the file system's subnet first."""
    (fs,) = _of(twin, "Microsoft.StorageCache/amlFilesystems")
    reached = _reached(twin, fs)
    assert len(_node_addresses(twin)) == 2  # the head and cpu-1
    assert {a: reached[a] for a in _node_addresses(twin)} == dict.fromkeys(_node_addresses(twin))
    (nsg,) = _of(twin, "Microsoft.Network/networkSecurityGroups")
    (asg,) = _of(twin, "Microsoft.Network/applicationSecurityGroups")
    rules = {r["name"]: r["properties"] for r in nsg["properties"]["securityRules"]}
    lustre = rules["amlfs-0"]
    assert (lustre["direction"], lustre["access"], lustre["protocol"]) == ("Inbound", "Allow", "Tcp")
    assert lustre["sourceAddressPrefix"] == STORAGE_PREFIX and lustre["destinationPortRanges"] == LUSTRE_PORTS
    assert lustre["destinationApplicationSecurityGroups"] == [{"id": asg["id"]}]
    assert lustre["priority"] < rules["deny-vnet"]["priority"]
    assert list(_lustre_rules(twin)) == ["amlfs-0"]


def test_a_file_system_in_the_clusters_subnet_is_warned_about(twin, made, storage_subnet):
    """Azure allows it (the prerequisites let compute share the file system's subnet); clusterbake warns at
    `cluster up` and the twin notes it."""
    (fs,) = _of(twin, "Microsoft.StorageCache/amlFilesystems")
    assert (
        f"warning: storage.1 (scratch): {SHARED_SUBNET_WARNING} (azure.subnet_id)"
        in made["first"].stdout + made["first"].stderr
    )
    (noted,) = [w for w in twin.state()["warnings"] if w["target"] == fs["id"]]
    assert noted["code"] == "AmlfsSubnetShared"
    nics = {n["id"] for n in _of(twin, "Microsoft.Network/networkInterfaces")}
    assert nics <= set(noted["nics"]) and storage_subnet in noted["message"]


def test_an_older_clusters_nsg_gets_the_lustre_rule_once(twin, made):
    """A cluster made before the rule existed: the twin's file system cannot reach its nodes through the old
    NSG; the next `cluster up` adds the rule (and the run after it changes nothing: the next test)."""
    from azure.identity import DefaultAzureCredential
    from azure.mgmt.network import NetworkManagementClient

    (fs,) = _of(twin, "Microsoft.StorageCache/amlFilesystems")
    (nsg,) = _of(twin, "Microsoft.Network/networkSecurityGroups")
    old_rules = [{"name": r["name"], "properties": r["properties"]} for r in nsg["properties"]["securityRules"]
                 if not r["name"].startswith("amlfs-")]  # fmt: skip
    with twin.sdk_env():
        network = NetworkManagementClient(DefaultAzureCredential(), twin.subscription, base_url=twin.url)
        network.network_security_groups.begin_create_or_update(
            RG, nsg["name"], {"location": LOCATION, "tags": nsg["tags"], "properties": {"securityRules": old_rules}}
        ).result()
    nodes = _node_addresses(twin)
    reached = _reached(twin, fs)
    for address in nodes:
        assert f"rule deny-vnet (priority 4000) of network security group {nsg['name']} denies inbound TCP 988 " \
               f"from {fs['properties']['clientInfo']['mgsAddress']} to {address}" in reached[address]  # fmt: skip
    # The strict behaviour is a switch (on by default): off, the twin lets the servers through as before.
    assert twin.request("PUT", "/_twin/strict", {"amlfs_nsg": False})[0] == 200
    try:
        assert [_reached(twin, fs)[a] for a in nodes] == [None, None]
    finally:
        assert twin.request("PUT", "/_twin/strict", {"amlfs_nsg": True})[0] == 200
    again = run_cb(twin, made["state_dir"], made["config"], "cluster", "up", "--provision-only")
    assert f"network security group {nsg['name']} updated" in again.stderr
    assert f"Lustre from {STORAGE_PREFIX}" in again.stderr
    assert list(_lustre_rules(twin)) == ["amlfs-0"]
    assert [_reached(twin, fs)[a] for a in nodes] == [None, None]


def test_rerun_creates_no_storage_and_no_role_assignment(twin, made):
    before = {r["id"]: r["etag"] for r in _of(twin, "Microsoft.Storage/storageAccounts")}
    assignments = sorted(twin.state()["role_assignments"])
    again = run_cb(twin, made["state_dir"], made["config"], "cluster", "up", "--provision-only")
    output = again.stdout + again.stderr
    for made_word in ("creating Managed Lustre", "creating storage account", "creating blob container",
                      "Storage Blob Data", "network security group"):  # fmt: skip
        assert made_word not in output
    assert {r["id"]: r["etag"] for r in _of(twin, "Microsoft.Storage/storageAccounts")} == before
    assert sorted(twin.state()["role_assignments"]) == assignments


# --- the blob service blobfuse2 asks first (what the twin's stand-in relies on) ------------------


def _list_blobs(twin, account: str, container: str, token: str | None) -> tuple[int, str]:
    """List Blobs through the twin's proxy, as a client outside the virtual network (the controller)."""
    proxy = urllib.parse.urlsplit(twin.env["HTTPS_PROXY"])
    connection = http.client.HTTPSConnection(
        proxy.hostname, proxy.port, context=ssl.create_default_context(cafile=twin.endpoints["ca_file"])
    )
    connection.set_tunnel(f"{account}.blob.core.windows.net", 443)
    headers = {"x-ms-version": "2021-08-06", **({"Authorization": f"Bearer {token}"} if token else {})}
    connection.request("GET", f"/{container}?restype=container&comp=list", headers=headers)
    response = connection.getresponse()
    response.read()
    return response.status, response.getheader("x-ms-error-code") or ""


def test_blob_service_applies_network_rules_and_role_assignments(twin, made):
    from azure.identity import DefaultAzureCredential
    from azure.mgmt.storage import StorageManagementClient
    from azure.mgmt.storage.models import NetworkRuleSet, StorageAccountUpdateParameters, VirtualNetworkRule

    (account,) = [a for a in _of(twin, "Microsoft.Storage/storageAccounts") if a["kind"] == "StorageV2"]
    identity = _identity(twin)
    node_token = twin.token(identity["clientId"], resource="https://storage.azure.com")
    # The controller is outside the subnet the account admits.
    assert _list_blobs(twin, account["name"], "datasets", node_token) == (403, "AuthorizationFailure")
    with twin.sdk_env():
        storage = StorageManagementClient(DefaultAzureCredential(), twin.subscription, base_url=twin.url)
        storage.storage_accounts.update(
            RG, account["name"], StorageAccountUpdateParameters(network_rule_set=NetworkRuleSet(default_action="Allow"))
        )
        try:
            assert _list_blobs(twin, account["name"], "datasets", None) == (401, "NoAuthenticationInformation")
            assert _list_blobs(twin, account["name"], "datasets", node_token) == (200, "")
            assert _list_blobs(twin, account["name"], "nosuch", node_token) == (404, "ContainerNotFound")
            # The controller's own identity has no data role on the container (a role, not ownership, decides).
            controller = twin.token(resource="https://storage.azure.com")
            assert _list_blobs(twin, account["name"], "datasets", controller) == (
                403,
                "AuthorizationPermissionMismatch",
            )
        finally:
            (rule,) = account["properties"]["networkAcls"]["virtualNetworkRules"]
            storage.storage_accounts.update(
                RG,
                account["name"],
                StorageAccountUpdateParameters(
                    network_rule_set=NetworkRuleSet(
                        default_action="Deny",
                        virtual_network_rules=[VirtualNetworkRule(virtual_network_resource_id=rule["id"])],
                    )
                ),
            )
    assert _list_blobs(twin, account["name"], "datasets", node_token) == (403, "AuthorizationFailure")


# --- cluster down -----------------------------------------------------------------------------------


def test_down_deletes_the_file_system_the_account_and_the_role_assignments(
    twin, made, storage_subnet, lustre_subnet, tmp_path
):
    # The file system in a subnet of its own, and the first cluster's as an existing one (by its MGS address).
    (shared,) = _of(twin, "Microsoft.StorageCache/amlFilesystems")
    existing = {"name": "shared", "mount_point": "/shared-scratch", "type": "amlfs",
                "mgs_address": shared["properties"]["clientInfo"]["mgsAddress"]}  # fmt: skip
    storage = [STORAGE[0], {**STORAGE[1], "subnet_id": lustre_subnet}, *STORAGE[2:], existing]
    config = _config(twin, storage_subnet, storage, cluster="lbdown")
    up = run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only")
    assert SHARED_SUBNET_WARNING not in up.stdout + up.stderr
    rules = _lustre_rules(twin, "lbdown")
    assert [(r["sourceAddressPrefix"], r["destinationPortRanges"]) for r in rules.values()] == [
        ("10.70.31.0/27", LUSTRE_PORTS),
        (STORAGE_PREFIX, LUSTRE_PORTS),
    ]
    (own,) = _of(twin, "Microsoft.StorageCache/amlFilesystems", "lbdown")
    assert own["properties"]["clientInfo"]["mgsAddress"].startswith("10.70.31.")
    for fs in (own, shared):
        assert {a: _reached(twin, fs)[a] for a in _node_addresses(twin, "lbdown")} == dict.fromkeys(
            _node_addresses(twin, "lbdown")
        )
    assert own["id"] not in {w["target"] for w in twin.state()["warnings"]}  # no NIC in its subnet
    principal = _identity(twin, "lbdown")["principalId"]
    assert len(_assignments(twin, principal)) == 2
    down = run_cb(twin, tmp_path, config, "cluster", "down")
    assert "role assignment of identity clusterbake-lbdown-nodes" in down.stdout + down.stderr
    assert twin.resources_of("lbdown") == []
    assert _assignments(twin, principal) == []


def test_down_keeps_what_an_entry_retains(twin, storage_subnet, tmp_path):
    elsewhere = {"name": "elsewhere", "mount_point": "/elsewhere", "type": "amlfs", "mgs_address": "10.99.0.4"}
    storage = [STORAGE[0], {**STORAGE[1], "retain": True}, {**STORAGE[2], "retain": True}, elsewhere]
    config = _config(twin, storage_subnet, storage, cluster="lbkeep")
    up = run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only")
    # An existing file system the subscription does not hold: the NSG cannot admit its servers by itself.
    assert "warning: storage.3 (elsewhere): no Managed Lustre file system of subscription" in up.stderr
    assert "has MGS address 10.99.0.4, so the nodes' NSG does not admit its servers' connections" in up.stderr
    assert list(_lustre_rules(twin, "lbkeep")) == ["amlfs-0"]
    down = run_cb(twin, tmp_path, config, "cluster", "down")
    left = twin.resources_of("lbkeep")
    kept = sorted((r["type"], r["name"]) for r in left)
    assert [t for t, _ in kept] == ["Microsoft.Storage/storageAccounts", "Microsoft.StorageCache/amlFilesystems"]
    for _, name in kept:
        assert f"keeping {name}" in down.stdout + down.stderr
    # Clean up what the test kept, as a person would once the data is safe.
    for resource in left:
        version = "2024-07-01" if "StorageCache" in resource["type"] else "2023-05-01"
        status, _, _ = twin.request("DELETE", f"{resource['id']}?api-version={version}", token=twin.token())
        assert status in (200, 202, 204)


def test_fake_refuses_what_azure_refuses_for_managed_lustre(twin, storage_subnet):
    from azure.core.exceptions import HttpResponseError
    from azure.identity import DefaultAzureCredential
    from azure.mgmt.resource.resources import ResourceManagementClient
    from azure.mgmt.storagecache import StorageCacheManagementClient

    good = {
        "location": LOCATION,
        "sku": {"name": "AMLFS-Durable-Premium-500"},
        "zones": ["1"],
        "properties": {
            "storageCapacityTiB": 4,
            "filesystemSubnet": storage_subnet,
            "maintenanceWindow": {"dayOfWeek": "Sunday", "timeOfDayUTC": "22:00"},
        },
    }
    bad = {
        "size step": {**good, "properties": {**good["properties"], "storageCapacityTiB": 6}},
        "no zone": {**good, "zones": []},
        "sku": {**good, "sku": {"name": "AMLFS-Durable-Premium-1000"}},
        "window": {**good, "properties": {**good["properties"], "maintenanceWindow": {"dayOfWeek": "Someday"}}},
    }
    with twin.sdk_env():
        credential = DefaultAzureCredential()
        ResourceManagementClient(credential, twin.subscription, base_url=twin.url).resource_groups.create_or_update(
            "amlfs-refuse-rg", {"location": LOCATION}
        )
        client = StorageCacheManagementClient(credential, twin.subscription, base_url=twin.url)
        for what, body in bad.items():
            with pytest.raises(HttpResponseError) as refused:
                client.aml_filesystems.begin_create_or_update("amlfs-refuse-rg", "fs1", body).result()
            assert refused.value.error.code == "InvalidParameter", what
        fs = client.aml_filesystems.begin_create_or_update("amlfs-refuse-rg", "fs1", good).result()
        assert fs.properties.client_info.mgs_address.startswith("10.70.30.")
        with pytest.raises(HttpResponseError) as grown:
            body = {**good, "properties": {**good["properties"], "storageCapacityTiB": 8}}
            client.aml_filesystems.begin_create_or_update("amlfs-refuse-rg", "fs1", body).result()
        assert "cannot be changed" in str(grown.value)
        client.aml_filesystems.begin_delete("amlfs-refuse-rg", "fs1").result()


def test_a_managed_identity_may_only_do_what_its_roles_allow_on_arm(twin, made):
    """The twin's ARM authorizes a managed identity's requests by its role assignments, as ARM does: the
    nodes' identity holds only Storage Blob Data roles on two containers."""
    identity = _identity(twin)
    token = twin.token(identity["clientId"])
    (account,) = [a for a in _of(twin, "Microsoft.Storage/storageAccounts") if a["kind"] == "StorageV2"]
    status, body, _ = twin.request("GET", f"{account['id']}?api-version=2023-05-01", token=token)
    assert status == 403 and body["error"]["code"] == "AuthorizationFailed"
    assert "'Microsoft.Storage/storageAccounts/read'" in body["error"]["message"]
    container = f"{account['id']}/blobServices/default/containers/datasets"
    status, body, _ = twin.request("GET", f"{container}?api-version=2023-05-01", token=token)
    assert status == 200 and body["name"] == "datasets"  # .../containers/read: both Storage Blob Data roles have it
    status, body, _ = twin.request("DELETE", f"{container}?api-version=2023-05-01", token=token)
    assert status == 403 and "'Microsoft.Storage/storageAccounts/blobServices/containers/delete'" in body["error"][
        "message"]  # fmt: skip
    (vm,) = [v for v in _of(twin, "Microsoft.Compute/virtualMachines") if v["tags"]["clusterbake-name"] == "head"]
    assert vm["systemData"]["createdByType"] == "Application"  # the controller made it
