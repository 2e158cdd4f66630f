"""The Azure twin's node side: VMs created through the real Azure SDK boot as local nodes.

`clusterbake twin up azure` once for the module; a VM of the twin's image, created with
azure-mgmt-compute (its NIC, identities and Key Vault with the other azure-mgmt clients),
boots as a node at its NIC's private IP; from inside the node: Azure's IMDS (header
checks, the instance document with the VM's name and userData), a managed identity token
that reads a Key Vault secret at the vault's real name, scheduled events set by the test;
then deallocate, start, restart, a poweroff from inside, delete; and `twin down` leaves
nothing on the host. Needs root (nspawn, network namespaces) like the EC2 twin's tests.
"""

from __future__ import annotations

import base64
import json
import time

import pytest
from azuretwintest import AzureTwin, Environ
from polling import wait_for
from twintest import CB, host_leftovers, run

from clusterbake.nspawn import machines

pytestmark = pytest.mark.integration

RG = "citwinaz-rg"
VM = "citwinaz-vm1"
ADDRESS = "10.91.0.10"
VAULT = "citwinazkv"
SECRET = "join-test"
SIZE = "Standard_D4s_v5"
USER_DATA = b"#!/bin/sh\n# the test's user data: not a clusterbake document, so the boot service leaves it be\n"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEw9TQ4k0jMZ5U0dQmJtL0m8mYt2uQ2B0cG5JtQ4d2lW citwinaz"
NODE_TIMEOUT = 10.0  # the keeper polls every 0.25 s; a node starts in about a second

IMDS_PROGRAM = """
import json, sys, time, urllib.error, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def call(path, headers, method="GET", body=None):
    request = urllib.request.Request("http://169.254.169.254" + path, headers=headers, method=method, data=body)
    try:
        with opener.open(request, timeout=10) as response:
            return [response.status, response.read().decode()]
    except urllib.error.HTTPError as error:
        return [error.code, error.read().decode()]
M = {"Metadata": "true"}
"""


@pytest.fixture(scope="module")
def sdk(azure):
    compute, network, msi, keyvault, resources = azure.clients()
    return {"compute": compute, "network": network, "msi": msi, "keyvault": keyvault, "resources": resources}


@pytest.fixture(scope="module")
def vm(azure, sdk):
    """A VM of the twin's image with one assigned identity that may read a Key Vault secret."""
    info = azure.info
    with Environ(azure.env):
        from azure.identity import DefaultAzureCredential
        from azure.keyvault.secrets import SecretClient

        sdk["resources"].resource_groups.create_or_update(RG, {"location": info["location"]})
        identities = {
            name: sdk["msi"].user_assigned_identities.create_or_update(RG, name, {"location": info["location"]})
            for name in ("citwinaz-reader", "citwinaz-other")
        }
        reader = identities["citwinaz-reader"]
        vault = (
            sdk["keyvault"]
            .vaults.begin_create_or_update(
                RG,
                VAULT,
                {
                    "location": info["location"],
                    "properties": {
                        "tenantId": info["tenant_id"],
                        "sku": {"family": "A", "name": "standard"},
                        "accessPolicies": [
                            {
                                "tenantId": info["tenant_id"],
                                "objectId": info["controller_object_id"],
                                "permissions": {"secrets": ["get", "set", "list", "delete"]},
                            },
                            {
                                "tenantId": info["tenant_id"],
                                "objectId": reader.principal_id,
                                "permissions": {"secrets": ["get"]},
                            },
                        ],
                    },
                },
            )
            .result()
        )
        secrets = SecretClient(vault.properties.vault_uri, DefaultAzureCredential())
        secrets.set_secret(SECRET, "the join bundle")
        nic = (
            sdk["network"]
            .network_interfaces.begin_create_or_update(
                RG,
                f"{VM}-nic",
                {
                    "location": info["location"],
                    "properties": {
                        "ipConfigurations": [
                            {
                                "name": "ipconfig1",
                                "properties": {
                                    "subnet": {"id": info["subnet_id"]},
                                    "privateIPAllocationMethod": "Static",
                                    "privateIPAddress": ADDRESS,
                                },
                            }
                        ]
                    },
                },
            )
            .result()
        )
        started = time.monotonic()
        created = (
            sdk["compute"]
            .virtual_machines.begin_create_or_update(
                RG,
                VM,
                {
                    "location": info["location"],
                    "tags": {"clusterbake-name": "vm1", "purpose": "twin test"},
                    "identity": {"type": "UserAssigned", "userAssignedIdentities": {reader.id: {}}},
                    "properties": {
                        "hardwareProfile": {"vmSize": SIZE},
                        "storageProfile": {
                            "imageReference": {"id": next(iter(info["images"].values()))},
                            "osDisk": {"createOption": "FromImage", "deleteOption": "Delete"},
                        },
                        "osProfile": {
                            "computerName": VM,
                            "adminUsername": "azureuser",
                            "linuxConfiguration": {
                                "disablePasswordAuthentication": True,
                                "ssh": {
                                    "publicKeys": [
                                        {"path": "/home/azureuser/.ssh/authorized_keys", "keyData": PUBLIC_KEY}
                                    ]
                                },
                            },
                        },
                        "networkProfile": {
                            "networkInterfaces": [{"id": nic.id, "properties": {"deleteOption": "Delete"}}]
                        },
                        "userData": base64.b64encode(USER_DATA).decode(),
                        # Named, as the provider names it: Trusted Launch would be this api-version's default,
                        # and the twin's image is a managed image, which Trusted Launch refuses.
                        "securityProfile": {"securityType": "Standard"},
                    },
                },
            )
            .result()
        )
    wait_for(
        "the VM's node runs",
        lambda: (azure.vm(VM) or {}).get("node") == "running",
        timeout=NODE_TIMEOUT,
        interval=0.1,
    )
    print(f"node running {time.monotonic() - started:.1f}s after the create request")
    wait_for("the node's boot", lambda: booted(azure, created.vm_id), timeout=90)
    return {"id": created.id, "vm_id": created.vm_id, "reader": reader, "other": identities["citwinaz-other"],
            "vault_uri": vault.properties.vault_uri}  # fmt: skip


