"""A cluster in a subscription it shares with others, against the ARM twin's strict switches (realcloud
review B9, D10), brought up by an operator whose rights are the cluster's resource groups and the
network's, not the subscription:

- **Addresses**: ARM lists only the NICs the caller may read; another team's NIC in the cluster's
  subnet, in a group the operator cannot read, holds its address all the same.
- **Throttling** (twins/azure/throttle.py, ON by default): a read per VM of a 13-VM cluster is past
  the twin's allowance, so the cluster's power states must come from lists, and whatever is refused
  must be waited out as Retry-After says (the SDK's retry policy; the head's power program:
  test_azure_elastic.py).
- **Policy**: a deny assignment on what the cluster needs ("secure transfer" on the NFS account,
  "Key Vault should use RBAC") must be said plainly.
"""

from __future__ import annotations

import uuid

import pytest
from azuretest import (
    LOCATION,
    NET_GROUP,
    example_config,
    inventory,
    needs_sdk,
    new_subnet,
    of_type,
    one_node_config,
    run_cb,
    storage_subnet,
)
from clitest import run_cli

pytestmark = needs_sdk
CLUSTER = "scaledemo"
RG = f"{CLUSTER}-rg"
NODES = 12  # and the head: 13 VMs, a read each is past the default allowance (throttle.py)
V = "api-version=2024-07-01"
GROUPS = "api-version=2022-09-01"


def _put(twin, path: str, body: dict, api: str = V) -> dict:
    status, answer, _ = twin.request("PUT", f"{path}?{api}", body, token=twin.token())
    assert status in (200, 201), answer
    return answer


def _nic(twin, group: str, name: str, subnet: str, address: str) -> str:
    path = f"/subscriptions/{twin.subscription}/resourceGroups/{group}/providers/Microsoft.Network/networkInterfaces"
    config = {"subnet": {"id": subnet}, "privateIPAllocationMethod": "Static", "privateIPAddress": address}
    body = {"location": LOCATION, "properties": {"ipConfigurations": [{"name": "ip", "properties": config}]}}
    return _put(twin, f"{path}/{name}", body)["id"]


def _grant(twin, principal: str, actions: list[str], scopes: list[str]) -> None:
    """A custom role of `actions` for `principal` at each of `scopes` (the controller, the owner, grants it)."""
    sub = f"/subscriptions/{twin.subscription}"
    role = str(uuid.uuid4())
    properties = {"roleName": f"ops-{role}", "permissions": [{"actions": actions}], "assignableScopes": [sub]}
    definition = f"{sub}/providers/Microsoft.Authorization/roleDefinitions/{role}"
    _put(twin, definition, {"properties": properties}, "api-version=2022-04-01")
    for scope in scopes:
        assignment = {"roleDefinitionId": definition, "principalId": principal, "principalType": "ServicePrincipal"}
        _put(twin, f"{scope}/providers/Microsoft.Authorization/roleAssignments/{uuid.uuid4()}",
             {"properties": assignment}, "api-version=2022-04-01")  # fmt: skip


def _operator(twin) -> dict[str, str]:
    """The environment of an operator with every right on the cluster's two resource groups (made for it, as a
    subscription's owner would) and read and subnet join on the network's: a managed identity's token."""
    sub = f"/subscriptions/{twin.subscription}"
    identities = f"{sub}/resourceGroups/{NET_GROUP}/providers/Microsoft.ManagedIdentity/userAssignedIdentities"
    operator = _put(twin, f"{identities}/{CLUSTER}-operator", {"location": LOCATION}, "api-version=2023-01-31")
    nodes_rg = f"{RG}-{CLUSTER}-nodes"
    for group, more in ((RG, {}), (nodes_rg, {"clusterbake-created": "true"})):
        _put(twin, f"{sub}/resourceGroups/{group}", {"location": LOCATION,
             "tags": {"clusterbake-cluster": CLUSTER, **more}}, GROUPS)  # fmt: skip
    principal = operator["properties"]["principalId"]
    _grant(twin, principal, ["*"], [f"{sub}/resourceGroups/{RG}", f"{sub}/resourceGroups/{nodes_rg}"])
    _grant(twin, principal, ["*/read", "Microsoft.Network/virtualNetworks/subnets/join/action"],
           [f"{sub}/resourceGroups/{NET_GROUP}"])  # fmt: skip
    return twin.env | {"AZURE_CLIENT_ID": operator["properties"]["clientId"]}


