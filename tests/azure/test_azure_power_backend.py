"""The head's power program, azure backend: the exact ARM requests it sends (IMDS token, NIC, VM,
async operation polls, deletes), with the answers Azure gives that the twin gives rarely or not at
will (each capacity error, throttling, an address a deleted NIC still holds), and Slurm's side of a
failed resume.

The program (package clusterbake_power in roles/slurm_power/files) runs in-process with a scripted HTTP
function in place of urllib (`http=`): every request it makes is recorded and answered in order.
Its state file and log are under tmp_path; `scontrol` is replaced by a recorder. The bodies come
from the provider's own functions (providers/azure/resources.py), as power_vars() records them.
"""

from __future__ import annotations

import base64
import json
from urllib.parse import parse_qs, urlsplit

import programs
import pytest

from clusterbake.providers.azure import power, resources, tags
from clusterbake.providers.azure.power import API_VERSIONS
from clusterbake.providers.userdata import NAME_PLACEHOLDER, user_data_template

SUB = "00000000-0000-4000-8000-00000000c1b0"
RG = "pw-rg"
ARM = "https://management.azure.com"
BASE = f"{ARM}/subscriptions/{SUB}/resourceGroups/{RG}"
SUBNET = f"/subscriptions/{SUB}/resourceGroups/net-rg/providers/Microsoft.Network/virtualNetworks/v/subnets/nodes"
NSG = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/networkSecurityGroups/clusterbake-pw"
ASG = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/applicationSecurityGroups/clusterbake-pw"
IDENTITY = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.ManagedIdentity/userAssignedIdentities/n"
HEAD_CLIENT = "5b1f6c2e-0d3a-4c8e-9f7b-1a2b3c4d5e6f"
IMAGE = f"/subscriptions/{SUB}/resourceGroups/img/providers/Microsoft.Compute/images/clusterbake-1"
JOIN = {"cloud": "azure", "vault_url": "https://v.vault.azure.net/", "secret_name": "join-cpu", "client_id": "c"}
NIC_URL = f"{BASE}/providers/Microsoft.Network/networkInterfaces/pw-cpu-2-nic?api-version={API_VERSIONS['network']}"
VM_URL = f"{BASE}/providers/Microsoft.Compute/virtualMachines/pw-cpu-2?api-version={API_VERSIONS['compute']}"
LIST_URL = f"{BASE}/providers/Microsoft.Compute/virtualMachines?api-version={API_VERSIONS['compute']}"
OPERATION = f"{ARM}/subscriptions/{SUB}/providers/Microsoft.Compute/locations/eastus/operations/op"


def settings(sizes=("Standard_D4s_v5", "Standard_D4as_v5")) -> dict:
    node_tags = tags.node_tags("pw", "compute", "cpu")
    group = {
        "sizes": list(sizes),
        "nic": resources.nic_body(
            location="eastus", subnet_id=SUBNET, address="", nsg_id=NSG, asg_ids=[ASG], node_tags=node_tags
        ),
        "vm": resources.vm_body(
            location="eastus",
            zone="1",
            size=sizes[0],
            image=IMAGE,
            computer_name="",
            admin_user="azureuser",
            public_key="ssh-ed25519 AAAA k",
            custom_data="",
            nic_id="",
            identity_ids=[IDENTITY],
            node_tags=node_tags,
        ),
        "user_data": user_data_template(cluster="pw", ssh_user="azureuser", authorized_keys=["k"], join=JOIN),
        "addresses": {"cpu-2": "10.0.0.250", "cpu-3": "10.0.0.249"},
    }
    return {
        "arm_endpoint": ARM,
        "subscription_id": SUB,
        "resource_group": RG,
        "cluster": "pw",
        "identity_client_id": HEAD_CLIENT,
        "name_placeholder": NAME_PLACEHOLDER,
        "api_versions": power.API_VERSIONS,
        "groups": {"cpu": group},
    }


class Arm:
    """Answers the program's requests in order from a script of (method, url, status, body[, headers])."""

    def __init__(self, script):
        self.script = list(script)
        self.requests: list[tuple[str, str, dict | None, dict]] = []

    def __call__(self, method, url, body, headers, timeout=60):
        self.requests.append((method, url, json.loads(body) if body else None, dict(headers)))
        if url.startswith("http://169.254.169.254/"):
            return 200, {}, json.dumps({"access_token": "head-token", "expires_on": "9999999999"}).encode()
        assert self.script, f"unexpected {method} {url}"
        expected_method, expected_url, status, answer, *more = self.script.pop(0)
        assert (method, url) == (expected_method, expected_url)
        return status, (more[0] if more else {}), json.dumps(answer).encode() if answer is not None else b""

    def arm(self) -> list[tuple[str, str]]:
        return [(m, u) for m, u, _, _ in self.requests if not u.startswith("http://169.254.169.254/")]

    def body(self, method: str, url: str) -> dict:
        return next(b for m, u, b, _ in self.requests if (m, u) == (method, url))


