"""Helpers of the Azure twin's tests: `twin up azure`'s environment, the real Azure SDK against it,
nsenter into a VM's node, and what the twin could leave on the host."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.request
from pathlib import Path

import yaml
from sdkenv import Environ
from twintest import CB, REPO, Twin, node_init_pid, run, twin_environment

TWIN_NET = "twin-azure"


def example_cluster(env: dict[str, str], directory: Path, example: str, name: str, edit=None) -> Twin:
    """examples/<example> as cluster `name` in resource group `<name>-rg` (`edit` changes the config
    further), brought up with the real CLI; `.up` holds what `cluster up` printed."""
    config = yaml.safe_load((REPO / "examples" / example).read_text())
    config["cluster_name"] = name
    config["azure"]["resource_group"] = f"{name}-rg"
    if edit is not None:
        edit(config)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    cluster = Twin(env, path, name)
    cluster.up = cluster.cb("cluster", "up", timeout=1200)
    return cluster


def azure_twin_environment() -> dict[str, str]:
    """`clusterbake twin up azure`'s export lines, applied to a copy of this environment."""
    return twin_environment("azure")


class AzureTwin:
    def __init__(self, env: dict[str, str]):
        self.env = env
        self.info = self.status()
        self.subscription = self.info["subscription_id"]

    def status(self) -> dict:
        return json.loads(run([*CB, "twin", "status", "azure"], env=self.env).stdout)

    def vm(self, name: str) -> dict | None:
        """The VM as the twin's control socket reports it (fast enough to poll)."""
        return next((v for v in self.control("GET", "/status")["vms"] if v["name"] == name), None)

    def control(self, method: str, path: str, body: dict | None = None) -> dict:
        from clusterbake.state import StateDir
        from clusterbake.twins.azure import control

        state = StateDir(Path(os.environ.get("CLUSTERBAKE_STATE_DIR", "/var/lib/clusterbake")))
        return control.request(state, method, path, body)

    def _switch(self, method: str, path: str, body: dict | None = None) -> dict:
        """A test switch of the ARM fake (`/_twin/...`, no token), over its TLS."""
        context = ssl.create_default_context(cafile=self.env["REQUESTS_CA_BUNDLE"])
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )
        request = urllib.request.Request(
            self.env["AZURE_RESOURCE_MANAGER_ENDPOINT"] + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with opener.open(request, timeout=30) as response:
            return json.loads(response.read())

    def arm_state(self) -> dict:
        """The ARM fake's whole subscription (`GET /_twin/state`)."""
        return self._switch("GET", "/_twin/state")

    def set_capacity(self, limits: dict[str, dict] | None) -> None:
        """Azure's capacity per VM size: creating one past `limit` fails with `code` (None: no limit)."""
        assert self._switch("PUT", "/_twin/capacity", limits or {}) == {k.lower(): v for k, v in (limits or {}).items()}

    def clients(self):
        """(compute, network, msi, keyvault, resources) management clients, made with the twin's environment."""
        from azure.identity import DefaultAzureCredential
        from azure.mgmt.compute import ComputeManagementClient
        from azure.mgmt.keyvault import KeyVaultManagementClient
        from azure.mgmt.msi import ManagedServiceIdentityClient
        from azure.mgmt.network import NetworkManagementClient
        from azure.mgmt.resource.resources import ResourceManagementClient

        with Environ(self.env):
            credential = DefaultAzureCredential(exclude_interactive_browser_credential=True)
            options = {"base_url": self.env["AZURE_RESOURCE_MANAGER_ENDPOINT"]}
            return (
                ComputeManagementClient(credential, self.subscription, **options),
                NetworkManagementClient(credential, self.subscription, **options),
                ManagedServiceIdentityClient(credential, self.subscription, **options),
                KeyVaultManagementClient(credential, self.subscription, **options),
                ResourceManagementClient(credential, self.subscription, **options),
            )

    def node_pid(self, vm_id: str) -> int:
        """PID 1 of the VM's node (the child of its nspawn process)."""
        return node_init_pid(f"cb-{TWIN_NET}-{vm_id}", f"VM {vm_id}")

    def inside(self, vm_id: str, command: str, check=True, timeout=120) -> subprocess.CompletedProcess:
        """A command in the node's namespaces, without SSH (what a console would show)."""
        pid = self.node_pid(vm_id)
        return run(["nsenter", "-t", str(pid), "-a", "sh", "-c", command], check=check, timeout=timeout)

    def python_inside(self, vm_id: str, program: str, check=True) -> subprocess.CompletedProcess:
        """A Python program run by the node's own python3 (standard library only, like the boot program)."""
        pid = self.node_pid(vm_id)
        return run(["nsenter", "-t", str(pid), "-a", "python3", "-c", program], check=check, timeout=120)
