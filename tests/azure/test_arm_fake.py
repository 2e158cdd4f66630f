"""The ARM twin speaks ARM: URL shapes, api-version, auth, long-running operations, errors, paging,
and Azure's rules (raw HTTPS requests, so the wire format itself is checked, not the SDK's view)."""

from __future__ import annotations

import json
import time

import pytest
from azuretest import LOCATION, NET_GROUP, SUBNET, VNET, RawArm, Twin, needs_sdk

pytestmark = needs_sdk  # the shared twin fixture builds its network with the SDK

V = "api-version=2024-07-01"


def _sub(twin: Twin) -> str:
    return f"/subscriptions/{twin.subscription}"


def _rg(twin: Twin, name: str) -> str:
    return f"{_sub(twin)}/resourceGroups/{name}"


def _wait(twin: Twin, token: str, headers: dict) -> dict:
    """Poll Azure-AsyncOperation until it is done, as a client does."""
    url = headers["Azure-AsyncOperation"].removeprefix(twin.url)
    for _ in range(100):
        status, body, _ = twin.request("GET", url, token=token)
        assert status == 200, body
        if body["status"] != "InProgress":
            return body
        time.sleep(0.05)
    raise AssertionError("operation never finished")


@pytest.fixture(scope="module")
def token(twin) -> str:
    return twin.token()


@pytest.fixture(scope="module")
def group(twin, token) -> str:
    status, body, _ = twin.request("PUT", f"{_rg(twin, 'twin-rg')}?{V}", {"location": LOCATION}, token)
    assert status in (200, 201), body
    return "twin-rg"


def test_requests_need_an_api_version_and_a_token(twin, token):
    status, body, _ = twin.request("GET", f"{_sub(twin)}/resourcegroups", token=token)
    assert (status, body["error"]["code"]) == (400, "MissingApiVersionParameter")
    status, body, _ = twin.request("GET", f"{_sub(twin)}/resourcegroups?api-version=latest", token=token)
    assert (status, body["error"]["code"]) == (400, "InvalidApiVersionParameter")
    status, body, headers = twin.request("GET", f"{_sub(twin)}/resourcegroups?{V}")
    assert (status, body["error"]["code"]) == (401, "AuthenticationFailed")
    assert headers["WWW-Authenticate"].startswith("Bearer")
    status, body, _ = twin.request("GET", f"{_sub(twin)}/resourcegroups?{V}", token=token[:-4] + "AAAA")
    assert (status, body["error"]["code"]) == (401, "InvalidAuthenticationToken")
    vault_token = twin.token(resource="https://vault.azure.net")
    status, body, _ = twin.request("GET", f"{_sub(twin)}/resourcegroups?{V}", token=vault_token)
    assert (status, body["error"]["code"]) == (401, "InvalidAuthenticationTokenAudience")
    status, body, _ = twin.request(
        "GET", f"/subscriptions/11111111-1111-4111-8111-111111111111/resourcegroups?{V}", token=token
    )
    assert (status, body["error"]["code"]) == (404, "SubscriptionNotFound")


def test_paths_are_case_insensitive_and_missing_things_are_404(twin, token, group):
    status, body, _ = twin.request("GET", f"{_sub(twin)}/RESOURCEGROUPS/TWIN-RG?{V}", token=token)
    assert status == 200 and body["name"] == "twin-rg"
    status, body, _ = twin.request(
        "GET", f"{_rg(twin, 'nope')}/providers/Microsoft.Compute/virtualMachines/x?{V}", token=token
    )
    assert (status, body["error"]["code"]) == (404, "ResourceGroupNotFound")
    status, body, _ = twin.request(
        "GET", f"{_rg(twin, group)}/providers/Microsoft.Compute/virtualMachines/x?{V}", token=token
    )
    assert (status, body["error"]["code"]) == (404, "ResourceNotFound")


def test_listings_page_with_next_link(twin, token):
    path = f"{_sub(twin)}/providers/Microsoft.Compute/skus?{V}&$filter=location eq '{LOCATION}'".replace(" ", "%20")
    names, pages = [], 0
    while path:
        status, body, _ = twin.request("GET", path, token=token)
        assert status == 200, body
        names += [s["name"] for s in body["value"]]
        pages += 1
        path = body.get("nextLink", "").removeprefix(twin.url) or None
    assert pages > 1
    assert "Standard_ND96isr_H100_v5" in names and len(names) == len(set(names))