@pytest.fixture(scope="module")
def shared(twin, tmp_path_factory):
    """A head and 12 nodes on a subnet that also holds another team's NIC (in a group the operator cannot
    read, at the subnet's top address) and one of the network's own (readable), up for the module."""
    sub = f"/subscriptions/{twin.subscription}"
    subnet = new_subnet(twin, "scale", "10.70.32.0/24")
    _put(twin, f"{sub}/resourceGroups/otherteam-rg", {"location": LOCATION}, GROUPS)
    theirs = _nic(twin, "otherteam-rg", "theirs", subnet, "10.70.32.254")
    ours = _nic(twin, NET_GROUP, "shared-nic", subnet, "10.70.32.253")
    env = _operator(twin)
    config = example_config(twin, cluster_name=CLUSTER)
    config["azure"] |= {"resource_group": RG, "subnet_id": subnet}
    config["head"] = {"instance_type": "Standard_D2s_v5"}
    config["node_groups"] = [{"name": "cpu", "count": NODES, "instance_type": "Standard_D2s_v5"}]
    config["partitions"] = [{"name": "cpu", "node_groups": ["cpu"], "default": True}]
    config["recovery"] = {"replace_lost_nodes": False}  # no power identity: its role is the subscription's to give
    state_dir = tmp_path_factory.mktemp("state-shared")
    up = run_cli(env, state_dir, config, "cluster", "up", "--provision-only", check=False, timeout=180)
    try:
        yield {"env": env, "state_dir": state_dir, "config": config, "up": up, "path": state_dir / f"{CLUSTER}.yaml"}
    finally:
        run_cli(env, state_dir, config, "cluster", "down", check=True, timeout=180)
        for nic in (theirs, ours):
            twin.request("DELETE", f"{nic}?{V}", token=twin.token())
        twin.request("DELETE", f"{sub}/resourceGroups/otherteam-rg?{GROUPS}", token=twin.token())


def test_an_address_held_in_a_group_the_operator_cannot_read_is_not_given_out(twin, shared):
    """B9: addresses in use were read from a subscription-wide NIC listing, which ARM answers with the NICs
    the caller may read: the other team's address was given to the head, whose NIC Azure then refused."""
    up = shared["up"]
    assert up.returncode == 0, up.stdout + up.stderr
    assert "1 IP configuration(s) of the subnet not readable here" in up.stderr
    nics = of_type(twin.resources_of(CLUSTER), "Microsoft.Network/networkInterfaces")
    addresses = {n["tags"]["clusterbake-name"]: n["properties"]["ipConfigurations"][0]["properties"]
                 ["privateIPAddress"] for n in nics}  # fmt: skip
    assert addresses["head"] == "10.70.32.252" and addresses["cpu-1"] == "10.70.32.251"
    assert len(set(addresses.values())) == NODES + 1 and not {"10.70.32.254", "10.70.32.253"} & set(addresses.values())


def test_power_states_come_from_lists_not_a_read_per_vm(twin, shared):
    """B9: an instance view per VM on every inventory load; Azure throttles such bursts (429). With the
    operator's rights, ARM's subscription-wide status listing still holds the cluster's VMs."""
    defaults = twin.throttle()["policies"]
    assert twin.throttle(defaults)["refused"] == 0  # the default allowance, counted from now
    as_operator = {"AZURE_CLIENT_ID": shared["env"]["AZURE_CLIENT_ID"]}
    hostvars = inventory(twin, shared["state_dir"], shared["path"], **as_operator)["_meta"]["hostvars"]
    assert len(hostvars) == NODES + 1
    assert {h["clusterbake_power_state"] for h in hostvars.values()} == {"running"}
    assert twin.throttle()["refused"] == 0