def booted(azure: AzureTwin, vm_id: str) -> bool:
    """The node's systemd finished booting (no SSH: a VM whose user data is not the product's has
    no host keys, as an image without a provisioning agent would have none)."""
    try:
        result = azure.inside(vm_id, "systemctl is-system-running", check=False, timeout=20)
    except AssertionError:
        return False
    return result.stdout.strip() in ("running", "degraded")


def imds(azure: AzureTwin, vm: dict, program: str) -> dict:
    result = azure.python_inside(vm["vm_id"], IMDS_PROGRAM + program)
    return json.loads(result.stdout)


def test_vm_boots_as_a_node_at_its_private_ip(azure, vm):
    status = next(v for v in azure.status()["vms"] if v["name"] == VM)  # `clusterbake twin status azure`
    assert (status["address"], status["power"], status["node"]) == (ADDRESS, "running", "running")
    inside = azure.inside(vm["vm_id"], "ip -4 -o addr show dev eth0; hostname; cat /etc/resolv.conf")
    assert f"inet {ADDRESS}/24" in inside.stdout, inside.stdout
    assert VM in inside.stdout.split()  # computerName, as Azure's provisioning agent sets it
    assert "nameserver 168.63.129.16" in inside.stdout  # Azure's DNS, as its DHCP says
    names = azure.inside(vm["vm_id"], f"getent hosts {VAULT}.vault.azure.net {VM}").stdout.split()
    assert names == ["10.91.0.1", f"{VAULT}.vault.azure.net", ADDRESS, f"{VM}.clusterbake-twin.internal.cloudapp.net"]


