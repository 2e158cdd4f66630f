"""Helpers of the azure provider's tests: the ARM twin handle, the CLI, the inventory script.

Nothing here talks to Azure: the twin (src/clusterbake/twins/azure/arm.py) runs as a
subprocess on 127.0.0.1 over HTTPS, and the code under test finds it through the standard
environment only (AZURE_RESOURCE_MANAGER_ENDPOINT, a managed-identity token endpoint,
REQUESTS_CA_BUNDLE, HTTPS_PROXY for Key Vault's data plane).
"""

from __future__ import annotations

import importlib.util
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from clitest import run_cli, run_inventory, stop_server
from sdkenv import Environ

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CB = [str(REPO / ".venv" / "bin" / "clusterbake")]
LOCATION = "eastus"
NET_GROUP = "net-rg"
VNET = "hpc-vnet"
SUBNET = "nodes"
SUBNET_PREFIX = "10.70.0.0/24"
IMAGE = "Canonical:ubuntu-24_04-lts:server:latest"
SDK = all(importlib.util.find_spec(m) for m in ("azure.identity", "azure.mgmt.compute", "azure.keyvault.secrets"))
# The SDK is a dependency (pyproject.toml): a run that requires every test (CI) fails without it.
needs_sdk = pytest.mark.skipif(
    not SDK and not os.environ.get("CLUSTERBAKE_REQUIRE_INTEGRATION"),
    reason="the Azure SDK (azure-mgmt-*, azure-identity) is not installed: make venv",
)


@dataclass
class Twin:
    url: str
    directory: Path
    endpoints: dict
    env: dict[str, str]

    @property
    def subscription(self) -> str:
        return self.endpoints["subscription_id"]

    def request(self, method: str, path: str, body=None, token: str | None = None, headers: dict | None = None):
        """(status, JSON body or None, headers) of a raw HTTPS request to the twin."""
        context = ssl.create_default_context(cafile=self.endpoints["ca_file"])
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        for key, value in (headers or {}).items():
            request.add_header(key, value)
        try:
            with urllib.request.urlopen(request, context=context, timeout=30) as response:
                raw = response.read()
                return response.status, (json.loads(raw) if raw else None), dict(response.headers)
        except urllib.error.HTTPError as error:
            raw = error.read()
            return error.code, (json.loads(raw) if raw else None), dict(error.headers)

    def console(self, vm_id: str, text: str) -> None:
        """What the VM's serial console shows (boot diagnostics' log; its boot program prints its host keys)."""
        (self.directory.parent / "console" / f"{vm_id}.log").write_text(text)

    def token(self, client_id: str | None = None, resource: str = "https://management.azure.com") -> str:
        query = f"/msi/token?api-version=2019-08-01&resource={resource}"
        if client_id:
            query += f"&client_id={client_id}"
        status, body, _ = self.request("GET", query, headers={"X-IDENTITY-HEADER": self.env["IDENTITY_HEADER"]})
        assert status == 200, body
        return body["access_token"]

    def state(self) -> dict:
        status, body, _ = self.request("GET", "/_twin/state")
        assert status == 200, body
        return body

    def set_capacity(self, limits: dict[str, dict] | None) -> None:
        status, body, _ = self.request("PUT", "/_twin/capacity", limits or {})
        assert status == 200, body

    def throttle(self, policies: dict[str, dict] | None = None) -> dict:
        """Compute's throttling: set `policies` ({"LowCostGet": {"limit", "seconds"}}, {}: off), None: leave
        them; the policies and how many calls were refused since they were set."""
        status, body, _ = self.request("GET" if policies is None else "PUT", "/_twin/throttle", policies)
        assert status == 200, body
        return body

    def set_quota(self, quota: dict[str, dict] | None) -> None:
        status, body, _ = self.request("PUT", "/_twin/quota", quota or {})
        assert status == 200, body

    @contextmanager
    def spread(self, **seconds: float) -> Iterator[None]:
        """Within: RBAC writes (`rbac=`) and new identities (`identity=`) take effect only after these many
        seconds (the twin's replication switch, on by default; these tests' twins start with it at 0)."""
        status, before, _ = self.request("GET", "/_twin/spread")
        assert status == 200, before
        status, body, _ = self.request("PUT", "/_twin/spread", seconds)
        assert status == 200, body
        try:
            yield
        finally:
            self.request("PUT", "/_twin/spread", before)

    def resources_of(self, cluster: str) -> list[dict]:
        """Every resource of the twin tagged clusterbake-cluster=<cluster> (and untagged disks of its VMs)."""
        found = []
        for resource in self.state()["resources"].values():
            tags = resource.get("tags") or {}
            if tags.get("clusterbake-cluster") == cluster or resource["name"].startswith(f"{cluster}-"):
                found.append(resource)
        return found

    def sdk_env(self):
        """Context: this process's environment pointed at the twin (for in-process SDK calls)."""
        return Environ(self.env)