def test_sku_catalogue_has_microsofts_nd_h100_v5_figures(twin, token):
    entries = []
    path = f"{_sub(twin)}/providers/Microsoft.Compute/skus?{V}"
    while path:
        _, body, _ = twin.request("GET", path, token=token)
        entries += body["value"]
        path = body.get("nextLink", "").removeprefix(twin.url) or None
    nd = next(e for e in entries if e["name"] == "Standard_ND96isr_H100_v5" and e["locations"] == [LOCATION])
    caps = {c["name"]: c["value"] for c in nd["capabilities"]}
    assert (caps["vCPUs"], caps["MemoryGB"], caps["GPUs"], caps["RdmaEnabled"]) == ("96", "1900", "8", "True")
    assert caps["vCPUsPerCore"] == "1" and caps["LowPriorityCapable"] == "False"
    assert nd["family"] == "standardNDSH100v5Family" and nd["locationInfo"][0]["zones"] == ["1", "2", "3"]
    h200 = next(e for e in entries if e["name"] == "Standard_ND96isr_H200_v5" and e["locations"] == [LOCATION])
    assert h200["restrictions"][0]["type"] == "Zone" and h200["restrictions"][0]["restrictionInfo"]["zones"] == ["3"]


def test_network_rules(twin, token, group):
    base = f"{_rg(twin, group)}/providers/Microsoft.Network"
    subnet_id = f"{_rg(twin, NET_GROUP)}/providers/Microsoft.Network/virtualNetworks/{VNET}/subnets/{SUBNET}"
    # A subnet outside its network, and one overlapping a sibling.
    for name, prefix, refusal in (
        ("outside", "10.99.0.0/24", "NetcfgSubnetRangeOutsideVnet"),
        ("overlap", "10.70.0.128/25", "NetcfgSubnetRangesOverlap"),
    ):
        url = f"{_rg(twin, NET_GROUP)}/providers/Microsoft.Network/virtualNetworks/{VNET}/subnets/{name}?{V}"
        status, body, _ = twin.request("PUT", url, {"properties": {"addressPrefix": prefix}}, token)
        assert (status, body["error"]["code"]) == (400, refusal)

    def nic(name, **ip):
        config = {"name": "ipconfig1", "properties": {"subnet": {"id": subnet_id}, **ip}}
        return twin.request(
            "PUT",
            f"{base}/networkInterfaces/{name}?{V}",
            {"location": LOCATION, "properties": {"ipConfigurations": [config]}},
            token,
        )

    status, body, headers = nic("n1", privateIPAllocationMethod="Static", privateIPAddress="10.70.0.200")
    assert status == 201 and body["properties"]["provisioningState"] == "Creating"
    assert _wait(twin, token, headers)["status"] == "Succeeded"
    status, body, _ = nic("n2", privateIPAllocationMethod="Static", privateIPAddress="10.70.0.200")
    assert (status, body["error"]["code"]) == (400, "PrivateIPAddressInUse")
    status, body, _ = nic("n2", privateIPAllocationMethod="Static", privateIPAddress="10.70.1.5")
    assert (status, body["error"]["code"]) == (400, "PrivateIPAddressNotInSubnet")
    status, body, _ = nic("n2", privateIPAllocationMethod="Static", privateIPAddress="10.70.0.2")
    assert (status, body["error"]["code"]) == (400, "PrivateIPAddressIsReserved")
    status, body, headers = nic("n2", privateIPAllocationMethod="Dynamic")
    assert body["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"] == "10.70.0.4"
    _wait(twin, token, headers)
    # The subnet names its IP configurations (ids only); the network says which addresses are free.
    _, subnet, _ = twin.request("GET", f"{subnet_id}?{V}", token=token)
    assert {c["id"].lower() for c in subnet["properties"]["ipConfigurations"]} >= {
        f"{base}/networkInterfaces/{n}/ipConfigurations/ipconfig1".lower() for n in ("n1", "n2")
    }
    assert all(set(c) == {"id"} for c in subnet["properties"]["ipConfigurations"])
    check = f"{_rg(twin, NET_GROUP)}/providers/Microsoft.Network/virtualNetworks/{VNET}/checkIPAddressAvailability"
    for address, answer in (
        ("10.70.0.200", {"available": False, "isPlatformReserved": False}),
        ("10.70.0.201", {"available": True, "isPlatformReserved": False}),
        ("10.70.0.1", {"available": False, "isPlatformReserved": True}),
    ):
        status, body, _ = twin.request("GET", f"{check}?{V}&ipAddress={address}", token=token)
        assert status == 200 and {k: body[k] for k in answer} == answer, body
    _, body, _ = twin.request("GET", f"{check}?{V}&ipAddress=10.70.0.200", token=token)
    assert body["availableIPAddresses"] and "10.70.0.200" not in body["availableIPAddresses"]
    status, body, _ = twin.request("GET", f"{check}?{V}&ipAddress=10.99.0.1", token=token)
    assert (status, body["error"]["code"]) == (400, "InvalidParameter")
    # The subnet cannot go while NICs use it.
    status, body, _ = twin.request("DELETE", f"{subnet_id}?{V}", token=token)
    assert (status, body["error"]["code"]) == (400, "InUseSubnetCannotBeDeleted")
    for name in ("n1", "n2"):
        status, _, headers = twin.request("DELETE", f"{base}/networkInterfaces/{name}?{V}", token=token)
        assert status == 202 and "Location" in headers
        _wait(twin, token, headers)
    status, _, _ = twin.request("GET", f"{base}/networkInterfaces/n1?{V}", token=token)
    assert status == 404


