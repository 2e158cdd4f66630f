"""A user-assigned identity made a moment ago (realcloud review D9, C1): Azure's IMDS gives its tokens only
once Entra ID has replicated it, answering 400 invalid_request "Identity not found" before; the twin
does so for its identity spread (twins/azure/replication.py). Here the twin's IMDS (twins/azure/imds.py)
serves on 127.0.0.1 in-process, its tokens from the ARM twin's own function (arm.Twin.identity_token, as
`twin up azure` wires it) over the twin's state, where the identity is made through ARM's PUT. The
node's boot program (role cloud_boot) and the head's power program (role slurm_power) ask it over HTTP
as they ask Azure's IMDS.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import programs
import pytest
from azuretest import LOCATION

from clusterbake.twins.aws.imds import listen
from clusterbake.twins.azure import arm, imds
from clusterbake.twins.azure.state import ArmState, ResourceId

BOOT_PROGRAM = Path(__file__).resolve().parents[2] / "roles" / "cloud_boot" / "files" / "clusterbake-node-boot"
SPREAD = 1.0


@pytest.fixture
def new_identity(tmp_path):
    """The twin's IMDS for one VM whose user-assigned identity was made just now: (IMDS URL, client id)."""
    state = ArmState(identity_spread=SPREAD)
    twin = arm.Twin(state, tmp_path)
    with state.lock:
        state.put_group("g", {"location": LOCATION})
        rid = ResourceId(state.subscription, "g", "Microsoft.ManagedIdentity", ["userAssignedIdentities"], ["head"])
        made = state.put(rid, {"location": LOCATION})[1]
    # What the daemon's lookup says of a VM carrying that identity (daemon.py: its userAssignedIdentities).
    identity = {"id": made["id"], **{k: made["properties"][k] for k in ("clientId", "principalId")}}
    vm = {"instance": {"compute": {"name": "head"}, "network": {}}, "vm": "head", "identities": [identity]}
    sock = listen("127.0.0.1", 0)
    server = imds.MetadataServer(sock, lambda address: vm, twin.identity_token, lambda name: {}, lambda *a: None,
                                 lambda message: None)  # fmt: skip
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", made["properties"]["clientId"]
    server.shutdown()
    server.server_close()


def _ask(url: str, client_id: str) -> tuple[int, dict]:
    query = f"api-version=2018-02-01&resource=https://management.azure.com/&client_id={client_id}"
    request = urllib.request.Request(f"{url}/metadata/identity/oauth2/token?{query}", headers={"Metadata": "true"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_the_twins_imds_has_no_token_of_a_new_identity_until_it_replicated(new_identity):
    url, client_id = new_identity
    assert _ask(url, client_id) == (400, {"error": "invalid_request", "error_description": "Identity not found"})
    time.sleep(SPREAD)
    status, body = _ask(url, client_id)
    assert status == 200 and body["client_id"] == client_id


def test_the_node_boot_program_waits_for_its_new_identity(new_identity):
    """The nodes' identity is made by `cluster up` just before their VMs: the bundle fetch's token waits
    (IDENTITY_GRACE) rather than failing the boot."""
    url, client_id = new_identity
    boot = programs.load_program("clusterbake_node_boot_new_identity", BOOT_PROGRAM)
    started = time.monotonic()
    assert boot.AzureMetadata(url).token(client_id).count(".") == 2  # a JWT
    assert time.monotonic() - started >= SPREAD


def test_the_power_program_waits_for_the_heads_new_identity(new_identity, tmp_path, monkeypatch):
    """The head's identity is made by `cluster up` too: the power program's IMDS token waits for it
    (IDENTITY_WAIT) instead of failing the resume."""
    url, client_id = new_identity
    module = programs.power_program(monkeypatch, tmp_path / "state.json")
    settings = {"cluster": "c", "groups": {}, "arm_endpoint": "https://management.azure.com",
                "subscription_id": "s", "resource_group": "g", "identity_client_id": client_id}  # fmt: skip

    def http(method, address, body, headers, timeout=60):  # the head's IMDS is the twin's
        return module.azure.urllib_http(method, address.replace("http://169.254.169.254", url), body, headers, timeout)

    config = {"provider": "azure", "capacity_cooldown": 600, "azure": settings, "log": str(tmp_path / "power.log")}
    backend = module.azure.AzureBackend(config, http=http)
    assert backend.token().count(".") == 2
    log = (tmp_path / "power.log").read_text()
    assert "IMDS token of the head's identity: HTTP 400:" in log and "Identity not found" in log