def accepted(url_of_operation=OPERATION) -> dict:
    return {"Azure-AsyncOperation": url_of_operation, "Retry-After": "0"}


def created_nic() -> tuple:
    nic_id = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Network/networkInterfaces/pw-cpu-2-nic"
    return ("PUT", NIC_URL, 201, {"id": nic_id, "name": "pw-cpu-2-nic"}, accepted())


def succeeded() -> tuple:
    return ("GET", OPERATION, 200, {"status": "Succeeded"})


def failed(code: str, message: str) -> tuple:
    return ("GET", OPERATION, 200, {"status": "Failed", "error": {"code": code, "message": message}})


def deletes() -> list[tuple]:
    """What a failed attempt leaves is deleted: the VM (its NIC and disk go with it), then the NIC."""
    return [("DELETE", VM_URL, 202, None, accepted()), succeeded(), ("DELETE", NIC_URL, 204, None)]


@pytest.fixture
def program(tmp_path, monkeypatch):
    return programs.power_program(monkeypatch, tmp_path / "state.json")


def _backend(module, tmp_path, arm, **kwargs):
    config = {
        "provider": "azure",
        "capacity_cooldown": 600,
        "azure": settings(**kwargs),
        "log": str(tmp_path / "power.log"),
    }
    return module.azure.AzureBackend(config, http=arm, sleep=lambda seconds: None)


def test_program_names_vms_and_nics_as_the_provider_does(program, tmp_path):
    backend = _backend(program, tmp_path, Arm([]))
    assert backend.vm_name("cpu-2") == resources.vm_name("pw", "cpu-2")
    assert backend.nic_name("cpu-2") == resources.nic_name("pw", "cpu-2")