def test_nsg_rules_are_validated(twin, token, group):
    url = f"{_rg(twin, group)}/providers/Microsoft.Network/networkSecurityGroups/nsg1?{V}"

    def rule(name, priority):
        return {
            "name": name,
            "properties": {
                "priority": priority,
                "direction": "Inbound",
                "access": "Allow",
                "protocol": "Tcp",
                "sourceAddressPrefix": "10.0.0.0/8",
                "sourcePortRange": "*",
                "destinationAddressPrefix": "*",
                "destinationPortRange": "22",
            },
        }

    status, body, _ = twin.request(
        "PUT", url, {"location": LOCATION, "properties": {"securityRules": [rule("a", 99)]}}, token
    )
    assert (status, body["error"]["code"]) == (400, "SecurityRuleInvalidPriority")
    status, body, _ = twin.request(
        "PUT", url, {"location": LOCATION, "properties": {"securityRules": [rule("a", 100), rule("b", 100)]}}, token
    )
    assert (status, body["error"]["code"]) == (400, "SecurityRuleConflict")
    status, body, headers = twin.request(
        "PUT", url, {"location": LOCATION, "properties": {"securityRules": [rule("a", 100)]}}, token
    )
    assert status == 201
    assert body["properties"]["defaultSecurityRules"][0]["name"] == "AllowVnetInBound"
    _wait(twin, token, headers)
    status, _, headers = twin.request("DELETE", url, token=token)
    _wait(twin, token, headers)


def test_vm_rules_quota_capacity_and_power(own_twin):
    twin = own_twin
    token = twin.token()
    twin.request("PUT", f"{_rg(twin, 'vm-rg')}?{V}", {"location": LOCATION}, token)
    arm = RawArm(twin, "vm-rg", token)
    base, nic, vm = arm.base, arm.nic, arm.vm

    n1 = nic("nic1")
    status, body, _ = vm("vm1", "Standard_ND96isr_H200_v5", n1, zone="3")
    assert (status, body["error"]["code"]) == (409, "SkuNotAvailable")
    status, body, _ = vm("vm1", "Standard_ND96isr_H100_v5", n1, priority="Spot", evictionPolicy="Delete")
    assert (status, body["error"]["code"]) == (409, "SkuNotAvailable") and "Spot" in body["error"]["message"]
    status, body, _ = vm("vm1", "Standard_D4s_v5", n1, priority="Spot")
    assert (status, body["error"]["code"], body["error"]["target"]) == (400, "InvalidParameter", "evictionPolicy")
    twin.set_quota({LOCATION: {"standardNDSH100v5Family": 100}})
    status, body, _ = vm("vm1", "Standard_ND96isr_H100_v5", n1)
    assert status == 201, body
    n2 = nic("nic2")
    status, body, _ = vm("vm2", "Standard_ND96isr_H100_v5", n2)
    assert (status, body["error"]["code"]) == (409, "OperationNotAllowed")
    assert "exceeding approved standardNDSH100v5Family Cores quota" in body["error"]["message"]
    assert "Current Limit: 100, Current Usage: 96, Additional Required: 96" in body["error"]["message"]
    twin.set_quota(None)
    status, body, _ = vm("vm2", "Standard_D4s_v5", n1)
    assert (status, body["error"]["code"]) == (400, "NicInUse")
    # Capacity: the second D4s_v5 is created, then its allocation fails (the operation says why).
    twin.set_capacity({"Standard_D4s_v5": {"limit": 1, "code": "AllocationFailed"}})
    status, body, headers = vm("vm2", "Standard_D4s_v5", n2)
    assert status == 201
    assert _wait(twin, token, headers)["status"] == "Succeeded"
    n3 = nic("nic3")
    status, body, headers = vm("vm3", "Standard_D4s_v5", n3)
    assert status == 201
    result = _wait(twin, token, headers)
    assert result["status"] == "Failed" and result["error"]["code"] == "AllocationFailed"
    status, body, _ = twin.request("GET", f"{base}/Microsoft.Compute/virtualMachines/vm3?{V}", token=token)
    assert body["properties"]["provisioningState"] == "Failed"
    twin.set_capacity(None)
    # Power: deallocate and start are long-running actions; the instance view says the power state.
    status, _, headers = twin.request(
        "POST", f"{base}/Microsoft.Compute/virtualMachines/vm2/deallocate?{V}", token=token
    )
    assert status == 202
    _wait(twin, token, headers)
    status, view, _ = twin.request("GET", f"{base}/Microsoft.Compute/virtualMachines/vm2/instanceView?{V}", token=token)
    assert "PowerState/deallocated" in [s["code"] for s in view["statuses"]]
    # A NIC attached to a VM cannot be deleted; a VM's OS disk stays unless its deleteOption is Delete.
    status, body, _ = twin.request("DELETE", f"{base}/Microsoft.Network/networkInterfaces/nic2?{V}", token=token)
    assert (status, body["error"]["code"]) == (400, "NicInUse")
    status, _, headers = twin.request("DELETE", f"{base}/Microsoft.Compute/virtualMachines/vm2?{V}", token=token)
    _wait(twin, token, headers)
    disks = [r for r in twin.state()["resources"].values() if r["type"] == "Microsoft.Compute/disks"]
    assert any(d["name"].startswith("vm2_OsDisk") and d["properties"]["diskState"] == "Unattached" for d in disks)
    # Deleting the resource group deletes everything in it.
    status, _, headers = twin.request("DELETE", f"{_rg(twin, 'vm-rg')}?{V}", token=token)
    assert status == 202
    _wait(twin, token, headers)
    left = [k for k in twin.state()["resources"] if "/resourcegroups/vm-rg/" in k]
    assert left == []