def example_config(twin: Twin, **changes) -> dict:
    """examples/azure-ndv5.yaml on the twin's subscription and network, then `changes` (top-level keys)."""
    config = yaml.safe_load((REPO / "examples" / "azure-ndv5.yaml").read_text())
    config["azure"] |= {
        "subscription_id": twin.subscription,
        "location": LOCATION,
        "subnet_id": f"/subscriptions/{twin.subscription}/resourceGroups/{NET_GROUP}/providers/"
        f"Microsoft.Network/virtualNetworks/{VNET}/subnets/{SUBNET}",
        "image": IMAGE,
    }
    azure = changes.pop("azure", {})
    config.update(changes)
    config["azure"] |= azure
    return config


def one_node_config(twin: Twin, cluster: str, subnet: str, storage: list[dict]) -> dict:
    """The storage tests' cluster: the example's head and one Standard_D4s_v5 node on `subnet`,
    in resource group <cluster>-rg, with `storage`."""
    config = example_config(twin, cluster_name=cluster, storage=storage)
    config["azure"] |= {"resource_group": f"{cluster}-rg", "subnet_id": subnet}
    config["node_groups"] = [{"name": "cpu", "count": 1, "instance_type": "Standard_D4s_v5"}]
    config["head"] = {"instance_type": "Standard_D4s_v5"}
    config["partitions"] = [{"name": "cpu", "node_groups": ["cpu"], "default": True}]
    return config


def provisioned(twin: Twin, state_dir: Path, config: dict, cluster: str) -> Iterator[dict]:
    """A module fixture's body: `cluster up --provision-only`, the run's facts, then `cluster down`."""
    first = run_cb(twin, state_dir, config, "cluster", "up", "--provision-only")
    yield {"state_dir": state_dir, "config": config, "first": first, "path": state_dir / f"{cluster}.yaml"}
    run_cb(twin, state_dir, config, "cluster", "down")


def run_cb(twin: Twin, state_dir: Path, config: dict | Path, *args: str, check: bool = True, timeout: int = 180):
    """The real CLI as a subprocess against the twin."""
    return run_cli(twin.env, state_dir, config, *args, check=check, timeout=timeout)


def inventory(twin: Twin, state_dir: Path, config_path: Path, **env: str) -> dict:
    return run_inventory("azure_rm.py", twin.env, state_dir, config_path, **env)


def of_type(resources: list[dict], kind: str) -> list[dict]:
    return [r for r in resources if r["type"] == kind]


PAGE_SIZE = 3  # small pages: every listing of the tests goes through nextLink


@contextmanager
def arm_twin(root: Path, page_size: int = PAGE_SIZE) -> Iterator[Twin]:
    """The ARM twin as a subprocess. Its replication spreads start at 0 (RBAC writes and new identities
    effective at once): most tests are about something else, and `Twin.spread` turns them on."""
    directory = root / "twin"
    log_path = root / "twin.log"
    (directory / "endpoints.json").unlink(missing_ok=True)  # a restart on the same state: wait for the new one
    console_dir = root / "console"
    console_dir.mkdir(parents=True, exist_ok=True)
    base_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
    }
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "arm_twin_server.py"),
                "--dir",
                str(directory),
                "--page-size",
                str(page_size),
                "--operation-seconds",
                "0.1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **base_env,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), base_env.get("PYTHONPATH")])),
                "ARM_TWIN_CONSOLE_DIR": str(console_dir),
                "ARM_TWIN_RBAC_SPREAD": "0",
                "ARM_TWIN_IDENTITY_SPREAD": "0",
            },
        )
        try:
            deadline = time.monotonic() + 30
            endpoints_file = directory / "endpoints.json"
            while not endpoints_file.exists():
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the ARM twin did not start: {log_path.read_text()}")
                time.sleep(0.1)
            endpoints = json.loads(endpoints_file.read_text())
            env = {
                **base_env,
                **endpoints["env"],
                # No Azure CLI, shared token cache or other credential source of this host.
                "AZURE_CONFIG_DIR": str(root / "az"),
            }
            yield Twin(endpoints["arm"], directory, endpoints, env)
        finally:
            stop_server(server)