def test_exact_requests_of_a_node(program, tmp_path):
    arm = Arm([("GET", LIST_URL, 200, {"value": []}), created_nic(), succeeded(),
               ("PUT", VM_URL, 201, {"name": "pw-cpu-2"}, accepted()), succeeded()])  # fmt: skip
    backend = _backend(program, tmp_path, arm)
    assert backend.power("start", ["cpu-2"]) == {"cpu-2": "ok"}
    token = urlsplit(arm.requests[0][1])
    assert token.netloc == "169.254.169.254" and token.path == "/metadata/identity/oauth2/token"
    assert parse_qs(token.query) == {
        "api-version": ["2018-02-01"],
        "resource": ["https://management.azure.com/"],
        "client_id": [HEAD_CLIENT],  # the head's own identity, not the nodes'
    }
    assert arm.requests[0][3] == {"Metadata": "true"}
    assert all(h["Authorization"] == "Bearer head-token" for m, u, _, h in arm.requests[1:])
    nic = arm.body("PUT", NIC_URL)
    config = nic["properties"]["ipConfigurations"][0]["properties"]
    assert config["privateIPAddress"] == "10.0.0.250" and config["privateIPAllocationMethod"] == "Static"
    assert config["subnet"] == {"id": SUBNET} and config["applicationSecurityGroups"] == [{"id": ASG}]
    assert nic["properties"]["networkSecurityGroup"] == {"id": NSG}
    assert nic["tags"] == {**tags.node_tags("pw", "compute", "cpu"), "clusterbake-name": "cpu-2"}
    vm = arm.body("PUT", VM_URL)
    props = vm["properties"]
    assert props["hardwareProfile"] == {"vmSize": "Standard_D4s_v5"}
    assert props["osProfile"]["computerName"] == "cpu-2"
    user_data = base64.b64decode(props["userData"]).decode()
    assert user_data == backend.azure["groups"]["cpu"]["user_data"].replace(NAME_PLACEHOLDER, "cpu-2")
    assert user_data.count("cpu-2") == 2 and NAME_PLACEHOLDER not in user_data
    assert props["osProfile"]["customData"] == props["userData"]
    assert props["networkProfile"]["networkInterfaces"] == [
        {"id": created_nic()[3]["id"], "properties": {"deleteOption": "Delete"}}
    ]
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    assert vm["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {IDENTITY: {}}}
    assert vm["zones"] == ["1"] and vm["tags"]["clusterbake-name"] == "cpu-2"
    assert "resume cpu-2: pw-cpu-2 Standard_D4s_v5 at 10.0.0.250" in (tmp_path / "power.log").read_text()


def test_capacity_fallover_deletes_the_attempt_and_cools_the_size_down(program, tmp_path):
    message = "Allocation failed. We do not have sufficient capacity for the requested VM size in this region."
    arm = Arm(
        [("GET", LIST_URL, 200, {"value": []}), created_nic(), succeeded(),
         ("PUT", VM_URL, 201, {"name": "pw-cpu-2"}, accepted()), failed("AllocationFailed", message), *deletes(),
         created_nic(), succeeded(), ("PUT", VM_URL, 201, {"name": "pw-cpu-2"}, accepted()), succeeded()]
    )  # fmt: skip
    backend = _backend(program, tmp_path, arm)
    assert backend.power("start", ["cpu-2"]) == {"cpu-2": "ok"}
    sizes = [b["properties"]["hardwareProfile"]["vmSize"] for m, u, b, _ in arm.requests if (m, u) == ("PUT", VM_URL)]
    assert sizes == ["Standard_D4s_v5", "Standard_D4as_v5"]
    log = (tmp_path / "power.log").read_text()
    assert f"resume cpu-2: Standard_D4s_v5: AllocationFailed: {message} Standard_D4s_v5 skipped for 600s" in log
    assert "resume cpu-2: pw-cpu-2 Standard_D4as_v5 at 10.0.0.250 (fallback: Standard_D4s_v5: AllocationFailed)" in log
    assert set(backend.cooling()) == {"Standard_D4s_v5"}
    # The next node skips the cooling size without asking Azure.
    arm.script = [("GET", LIST_URL, 200, {"value": []}), created_nic(), succeeded(),
                  ("PUT", VM_URL, 201, {}, accepted()), succeeded()]  # fmt: skip
    assert backend.power("start", ["cpu-2"]) == {"cpu-2": "ok"}
    assert "resume cpu-2: Standard_D4s_v5 skipped until" in (tmp_path / "power.log").read_text()


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("AllocationFailed", "Allocation failed."),
        ("ZonalAllocationFailed", "Allocation failed. We do not have sufficient capacity in this zone."),
        ("OverconstrainedAllocationRequest", "Allocation failed. VM(s) with the following constraints ..."),
        ("OverconstrainedZonalAllocationRequest", "Allocation failed. VM(s) with the following constraints ..."),
        ("SkuNotAvailable", "The requested VM size Standard_D4s_v5 is currently not available in location eastus."),
        ("QuotaExceeded", "Operation could not be completed as it results in exceeding approved Total Regional Cores"),
        ("OperationNotAllowed", "Operation could not be completed as it results in exceeding approved "
                                "standardDSv5Family Cores quota."),
    ],
)  # fmt: skip
def test_every_capacity_error_falls_over(program, tmp_path, code, message):
    # Synchronous refusals (409 on the PUT, as SkuNotAvailable and quota come) fall over as async ones do.
    arm = Arm([("GET", LIST_URL, 200, {"value": []}), created_nic(), succeeded(),
               ("PUT", VM_URL, 409, {"error": {"code": code, "message": message}}), *deletes(),
               created_nic(), succeeded(), ("PUT", VM_URL, 201, {}, accepted()), succeeded()])  # fmt: skip
    assert _backend(program, tmp_path, arm).power("start", ["cpu-2"]) == {"cpu-2": "ok"}
    assert f"(fallback: Standard_D4s_v5: {code})" in (tmp_path / "power.log").read_text()


def test_other_errors_do_not_fall_over(program, tmp_path):
    problem = "The Admin Username specified is not allowed."
    arm = Arm(
        [
            ("GET", LIST_URL, 200, {"value": []}),
            created_nic(),
            succeeded(),
            ("PUT", VM_URL, 400, {"error": {"code": "InvalidParameter", "message": problem}}),
            *deletes(),
        ]
    )
    result = _backend(program, tmp_path, arm).power("start", ["cpu-2"])  # fmt: skip
    assert result == {"cpu-2": f"Standard_D4s_v5: InvalidParameter: {problem}"}
    assert not arm.script  # the NIC it made is gone too; the second size was never tried


def test_no_size_with_capacity_gives_every_error_then_azures_words(program, tmp_path, monkeypatch):
    """resume(): the node goes DOWN with Azure's error as the reason, so Slurm requeues its job."""
    words = "Allocation failed. We do not have sufficient capacity for the requested VM size in this zone."
    arm = Arm([("GET", LIST_URL, 200, {"value": []})]
              + [step for _ in range(2) for step in (created_nic(), succeeded(), ("PUT", VM_URL, 201, {}, accepted()),
                                                     failed("ZonalAllocationFailed", words), *deletes())])  # fmt: skip
    backend = _backend(program, tmp_path, arm)
    calls: list[tuple] = []
    monkeypatch.setattr(program.commands, "backend", lambda config: backend)
    monkeypatch.setattr(program.core, "expand", lambda hostlist: ["cpu-2"])
    monkeypatch.setattr(program.core, "scontrol", lambda *args: calls.append(args) or "")
    assert program.commands.resume(backend.config, "cpu-2") == 1
    [(node, state, reason)] = [c[1:] for c in calls]
    assert (node, state) == ("NodeName=cpu-2", "State=DOWN")
    assert (
        reason
        == (
            "Reason=clusterbake: resume failed: no capacity (Standard_D4s_v5: ZonalAllocationFailed; Standard_D4as_v5: "
            f"ZonalAllocationFailed): {words}"
        )[: len("Reason=") + 250]
    )