@pytest.fixture(scope="module")
def reads(twin, token):
    """One VM in a Flexible scale set and one alone, in a group of their own: (providers URL, scale set id)."""
    twin.request("PUT", f"{_rg(twin, 'reads-rg')}?{V}", {"location": LOCATION}, token)
    base = f"{_rg(twin, 'reads-rg')}/providers"
    props = {"orchestrationMode": "Flexible", "platformFaultDomainCount": 1}
    _, scale_set, headers = twin.request(
        "PUT", f"{base}/Microsoft.Compute/virtualMachineScaleSets/readsset?{V}",
        {"location": LOCATION, "properties": props}, token,
    )  # fmt: skip
    _wait(twin, token, headers)
    arm = RawArm(twin, "reads-rg", token)
    for name, more in (("readsone", {"virtualMachineScaleSet": {"id": scale_set["id"]}}), ("readstwo", {})):
        status, body, headers = arm.vm(name, "Standard_D2s_v5", arm.nic(name), **more)
        assert status == 201, body
        _wait(twin, token, headers)
    yield base, scale_set["id"]
    _wait(twin, token, twin.request("DELETE", f"{_rg(twin, 'reads-rg')}?{V}", token=token)[2])


def test_vm_lists_answer_as_arm_does(twin, token, reads):
    """VirtualMachines List: `$expand=instanceView` only with a scale set `$filter` (BadRequest without, as
    Azure answers it); ListAll `statusOnly=true`: the run time status of every VM, little else."""
    base, scale_set = reads
    vms = f"{base}/Microsoft.Compute/virtualMachines?{V}"
    status, body, _ = twin.request("GET", f"{vms}&$expand=instanceView", token=token)
    assert (status, body["error"]["code"]) == (400, "BadRequest")
    assert "only supported when Virtual Machine Scale Set resource filter is applied" in body["error"]["message"]
    query = f"$filter=virtualMachineScaleSet/id%20eq%20'{scale_set}'&$expand=instanceView"
    status, body, _ = twin.request("GET", f"{vms}&{query}", token=token)
    assert status == 200 and [v["name"] for v in body["value"]] == ["readsone"]
    assert "PowerState/running" in [s["code"] for s in body["value"][0]["properties"]["instanceView"]["statuses"]]
    status, body, _ = twin.request("GET", f"{vms}&$filter=name%20eq%20'readsone'", token=token)
    assert (status, body["error"]["code"]) == (400, "InvalidParameter")
    found, path = [], f"{_sub(twin)}/providers/Microsoft.Compute/virtualMachines?{V}&statusOnly=true"
    while path:
        status, body, _ = twin.request("GET", path, token=token)
        assert status == 200, body
        found += body["value"]
        path = body.get("nextLink", "").removeprefix(twin.url) or None
    two = next(v for v in found if v["name"] == "readstwo")
    assert set(two) == {"id", "name", "type", "location", "properties"} and set(two["properties"]) == {"instanceView"}
    assert "PowerState/running" in [s["code"] for s in two["properties"]["instanceView"]["statuses"]]