def test_imds_answers_as_azures(azure, vm):
    answers = imds(
        azure,
        vm,
        """
print(json.dumps({
    "no_header": call("/metadata/instance?api-version=2021-02-01", {}),
    "forwarded": call("/metadata/instance?api-version=2021-02-01", {**M, "X-Forwarded-For": "10.91.0.99"}),
    "no_version": call("/metadata/instance", M),
    "bad_version": call("/metadata/instance?api-version=2099-01-01", M),
    "document": call("/metadata/instance?api-version=2021-02-01", M),
    "size": call("/metadata/instance/compute/vmSize?api-version=2021-02-01&format=text", M),
    "user_data": call("/metadata/instance/compute/userData?api-version=2021-01-01&format=text", M),
    "address": call("/metadata/instance/network/interface/0/ipv4/ipAddress/0/privateIpAddress"
                    "?api-version=2021-02-01&format=text", M),
}))
""",
    )
    assert answers["no_header"][0] == 400 and "metadata header" in answers["no_header"][1]
    assert answers["forwarded"][0] == 400 and "X-Forwarded-For" in answers["forwarded"][1]
    assert answers["no_version"][0] == 400 and "newest-versions" in json.loads(answers["no_version"][1])
    assert answers["bad_version"][0] == 400
    status, text = answers["document"]
    assert status == 200
    document = json.loads(text)
    compute = document["compute"]
    assert (compute["name"], compute["vmSize"], compute["location"]) == (VM, SIZE, azure.info["location"])
    assert compute["resourceId"].lower() == vm["id"].lower() and compute["vmId"] == vm["vm_id"]
    assert base64.b64decode(compute["userData"]) == USER_DATA
    assert compute["customData"] == ""  # Azure's IMDS never serves customData
    assert {"name": "clusterbake-name", "value": "vm1"} in compute["tagsList"]
    assert compute["osProfile"]["computerName"] == VM
    assert compute["publicKeys"] == [{"keyData": PUBLIC_KEY, "path": "/home/azureuser/.ssh/authorized_keys"}]
    interface = document["network"]["interface"][0]
    assert interface["ipv4"]["ipAddress"][0]["privateIpAddress"] == ADDRESS
    assert interface["ipv4"]["subnet"] == [{"address": "10.91.0.0", "prefix": "24"}]
    assert answers["size"] == [200, SIZE]
    assert base64.b64decode(answers["user_data"][1]) == USER_DATA
    assert answers["address"] == [200, ADDRESS]


def test_identity_token_reads_key_vault_from_the_node(azure, vm):
    """Azure's DNS names the vault, the node trusts its certificate, the token of the VM's identity
    opens it; a token for an identity the VM does not have is refused by IMDS."""
    answers = imds(
        azure,
        vm,
        f"""
token_path = "/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https%3A%2F%2Fvault.azure.net"
# A new identity has no token until Entra ID replicated it (the twin's identity spread, seconds): wait, as the
# node's boot program does.
for _ in range(60):
    mine = call(token_path + "&client_id={vm["reader"].client_id}", M)
    if mine[0] == 200:
        break
    time.sleep(0.25)
other = call(token_path + "&client_id={vm["other"].client_id}", M)
default = call(token_path, M)
token = json.loads(mine[1])["access_token"]
request = urllib.request.Request("{vm["vault_uri"]}secrets/{SECRET}?api-version=7.4",
                                 headers={{"Authorization": "Bearer " + token}})
try:
    with urllib.request.urlopen(request, timeout=10) as response:  # the system's CAs, the node's DNS
        secret = [response.status, json.loads(response.read())["value"]]
except urllib.error.HTTPError as error:
    secret = [error.code, error.read().decode()]
print(json.dumps({{"mine": mine, "other": other, "default": default, "secret": secret}}))
""",
    )
    assert answers["mine"][0] == 200, answers["mine"]
    token = json.loads(answers["mine"][1])
    assert token["client_id"] == vm["reader"].client_id and token["resource"] == "https://vault.azure.net"
    assert token["token_type"] == "Bearer" and int(token["expires_on"]) > time.time()
    assert answers["secret"] == [200, "the join bundle"]
    assert answers["other"][0] == 400 and json.loads(answers["other"][1]) == {
        "error": "invalid_request",
        "error_description": "Identity not found",
    }
    # One user-assigned identity: it is the VM's default.
    assert answers["default"][0] == 200 and json.loads(answers["default"][1])["client_id"] == vm["reader"].client_id


def test_scheduled_events_set_by_the_test_appear_in_the_nodes_imds(azure, vm):
    events_path = "/metadata/scheduledevents?api-version=2020-07-01"
    empty = imds(azure, vm, f'print(json.dumps(call("{events_path}", M)))')
    assert empty[0] == 200 and json.loads(empty[1])["Events"] == []
    azure.control("PUT", f"/vms/{VM}/scheduledevents", {"EventType": "Preempt"})
    status, text = imds(azure, vm, f'print(json.dumps(call("{events_path}", M)))')
    document = json.loads(text)
    assert status == 200 and len(document["Events"]) == 1
    event = document["Events"][0]
    assert (event["EventType"], event["ResourceType"], event["Resources"], event["EventStatus"]) == (
        "Preempt",
        "VirtualMachine",
        [VM],
        "Scheduled",
    )
    assert event["NotBefore"].endswith(" GMT")
    # The VM acknowledges it (StartRequests): the event goes, the document's incarnation moves on.
    body = json.dumps({"StartRequests": [{"EventId": event["EventId"]}]})
    after = imds(
        azure,
        vm,
        f"""
posted = call("{events_path}", {{**M, "Content-Type": "application/json"}}, "POST", {body!r}.encode())
print(json.dumps([posted, call("{events_path}", M)]))
""",
    )
    assert after[0][0] == 200
    later = json.loads(after[1][1])
    assert later["Events"] == [] and later["DocumentIncarnation"] > document["DocumentIncarnation"]
    azure.control("PUT", f"/vms/{VM}/scheduledevents", {"EventType": "Terminate", "NotBeforeSeconds": 600})
    assert [e["EventType"] for e in azure.vm(VM)["scheduled_events"]] == ["Terminate"]
    azure.control("DELETE", f"/vms/{VM}/scheduledevents")
    assert azure.vm(VM)["scheduled_events"] == []