def make_network(twin: Twin) -> str:
    """The existing network a cluster runs in (not clusterbake's): a resource group, a virtual network
    and a subnet, created with the SDK. Returns the subnet id."""
    from azure.identity import DefaultAzureCredential
    from azure.mgmt.network import NetworkManagementClient
    from azure.mgmt.resource.resources import ResourceManagementClient

    with twin.sdk_env():
        credential = DefaultAzureCredential()
        resources = ResourceManagementClient(credential, twin.subscription, base_url=twin.url)
        resources.resource_groups.create_or_update(NET_GROUP, {"location": LOCATION})
        network = NetworkManagementClient(credential, twin.subscription, base_url=twin.url)
        vnet = network.virtual_networks.begin_create_or_update(
            NET_GROUP,
            VNET,
            {
                "location": LOCATION,
                "properties": {
                    "addressSpace": {"addressPrefixes": ["10.70.0.0/16"]},
                    "subnets": [
                        {"name": SUBNET, "properties": {"addressPrefix": SUBNET_PREFIX}},
                        {"name": "tiny", "properties": {"addressPrefix": "10.70.9.0/29"}},
                    ],
                },
            },
        ).result()
        network.virtual_networks.begin_create_or_update(
            NET_GROUP,
            "west-vnet",
            {
                "location": "westeurope",
                "properties": {
                    "addressSpace": {"addressPrefixes": ["10.80.0.0/16"]},
                    "subnets": [{"name": SUBNET, "properties": {"addressPrefix": "10.80.0.0/24"}}],
                },
            },
        ).result()
        return next(s.id for s in vnet.subnets if s.name == SUBNET)


def subnet_id(twin: Twin, name: str) -> str:
    """A subnet of the existing network (make_network) by name."""
    return (
        f"/subscriptions/{twin.subscription}/resourceGroups/{NET_GROUP}/providers/Microsoft.Network/"
        f"virtualNetworks/{VNET}/subnets/{name}"
    )


def storage_subnet(twin: Twin, name: str, prefix: str) -> str:
    """A subnet of the existing network with the Microsoft.Storage service endpoint (what the cluster's storage
    accounts admit): its id."""
    return new_subnet(twin, name, prefix, [{"service": "Microsoft.Storage"}])


def new_subnet(twin: Twin, name: str, prefix: str, service_endpoints: list[dict] | None = None, **properties) -> str:
    """A subnet of the existing network (a cluster's own, so no other test's addresses are in it), with more
    `properties` when given: its id."""
    from azure.identity import DefaultAzureCredential
    from azure.mgmt.network import NetworkManagementClient

    with twin.sdk_env():
        network = NetworkManagementClient(DefaultAzureCredential(), twin.subscription, base_url=twin.url)
        network.subnets.begin_create_or_update(
            NET_GROUP,
            VNET,
            name,
            {"properties": {"addressPrefix": prefix, "serviceEndpoints": service_endpoints or [], **properties}},
        ).result()
    return subnet_id(twin, name)