def test_compute_throttles_a_burst_of_vm_reads_not_a_list(twin, token, reads):
    """Microsoft's "Troubleshooting API throttling errors": past a policy's allowance, 429 with Retry-After and
    OperationNotAllowed / TooManyRequests; every answer says what is left (x-ms-ratelimit-remaining-resource)."""
    base, _ = reads
    defaults = twin.throttle()["policies"]
    assert defaults["LowCostGet"]["limit"] < 20  # ON by default: a read per VM of 20 VMs is refused in part
    view = f"{base}/Microsoft.Compute/virtualMachines/readstwo/instanceView?{V}"
    twin.throttle(defaults)  # a fresh window
    try:
        answers = [twin.request("GET", view, token=token) for _ in range(20)]
        limit = defaults["LowCostGet"]["limit"]
        assert [status for status, _, _ in answers] == [200] * limit + [429] * (20 - limit)
        assert answers[0][2]["x-ms-ratelimit-remaining-resource"] == f"Microsoft.Compute/LowCostGet;{limit - 1}"
        status, body, headers = answers[limit]
        assert 1 <= int(headers["Retry-After"]) <= defaults["LowCostGet"]["seconds"]
        assert headers["x-ms-ratelimit-remaining-resource"] == "Microsoft.Compute/LowCostGet;0"
        error = body["error"]
        assert error["code"] == "OperationNotAllowed" and "too many requests have been received" in error["message"]
        (detail,) = error["details"]
        assert (detail["code"], detail["target"]) == ("TooManyRequests", "LowCostGet")
        counts = json.loads(detail["message"])
        assert (counts["allowedRequestCount"], counts["measuredRequestCount"]) == (limit, limit + 1)
        # A list of the same VMs is another policy, with room left.
        status, body, headers = twin.request("GET", f"{base}/Microsoft.Compute/virtualMachines?{V}", token=token)
        assert status == 200 and headers["x-ms-ratelimit-remaining-resource"].startswith("Microsoft.Compute/HighCost")
        assert twin.throttle()["refused"] == 20 - limit
        # After Retry-After, reads are answered again.
        twin.throttle({"LowCostGet": {"limit": 1, "seconds": 1}})
        assert twin.request("GET", view, token=token)[0] == 200
        status, _, headers = twin.request("GET", view, token=token)
        assert (status, headers["Retry-After"]) == (429, "1")
        time.sleep(1)
        assert twin.request("GET", view, token=token)[0] == 200
        status, body, _ = twin.request("PUT", "/_twin/throttle", {"GetVM": {"limit": 1, "seconds": 1}})
        assert (status, body["error"]["code"]) == (400, "InvalidParameter")
    finally:
        twin.throttle(defaults)