def test_deallocate_stops_the_node_and_start_boots_it_again(azure, sdk, vm):
    azure.inside(vm["vm_id"], "echo kept > /var/tmp/clusterbake-twin-marker")
    with Environ(azure.env):
        started = time.monotonic()
        sdk["compute"].virtual_machines.begin_deallocate(RG, VM).result()
        wait_for("the node stops", lambda: azure.vm(VM)["node"] == "stopped", timeout=NODE_TIMEOUT, interval=0.1)
        print(f"deallocate -> node stopped: {time.monotonic() - started:.1f}s")
        assert not machines.find_machines(f"cb-twin-azure-{vm['vm_id']}")
        view = sdk["compute"].virtual_machines.instance_view(RG, VM)
        assert "PowerState/deallocated" in [s.code for s in view.statuses]
        started = time.monotonic()
        sdk["compute"].virtual_machines.begin_start(RG, VM).result()
        wait_for("the node runs again", lambda: azure.vm(VM)["node"] == "running", timeout=NODE_TIMEOUT, interval=0.1)
        print(f"start -> node running: {time.monotonic() - started:.1f}s")
    # The OS disk outlived the deallocation.
    wait_for("the node boots", lambda: booted(azure, vm["vm_id"]), timeout=90)
    assert azure.inside(vm["vm_id"], "cat /var/tmp/clusterbake-twin-marker").stdout.strip() == "kept"


def test_restart_reboots_the_node(azure, sdk, vm):
    before = azure.node_pid(vm["vm_id"])
    with Environ(azure.env):
        sdk["compute"].virtual_machines.begin_restart(RG, VM).result()

    def rebooted() -> bool:
        try:
            return azure.node_pid(vm["vm_id"]) != before
        except AssertionError:  # between the halt and the boot
            return False

    wait_for("a new boot of the node", rebooted, timeout=NODE_TIMEOUT + 15, interval=0.2)
    wait_for("the node boots", lambda: booted(azure, vm["vm_id"]), timeout=90)


def test_poweroff_inside_leaves_the_vm_stopped(azure, sdk, vm):
    wait_for("the node boots", lambda: booted(azure, vm["vm_id"]), timeout=90)
    azure.inside(vm["vm_id"], "systemctl poweroff --no-block")
    with Environ(azure.env):

        def power() -> list[str]:
            view = sdk["compute"].virtual_machines.instance_view(RG, VM)
            return [s.code for s in view.statuses if s.code.startswith("PowerState/")]

        wait_for("the VM stopped", lambda: power() == ["PowerState/stopped"], timeout=30)
        assert azure.vm(VM)["node"] == "stopped"
        sdk["compute"].virtual_machines.begin_start(RG, VM).result()
    wait_for("the node runs again", lambda: azure.vm(VM)["node"] == "running", timeout=NODE_TIMEOUT, interval=0.1)


def test_delete_removes_the_node(azure, sdk, vm):
    with Environ(azure.env):
        started = time.monotonic()
        sdk["compute"].virtual_machines.begin_delete(RG, VM).result()
    wait_for("the node goes", lambda: azure.vm(VM) is None, timeout=NODE_TIMEOUT, interval=0.1)
    print(f"delete -> node removed: {time.monotonic() - started:.1f}s")
    assert not machines.find_machines(f"cb-twin-azure-{vm['vm_id']}")
    netns = run(["ip", "netns", "list"]).stdout
    assert vm["vm_id"] not in netns
    with Environ(azure.env):
        sdk["resources"].resource_groups.begin_delete(RG).result()


@pytest.mark.ends_shared_cluster  # the twin: after every other test of the run
def test_twin_down_leaves_nothing(azure):
    run([*CB, "twin", "down", "azure"], timeout=300)
    assert host_leftovers("azure") == []