def test_the_sdk_clients_wait_as_retry_after_says(twin, shared, monkeypatch):
    """Past the allowance ARM answers 429 with Retry-After: the product's clients (azure-core's retry policy, as
    api.Clients makes them) wait that long and go on."""
    import time

    from clusterbake.config import load_config
    from clusterbake.providers.azure.provider import AzureProvider
    from clusterbake.state import StateDir

    for key, value in twin.env.items():
        monkeypatch.setenv(key, value)
    provider = AzureProvider(load_config(shared["path"]), StateDir(shared["state_dir"]))
    first = list(provider.cluster_vms().values())[:3]
    defaults = twin.throttle()["policies"]
    twin.throttle({"LowCostGet": {"limit": 2, "seconds": 1}})
    try:
        started = time.monotonic()
        read = [provider.clients.compute.virtual_machines.get(vm["group"], vm["name"]).id for vm in first]
        waited = time.monotonic() - started
        refused = twin.throttle()["refused"]
    finally:
        twin.throttle(defaults)
    assert read == [vm["id"] for vm in first]
    assert refused > 0 and waited >= 1.0  # refused, then waited out as Retry-After said


# --- Azure Policy denials ------------------------------------------------------------------------------

SECURE_TRANSFER = {
    "name": "deny-http-storage",
    "displayName": "Secure transfer to storage accounts should be enabled",
    "definition": "404c3081-a854-4457-ae30-26a93ef643f9",
    "resourceType": "Microsoft.Storage/storageAccounts",
    "field": "properties.supportsHttpsTrafficOnly",
    "equals": False,
}
VAULT_RBAC = {
    "name": "kv-rbac",
    "displayName": "Azure Key Vault should use RBAC permission model",
    "definition": "12d4fa5e-1f9f-4c21-97a9-b99b3c6611b5",
    "resourceType": "Microsoft.KeyVault/vaults",
    "field": "properties.enableRbacAuthorization",
    "notEquals": True,
}


def _denied(said: str, noun: str, assignment: dict, scope: str, refused: str, why: str) -> None:
    assert f"Azure Policy denied {noun} " in said, said
    assert f"assignment '{assignment['displayName']}' at {scope}" in said
    assert f"refuses {refused}" in said and f"The cluster needs it so: {why}" in said
    assert f"exemption of resource group {scope.rsplit('/', 1)[-1]} from that assignment" in said
    assert "Traceback" not in said


def test_a_policy_denial_names_the_assignment_and_what_the_cluster_needs(twin, tmp_path):
    """B9: an organisation's deny assignments on what the cluster makes on purpose: the NFS share's account
    without secure transfer, then (that one exempted) the vault with access policies."""
    cluster = "polfiles"
    subnet = storage_subnet(twin, f"{cluster}-nodes", "10.70.41.0/24")
    config = one_node_config(twin, cluster, subnet, [{"name": "home", "mount_point": "/home", "type": "azure_files"}])
    config["recovery"] = {"replace_lost_nodes": False}
    scope = f"/subscriptions/{twin.subscription}/resourceGroups/{cluster}-rg"
    assignments = [SECURE_TRANSFER | {"scope": scope}, VAULT_RBAC | {"scope": scope}]
    runs = []
    try:
        for active in (assignments, assignments[1:]):
            status, body, _ = twin.request("PUT", "/_twin/policies", active)
            assert status == 200, body
            runs.append(run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only", check=False))
    finally:
        twin.request("PUT", "/_twin/policies", [])
        run_cb(twin, tmp_path, config, "cluster", "down")
    assert [run.returncode for run in runs] == [1, 1], [run.stderr for run in runs]
    _denied(runs[0].stderr, "storage account", SECURE_TRANSFER, scope, "properties.supportsHttpsTrafficOnly = false",
            "NFS Azure Files shares (storage type azure_files) carry no TLS")  # fmt: skip
    assert "or use another storage type than azure_files" in runs[0].stderr
    vault_why = "the cluster's key vault grants the nodes' identity read of their join bundles by access policy"
    _denied(runs[1].stderr, "key vault", VAULT_RBAC, scope, "properties.enableRbacAuthorization = false", vault_why)