def test_a_deny_assignment_refuses_the_write_as_azure_policy_does(twin, token, group):
    """Microsoft's "Resolve errors for request disallowed by policy", in the shape Azure gives it."""
    account = f"{_rg(twin, group)}/providers/Microsoft.Storage/storageAccounts/twinpolicyacct?api-version=2023-05-01"
    body = {"location": LOCATION, "kind": "StorageV2", "sku": {"name": "Standard_LRS"},
            "properties": {"supportsHttpsTrafficOnly": False}}  # fmt: skip
    deny = {
        "name": "deny-http-storage",
        "displayName": "Secure transfer to storage accounts should be enabled",
        "definition": "404c3081-a854-4457-ae30-26a93ef643f9",
        "scope": _rg(twin, group),
        "resourceType": "Microsoft.Storage/storageAccounts",
        "field": "properties.supportsHttpsTrafficOnly",
        "equals": False,
    }
    status, answer, _ = twin.request("PUT", "/_twin/policies", [deny])
    assert status == 200, answer
    try:
        status, answer, _ = twin.request("PUT", account, body, token)
        assert status == 403, answer
        error = answer["error"]
        assert (error["code"], error["target"]) == ("RequestDisallowedByPolicy", "twinpolicyacct")
        assert error["message"].startswith("Resource 'twinpolicyacct' was disallowed by policy. Policy identifiers: '")
        (violation,) = error["additionalInfo"]
        info = violation["info"]
        assert violation["type"] == "PolicyViolation" and info["policyDefinitionEffect"] == "Deny"
        assert (
            info["policyDefinitionId"] == "/providers/Microsoft.Authorization/policyDefinitions/" + deny["definition"]
        )
        assert info["policyAssignmentScope"] == deny["scope"]
        assert info["policyAssignmentId"].endswith(
            "/providers/Microsoft.Authorization/policyAssignments/deny-http-storage"
        )
        (field,) = [e for e in info["evaluationDetails"]["evaluatedExpressions"] if e["path"] != "type"]
        assert (field["path"], field["expressionValue"]) == ("properties.supportsHttpsTrafficOnly", False)
        assert twin.request("GET", account, token=token)[0] == 404  # nothing was made
        # What the condition does not cover goes through; `notEquals` also refuses a field left out.
        assert twin.request("PUT", account, body | {"properties": {}}, token)[0] in (200, 201, 202)
        must = {k: v for k, v in deny.items() if k != "equals"} | {"name": "must", "notEquals": True}
        assert twin.request("PUT", "/_twin/policies", [must])[0] == 200
        assert twin.request("PUT", account, body | {"properties": {}}, token)[0] == 403
        status, answer, _ = twin.request("PATCH", account, {"properties": {"supportsHttpsTrafficOnly": True}}, token)
        assert status == 200, answer
    finally:
        twin.request("PUT", "/_twin/policies", [])
        twin.request("DELETE", account, token=token)


def test_key_vault_soft_delete_and_data_plane_access(own_twin):
    twin = own_twin
    token = twin.token()
    state = twin.state()
    tenant, caller = state["tenant"], state["controller_oid"]
    twin.request("PUT", f"{_rg(twin, 'kv-rg')}?{V}", {"location": LOCATION}, token)
    url = f"{_rg(twin, 'kv-rg')}/providers/Microsoft.KeyVault/vaults/cbtwinvault?{V}"
    body = {
        "location": LOCATION,
        "properties": {
            "tenantId": tenant,
            "sku": {"family": "A", "name": "standard"},
            "accessPolicies": [{"tenantId": tenant, "objectId": caller, "permissions": {"secrets": ["get"]}}],
        },
    }
    status, vault, headers = twin.request("PUT", url, body, token)
    assert status == 201 and vault["properties"]["vaultUri"] == "https://cbtwinvault.vault.azure.net/"
    _wait(twin, token, headers)
    _access_policies_are_added_not_replaced(twin, token, url, tenant, caller)
    _secret_values_over_25_kb_are_refused(twin, vault["properties"]["vaultUri"])
    status, _, _ = twin.request("DELETE", url, token=token)
    assert status == 200
    status, error, _ = twin.request("PUT", url, body, token)
    assert (status, error["error"]["code"]) == (409, "ConflictError")
    deleted = f"{_sub(twin)}/providers/Microsoft.KeyVault/locations/{LOCATION}/deletedVaults/cbtwinvault"
    status, item, _ = twin.request("GET", f"{deleted}?{V}", token=token)
    assert status == 200 and item["properties"]["location"] == LOCATION
    status, _, headers = twin.request("POST", f"{deleted}/purge?{V}", token=token)
    assert status == 202
    _wait(twin, token, headers)
    status, _, _ = twin.request("GET", f"{deleted}?{V}", token=token)
    assert status == 404


def _access_policies_are_added_not_replaced(twin: Twin, token: str, url: str, tenant: str, caller: str) -> None:
    """Vaults - Update Access Policy, operationKind add: permissions merge into the entry of the same object,
    a new object gets its own entry, and every other policy stays (a PUT of the vault replaces them all)."""
    other = "6f1c0a2e-5b7d-4e8f-9a3c-2d1e0f9b8a7c"
    add = url.replace("/cbtwinvault?", "/cbtwinvault/accessPolicies/add?")
    policies = [
        {"tenantId": tenant, "objectId": caller, "permissions": {"secrets": ["Get", "set", "list"]}},
        {"tenantId": tenant, "objectId": other, "permissions": {"secrets": ["get"], "keys": ["encrypt"]}},
    ]
    status, answer, _ = twin.request("PUT", add, {"properties": {"accessPolicies": policies}}, token)
    assert status == 200, answer
    assert answer["type"] == "Microsoft.KeyVault/vaults/accessPolicies"
    assert answer["properties"]["accessPolicies"] == policies
    _, vault, _ = twin.request("GET", url, token=token)
    held = {p["objectId"]: p["permissions"] for p in vault["properties"]["accessPolicies"]}
    assert held == {caller: {"secrets": ["get", "set", "list"]}, other: {"secrets": ["get"], "keys": ["encrypt"]}}
    for kind, body, code in [
        ("replace", {"properties": {"accessPolicies": policies}}, "InvalidParameter"),  # not emulated: refused
        ("add", {"properties": {"accessPolicies": [{"objectId": other}]}}, "BadRequest"),  # no tenant
    ]:
        status, error, _ = twin.request("PUT", add.replace("/add?", f"/{kind}?"), body, token)
        assert (status, error["error"]["code"]) == (400, code)