def test_throttling_and_an_address_still_held_are_waited_for(program, tmp_path):
    held = "IP configuration ipconfig1 is using the private IP address 10.0.0.250 which is already allocated."
    arm = Arm(
        [("GET", LIST_URL, 429, {"error": {"code": "TooManyRequests", "message": "slow down"}}, {"Retry-After": "3"}),
         ("GET", LIST_URL, 200, {"value": []}),
         ("PUT", NIC_URL, 400, {"error": {"code": "PrivateIPAddressInUse", "message": held}}),
         created_nic(), succeeded(), ("PUT", VM_URL, 201, {}, accepted()), succeeded()]
    )  # fmt: skip
    sleeps: list[float] = []
    backend = _backend(program, tmp_path, arm)
    backend.sleep = sleeps.append
    assert backend.power("start", ["cpu-2"]) == {"cpu-2": "ok"}
    assert sleeps[0] == 3.0  # Retry-After, as ARM asks
    assert "resume cpu-2: 10.0.0.250 still in use, waiting" in (tmp_path / "power.log").read_text()


def _vm(node: str, state: str = "Succeeded") -> dict:
    return {
        "name": f"pw-{node}",
        "tags": {**tags.node_tags("pw", "compute", "cpu"), "clusterbake-name": node},
        "properties": {"provisioningState": state},
    }


def test_a_failed_vm_is_deleted_before_the_node_is_made_again(program, tmp_path):
    arm = Arm([("GET", LIST_URL, 200, {"value": [_vm("cpu-2", "Failed")]}), *deletes(), created_nic(), succeeded(),
               ("PUT", VM_URL, 201, {}, accepted()), succeeded()])  # fmt: skip
    assert _backend(program, tmp_path, arm).power("start", ["cpu-2"]) == {"cpu-2": "ok"}
    assert "resume cpu-2: deleted its Failed VM pw-cpu-2" in (tmp_path / "power.log").read_text()


def test_suspend_deletes_the_vms_and_running_lists_every_page(program, tmp_path):
    other = {"name": "x", "tags": {"clusterbake-cluster": "someone-else", "clusterbake-name": "cpu-3"}}
    page = {"value": [_vm("cpu-2"), other], "nextLink": f"{LIST_URL}&$skiptoken=2"}
    arm = Arm([("GET", LIST_URL, 200, page), ("GET", f"{LIST_URL}&$skiptoken=2", 200, {"value": [_vm("head")]}),
               *deletes()])  # fmt: skip
    backend = _backend(program, tmp_path, arm)
    assert backend.power("stop", ["cpu-2", "cpu-3"]) == {"cpu-2": "ok", "cpu-3": "ok"}
    assert not arm.script  # cpu-3 has no VM of this cluster: nothing to delete
    assert "delete cpu-2: pw-cpu-2" in (tmp_path / "power.log").read_text()
    arm.script = [("GET", LIST_URL, 200, {"value": [_vm("cpu-2"), _vm("cpu-3", "Deleting"), _vm("head")]})]
    assert backend.running() == {"cpu-2", "head"}


def test_a_denial_is_tried_again_for_minutes_then_is_the_nodes_reason_not_a_traceback(program, tmp_path):
    """A grant `cluster up` made a moment ago that ARM does not honour yet (realcloud review B7) is waited for
    AUTHORIZATION_WAIT seconds, with growing pauses; a denial that lasts is the error."""
    denied = ("GET", LIST_URL, 403, {"error": {"code": "AuthorizationFailed", "message": "no grant"}})
    arm = Arm([denied] * 40)
    backend = _backend(program, tmp_path, arm)
    clock = {"now": 1000.0}
    backend.clock, backend.sleep = lambda: clock["now"], lambda seconds: clock.update(now=clock["now"] + seconds)
    with pytest.raises(program.core.PowerError, match="ARM: AuthorizationFailed: no grant"):
        backend.power("start", ["cpu-2"])
    assert program.azure.AUTHORIZATION_WAIT - 15 < clock["now"] - 1000 <= program.azure.AUTHORIZATION_WAIT
    assert 10 < len(arm.arm()) < 30  # pauses of 1, 2, 4, 8, then 15 s
    log = (tmp_path / "power.log").read_text()
    assert f"GET {LIST_URL.split('?')[0]}: AuthorizationFailed (not replicated yet?): waiting (0s of 300s)" in log