@dataclass
class RawArm:
    """Raw ARM requests to the twin in one resource group (the wire format itself, not the SDK's view)."""

    twin: Twin
    group: str
    token: str
    version: str = "2024-07-01"

    @property
    def base(self) -> str:
        return f"/subscriptions/{self.twin.subscription}/resourceGroups/{self.group}/providers"

    def put(self, path: str, body: dict, version: str | None = None):
        return self.twin.request("PUT", f"{self.base}/{path}?api-version={version or self.version}", body, self.token)

    def wait(self, headers: dict) -> dict:
        """Poll Azure-AsyncOperation until it is done, as a client does."""
        url = headers["Azure-AsyncOperation"].removeprefix(self.twin.url)
        for _ in range(100):
            status, body, _ = self.twin.request("GET", url, token=self.token)
            assert status == 200, body
            if body["status"] != "InProgress":
                return body
            time.sleep(0.05)
        raise AssertionError("operation never finished")

    def nic(self, name: str, accelerated: bool = False, subnet: str | None = None) -> str:
        subnet = subnet or subnet_id(self.twin, SUBNET)
        ip = {"name": "ip", "properties": {"subnet": {"id": subnet}, "privateIPAllocationMethod": "Dynamic"}}
        properties = {"ipConfigurations": [ip], "enableAcceleratedNetworking": accelerated}
        status, body, headers = self.put(
            f"Microsoft.Network/networkInterfaces/{name}", {"location": LOCATION, "properties": properties}
        )
        assert status in (200, 201), body
        self.wait(headers)
        return body["id"]

    def vm(self, name: str, size: str, nic_id: str, zone: str | None = "1", version: str | None = None, **props):
        image = props.pop("image", {"publisher": "Canonical", "offer": "o", "sku": "s", "version": "latest"})
        key = {"path": "/home/azureuser/.ssh/authorized_keys", "keyData": "ssh-ed25519 AAAA"}
        body = {
            "location": LOCATION,
            **({"zones": [zone]} if zone else {}),
            "properties": {
                "hardwareProfile": {"vmSize": size},
                "storageProfile": {"imageReference": image, **props.pop("storage", {})},
                "osProfile": {
                    "computerName": name,
                    "adminUsername": "azureuser",
                    "linuxConfiguration": {"disablePasswordAuthentication": True, "ssh": {"publicKeys": [key]}},
                },
                "networkProfile": {"networkInterfaces": [{"id": nic_id}]},
                **props,
            },
        }
        return self.put(f"Microsoft.Compute/virtualMachines/{name}", body, version)


def gallery_image(twin: Twin, name: str, generation: str = "V2", trusted_launch_only: bool = False) -> str:
    """A gallery image version in the network's group (from a managed image of `generation`): its id."""
    arm = RawArm(twin, NET_GROUP, twin.token())
    status, source, _ = arm.put(
        f"Microsoft.Compute/images/{name}", {"location": LOCATION, "properties": {"hyperVGeneration": generation}}
    )
    assert status in (200, 201), source
    features = [{"name": "SecurityType", "value": "TrustedLaunch"}] if trusted_launch_only else []
    path = "Microsoft.Compute/galleries/clusterbake"
    parts = [
        (path, {}),
        (
            f"{path}/images/{name}",
            {
                "osType": "Linux",
                "hyperVGeneration": generation,
                "identifier": {"publisher": "clusterbake", "offer": "hpc", "sku": name},
                "features": features,
            },
        ),
        (f"{path}/images/{name}/versions/1.0.0", {"storageProfile": {"source": {"id": source["id"]}}}),
    ]
    for part, properties in parts:
        status, body, _ = arm.put(part, {"location": LOCATION, "properties": properties}, version="2024-03-03")
        assert status in (200, 201), body
    return body["id"]


def private_subnet(twin: Twin, name: str, prefix: str, nat: bool = False, endpoints: tuple[str, ...] = ()) -> str:
    """A subnet of the existing network without default outbound access (defaultOutboundAccess false), with a
    NAT gateway and service endpoints when asked: its id."""
    properties: dict = {"defaultOutboundAccess": False}
    if nat:
        arm = RawArm(twin, NET_GROUP, twin.token())
        status, gateway, _ = arm.put(
            f"Microsoft.Network/natGateways/{name}-nat", {"location": LOCATION, "sku": {"name": "Standard"}}
        )
        assert status in (200, 201), gateway
        properties["natGateway"] = {"id": gateway["id"]}
    return new_subnet(twin, name, prefix, [{"service": service} for service in endpoints], **properties)