def _secret_values_over_25_kb_are_refused(twin: Twin, vault_url: str) -> None:
    """Key Vault holds 25 KB a secret: more is 400 BadParameter, inner code SecretTooLarge (a strict switch,
    on by default; off, the twin takes any size)."""
    from azure.core.exceptions import HttpResponseError
    from azure.identity import DefaultAzureCredential
    from azure.keyvault.secrets import SecretClient

    with twin.sdk_env():
        client = SecretClient(vault_url, DefaultAzureCredential())
        assert len(client.set_secret("fits", "x" * 25600).value) == 25600
        with pytest.raises(HttpResponseError) as refused:
            client.set_secret("too-big", "x" * 25601)
        assert refused.value.status_code == 400
        assert refused.value.error.code == "BadParameter"
        assert "beyond the maximum permitted length of 25600 characters" in refused.value.error.message
        assert refused.value.error.innererror["code"] == "SecretTooLarge"
        with pytest.raises(HttpResponseError):
            client.set_secret("too-big", "é" * 12801)  # 25602 bytes of UTF-8: counted in bytes
        status, strict, _ = twin.request("PUT", "/_twin/strict", {"keyvault_secret_size": False})
        assert (status, strict) == (200, {"keyvault_secret_size": False, "amlfs_nsg": True})
        try:
            assert len(client.set_secret("too-big", "x" * 25601).value) == 25601
        finally:
            twin.request("PUT", "/_twin/strict", {"keyvault_secret_size": True})
    status, error, _ = twin.request("PUT", "/_twin/strict", {"no_such_switch": True})
    assert (status, error["error"]["code"]) == (400, "InvalidRequestContent")
    assert twin.request("GET", "/_twin/strict")[1] == {"keyvault_secret_size": True, "amlfs_nsg": True}


def test_state_survives_a_restart_of_the_twin(tmp_path):
    from azuretest import arm_twin

    with arm_twin(tmp_path) as first:
        token = first.token()
        status, _, _ = first.request(
            "PUT", f"{_rg(first, 'kept-rg')}?{V}", {"location": LOCATION, "tags": {"a": "b"}}, token
        )
        assert status == 201
        counter = first.state()["counter"]
    with arm_twin(tmp_path) as second:
        status, body, _ = second.request("GET", f"{_rg(second, 'kept-rg')}?{V}", token=second.token())
        assert status == 200 and body["tags"] == {"a": "b"}
        assert second.state()["counter"] >= counter  # ids stay unique across restarts


@pytest.mark.parametrize(
    ("pattern", "action", "granted"),
    [
        ("Microsoft.Compute/*", "Microsoft.Compute/virtualMachines/write", True),
        ("microsoft.compute/virtualMachines/*", "Microsoft.Compute/virtualMachines/delete", True),
        ("Microsoft.Compute/virtualMachines/read", "Microsoft.Compute/virtualMachines/write", False),
        # Managed Identity Operator's: `*` as a whole segment also matches none (the role is Microsoft's
        # documented way to let a principal attach an identity, `userAssignedIdentities/assign/action`).
        (
            "Microsoft.ManagedIdentity/userAssignedIdentities/*/assign/action",
            "Microsoft.ManagedIdentity/userAssignedIdentities/assign/action",
            True,
        ),
        (
            "Microsoft.ManagedIdentity/userAssignedIdentities/*/read",
            "Microsoft.ManagedIdentity/userAssignedIdentities/read",
            True,
        ),
        (
            "Microsoft.ManagedIdentity/userAssignedIdentities/*/assign/action",
            "Microsoft.ManagedIdentity/userAssignedIdentities/write",
            False,
        ),
    ],
)
def test_action_wildcards_match_as_azure_roles_use_them(pattern, action, granted):
    from clusterbake.twins.azure.rbac import action_matches

    assert action_matches(pattern, action) is granted


def test_rbac_writes_and_new_identities_take_effect_only_after_they_replicated():
    """Realcloud review D7, D9 (twins/azure/replication.py), on the twin's state in-process with its clock in
    the test's hand: what ARM answers while a role, an assignment or an identity has not replicated yet."""
    from clusterbake.twins.azure.resource import ArmError, ResourceId
    from clusterbake.twins.azure.state import ArmState

    now = [1000.0]
    state = ArmState(rbac_spread=5, identity_spread=10)
    state.replication.clock = lambda: now[0]
    state.put_group("g", {"location": LOCATION})
    scope = f"/subscriptions/{state.subscription}/resourceGroups/g"
    rid = ResourceId(state.subscription, "g", "Microsoft.ManagedIdentity", ["userAssignedIdentities"], ["made"])
    principal = state.put(rid, {"location": LOCATION})[1]["properties"]["principalId"]
    guid = "11111111-2222-4333-8444-555555555555"
    read, write = "Microsoft.Compute/virtualMachines/read", "Microsoft.Compute/virtualMachines/write"

    def role(*actions: str) -> dict:
        permissions = [{"actions": list(actions)}]
        return {"properties": {"roleName": "r", "assignableScopes": [scope], "permissions": permissions}}

    def assign(name: str, at: str = scope, **extra) -> tuple[int, dict]:
        definition = f"/subscriptions/{state.subscription}/providers/Microsoft.Authorization/roleDefinitions/{guid}"
        return state.put_role_assignment(
            at, name, {"properties": {"roleDefinitionId": definition, "principalId": principal, **extra}}
        )

    def refused(call, *args, **kwargs) -> tuple[int, str]:
        with pytest.raises(ArmError) as error:
            call(*args, **kwargs)
        return error.value.status, error.value.code

    first, second = "00000000-0000-4000-8000-0000000000a1", "00000000-0000-4000-8000-0000000000a2"
    state.put_role_definition(guid, role(read))
    assert state.role_definition(guid) is not None  # reads answer at once
    assert refused(assign, first, principalType="ServicePrincipal") == (400, "RoleDefinitionDoesNotExist")
    now[0] += 5  # the role replicated; the identity not yet (Entra ID: 10 s here)
    assert refused(assign, first) == (400, "PrincipalNotFound")  # Microsoft's fix: name the principalType
    assert assign(first, principalType="ServicePrincipal")[0] == 201
    assert not state.allowed(principal, read, scope)  # ARM does not honour the new assignment yet
    now[0] += 5
    assert state.allowed(principal, read, scope)
    assert assign(second, str(rid))[0] == 201  # the identity replicated: no principalType needed
    state.put_role_definition(guid, role(read, write))
    assert state.allowed(principal, read, scope) and not state.allowed(principal, write, scope)  # as before
    now[0] += 5
    assert state.allowed(principal, write, scope)
    for name, at in ((first, scope), (second, str(rid))):
        assert state.delete_role_assignment(at, name) is not None
    assert not state.allowed(principal, read, scope)  # a revocation is not held back (kinder than Azure)
    assert refused(state.delete_role_definition, guid) == (409, "RoleDefinitionHasAssignments")
    now[0] += 5
    assert state.delete_role_definition(guid) is not None
    assert refused(assign, first, principalType="ServicePrincipal") == (400, "RoleDefinitionDoesNotExist")


def test_a_new_identity_gets_no_token_until_it_replicated(twin, token, group):
    """The App Service identity endpoint (the twin's IDENTITY_ENDPOINT), as App Service answers an identity it
    cannot load, while the identity spread is on (realcloud review D9)."""
    url = f"{_rg(twin, group)}/providers/Microsoft.ManagedIdentity/userAssignedIdentities/fresh?api-version=2023-01-31"
    with twin.spread(identity=1):
        status, identity, _ = twin.request("PUT", url, {"location": LOCATION}, token)
        assert status == 201, identity
        ask = f"/msi/token?api-version=2019-08-01&resource=https://vault.azure.net&client_id={identity['properties']['clientId']}"
        status, body, _ = twin.request("GET", ask, headers={"X-IDENTITY-HEADER": twin.env["IDENTITY_HEADER"]})
        assert (status, body["message"]) == (400, "Unable to load the proper Managed Identity.")
        time.sleep(1)
        status, body, _ = twin.request("GET", ask, headers={"X-IDENTITY-HEADER": twin.env["IDENTITY_HEADER"]})
        assert status == 200 and body["client_id"] == identity["properties"]["clientId"]
    assert twin.request("DELETE", url, token=token)[0] in (200, 204)
