"""The azure backend: elastic nodes as VMs, created and deleted through ARM's REST API with a token
of the head's user-assigned identity from IMDS (providers/azure/power.py, role
`clusterbake-<cluster>-power-...`). A node is its NIC `<cluster>-<node>-nic` at its planned
address, then its VM `<cluster>-<node>` of the group's first size with capacity (bodies from the
provider, the node's name, size and user data filled in); a capacity error deletes what the
attempt made; powering down deletes the VM (its NIC and OS disk go with it)."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from .cloud import CloudBackend
from .core import PARALLEL, PowerError, log

# Errors of a VM create that say "not now, not this size" (Microsoft's "Troubleshoot allocation
# failures", "Resolve errors for SKU not available", quota errors): the next size is tried.
AZURE_CAPACITY_ERRORS = frozenset(
    {
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
        "SkuNotAvailable",
        "QuotaExceeded",
    }
)
AZURE_THROTTLED = frozenset({429, 500, 502, 503, 504})
AZURE_ADDRESS_IN_USE = "PrivateIPAddressInUse"
IMDS_TOKEN = "http://169.254.169.254/metadata/identity/oauth2/token"
ARM_RESOURCE = "https://management.azure.com/"
AZURE_POLL = 1.0
# Calls ARM throttles (or fails on its side) are tried this often, as Retry-After says.
ATTEMPTS = 6
AZURE_OPERATION_TIMEOUT = 900.0
# ARM honours a new role assignment (and a custom role's new actions) only once Azure has replicated it:
# "up to 10 minutes" ("Troubleshoot Azure RBAC"). `cluster up` makes the head's grants just before the
# first resumes, so a denial is tried again for this long before the node fails (realcloud review B7).
AUTHORIZATION_WAIT = 300.0
AUTHORIZATION_ERRORS = frozenset({"AuthorizationFailed", "LinkedAuthorizationFailed"})
# IMDS answers 400 "Identity not found" for a user-assigned identity that has not reached the VM yet (a
# new one: realcloud review D9), 404 while it updates, 410/429/5xx when busy: tried again for this long.
IDENTITY_WAIT = 120.0
IMDS_RETRY = frozenset({404, 410, 429, 500, 502, 503, 504})
WAIT_MOST = 15.0  # the longest pause between two tries of a denied call or a token
SAY_EVERY = 30.0


class AzureError(Exception):
    """An ARM error: HTTP status, Azure's code and message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, message

    @property
    def capacity(self) -> bool:
        # Exceeded quota comes as QuotaExceeded or, from the classic path, OperationNotAllowed naming the quota.
        quota = self.code == "OperationNotAllowed" and "quota" in self.message.lower()
        return self.code in AZURE_CAPACITY_ERRORS or quota


def urllib_http(method: str, url: str, body: bytes | None, headers: dict, timeout: float = 60):
    """(status, headers, body) of one HTTP request; the system's CA certificates verify HTTPS."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    # IMDS must not go through a proxy; ARM goes the way the environment says.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({})) if url.startswith(IMDS_TOKEN) else None
    try:
        with (opener.open if opener else urllib.request.urlopen)(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


class Waiting:
    """Tries of one call that Azure answers "not yet": again() pauses (1, 2, 4 ... WAIT_MOST seconds) and
    says True until `limit` seconds have passed since the first, logging the wait now and then."""

    def __init__(self, backend: AzureBackend, limit: float, what: str):
        self.backend, self.limit, self.what = backend, limit, what
        self.started: float | None = None
        self.said: float | None = None
        self.delay = 1.0

    def again(self, problem: str) -> bool:
        now = self.backend.clock()
        self.started = now if self.started is None else self.started
        waited = now - self.started
        if waited + self.delay > self.limit:
            return False
        if self.said is None or waited - self.said >= SAY_EVERY:
            log(self.backend.config, f"{self.what}: {problem}: waiting ({waited:.0f}s of {self.limit:.0f}s)")
            self.said = waited
        self.backend.sleep(self.delay)
        self.delay = min(self.delay * 2, WAIT_MOST)
        return True


def _header(headers: dict, name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), None)


class AzureBackend(CloudBackend):
    """Elastic nodes as VMs (a NIC at the node's planned address, then the VM), created and deleted with
    the head's user-assigned managed identity through ARM's REST API (standard library only)."""

    section, types_key = "azure", "sizes"
    api = listing_api = "ARM"

    def __init__(self, config: dict, http=None, sleep=time.sleep, clock=time.time):
        super().__init__(config, sleep, clock)
        self.azure = self.settings
        self.http = http or urllib_http
        self._token: tuple[str, float] | None = None
        group = f"/subscriptions/{self.azure['subscription_id']}/resourceGroups/{self.azure['resource_group']}"
        self.base = self.azure["arm_endpoint"].rstrip("/") + group

    # --- ARM ------------------------------------------------------------------------

    def token(self) -> str:
        """The head identity's ARM token from IMDS, kept until 5 minutes before it expires; an identity
        IMDS does not know yet (or an IMDS that is updating) is waited for IDENTITY_WAIT seconds."""
        if self._token and self._token[1] - 300 > self.clock():
            return self._token[0]
        query = urllib.parse.urlencode(
            {"api-version": "2018-02-01", "resource": ARM_RESOURCE, "client_id": self.azure["identity_client_id"]}
        )
        waiting = Waiting(self, IDENTITY_WAIT, "IMDS token of the head's identity")
        while True:
            status, _, body = self.http("GET", f"{IMDS_TOKEN}?{query}", None, {"Metadata": "true"})
            if status == 200:
                break
            problem = f"HTTP {status}: {body[:300]!r}"
            not_yet = status in IMDS_RETRY or (status == 400 and b"identity not found" in body.lower())
            if not (not_yet and waiting.again(problem)):
                raise PowerError(f"IMDS token for the head's identity: {problem}")
        answer = json.loads(body)
        self._token = (answer["access_token"], float(answer.get("expires_on", self.clock() + 3600)))
        return self._token[0]

    def call(self, method: str, url: str, body: dict | None = None) -> tuple[int, dict, dict]:
        """(status, headers, JSON body) of one ARM call; throttling and transient 5xx retried as
        Retry-After says, a denial (a grant not replicated yet) for AUTHORIZATION_WAIT; any other error
        raised as AzureError."""
        data = json.dumps(body).encode() if body is not None else None
        throttled = 0
        denied = Waiting(self, AUTHORIZATION_WAIT, f"{method} {url.split('?')[0]}")
        while True:
            headers = {"Authorization": f"Bearer {self.token()}", "Content-Type": "application/json"}
            status, answer_headers, raw = self.http(method, url, data, headers)
            answer = json.loads(raw) if raw else {}
            if status < 400:
                return status, answer_headers, answer
            if status in AZURE_THROTTLED and throttled < ATTEMPTS - 1:
                self.sleep(float(_header(answer_headers, "Retry-After") or min(20.0, 0.5 * 2**throttled)))
                throttled += 1
                continue
            error = answer.get("error") or {}
            failure = AzureError(status, error.get("code", f"HTTP{status}"), error.get("message", raw[:300].decode()))
            # A grant made a moment ago that ARM does not honour yet: the same call again, for a while.
            if not (failure.code in AUTHORIZATION_ERRORS and denied.again(f"{failure.code} (not replicated yet?)")):
                raise failure

    def cloud_error(self, exc: Exception) -> str | None:
        return str(exc) if isinstance(exc, AzureError) else None

    def wait(self, headers: dict, what: str) -> dict:
        """Until the long-running operation is done: its final status body; Failed raises its error."""
        url = _header(headers, "Azure-AsyncOperation")
        if not url:
            return {}
        deadline = self.clock() + AZURE_OPERATION_TIMEOUT
        while True:
            _, answer_headers, status = self.call("GET", url)
            if status.get("status") not in ("InProgress", None) or self.clock() > deadline:
                break
            self.sleep(float(_header(answer_headers, "Retry-After") or AZURE_POLL))
        if status.get("status") == "Failed":
            error = status.get("error") or {}
            raise AzureError(200, error.get("code", "Failed"), error.get("message", what))
        if status.get("status") != "Succeeded":
            raise PowerError(f"{what}: Azure's operation still {status.get('status')} after {AZURE_OPERATION_TIMEOUT}s")
        return status

    def url(self, kind: str, name: str = "") -> str:
        provider, version = {
            "vm": ("Microsoft.Compute/virtualMachines", self.azure["api_versions"]["compute"]),
            "nic": ("Microsoft.Network/networkInterfaces", self.azure["api_versions"]["network"]),
        }[kind]
        return f"{self.base}/providers/{provider}{'/' + name if name else ''}?api-version={version}"

    def vm_name(self, node: str) -> str:
        return f"{self.cluster}-{node}"

    def nic_name(self, node: str) -> str:
        return f"{self.cluster}-{node}-nic"

    def listing(self, kind: str) -> list[dict]:
        found, url = [], self.url(kind)
        while url:
            _, _, page = self.call("GET", url)
            found += page.get("value", [])
            url = page.get("nextLink")
        return found

    def vms(self) -> dict[str, dict]:
        """The cluster's VMs by node name (tag clusterbake-name)."""
        found = {}
        for vm in self.listing("vm"):
            tags = vm.get("tags") or {}
            if tags.get("clusterbake-cluster") == self.cluster and tags.get("clusterbake-name"):
                found[tags["clusterbake-name"]] = vm
        return found

    def running_nodes(self) -> set[str]:
        vms = self.vms()
        return {n for n, vm in vms.items() if (vm.get("properties") or {}).get("provisioningState") != "Deleting"}

    # --- power -------------------------------------------------------------------------

    def existing(self, nodes: list[str]) -> dict[str, dict]:
        return self.vms()

    def alive(self, node: str, existing: dict[str, dict]) -> str | None:
        vm = existing.get(node)
        state = ((vm or {}).get("properties") or {}).get("provisioningState")
        return f"{vm['name']} exists already ({state})" if state in ("Succeeded", "Creating", "Updating") else None

    def clear(self, node: str, existing: dict[str, dict]) -> None:
        """A failed VM, or one being deleted, holds the node's address: it goes."""
        vm = existing.get(node)
        if vm is not None:
            self.delete_vm(node)
            state = (vm.get("properties") or {}).get("provisioningState")
            log(self.config, f"resume {node}: deleted its {state} VM {vm['name']}")

    def failure(self, node: str, exc: Exception) -> tuple[str, str] | str:
        if not isinstance(exc, AzureError):
            raise exc
        self.delete_vm(node)  # what a failed create left (its NIC, a VM in Failed)
        return (exc.code, exc.message) if exc.capacity else f"{exc.code}: {exc.message}"

    def create(self, node: str, group: dict, size: str, run_id: str) -> str:
        """The node's NIC at its address, then its VM of `size`: the VM's name once Azure provisioned it."""
        nic = json.loads(json.dumps(group["nic"]))
        nic["tags"] = {**nic.get("tags", {}), "clusterbake-name": node}
        nic["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"] = group["addresses"][node]
        _, headers, created = self.at_address(
            node,
            group["addresses"][node],
            lambda: self.call("PUT", self.url("nic", self.nic_name(node)), nic),
            lambda exc: isinstance(exc, AzureError) and exc.code == AZURE_ADDRESS_IN_USE,
        )
        self.wait(headers, f"NIC of {node}")
        vm = json.loads(json.dumps(group["vm"]))
        user_data = base64.b64encode(group["user_data"].replace(self.azure["name_placeholder"], node).encode()).decode()
        vm["tags"] = {**vm.get("tags", {}), "clusterbake-name": node}
        props = vm["properties"]
        props["hardwareProfile"]["vmSize"] = size
        props["osProfile"]["computerName"] = node
        props["osProfile"]["customData"] = user_data
        props["userData"] = user_data
        props["networkProfile"]["networkInterfaces"][0]["id"] = created["id"]
        _, headers, _ = self.call("PUT", self.url("vm", self.vm_name(node)), vm)
        self.wait(headers, f"VM of {node}")
        return self.vm_name(node)

    def delete_vm(self, node: str) -> None:
        """The node's VM (its NIC and OS disk go with it: deleteOption Delete) and a NIC left without one."""
        for kind, name in (("vm", self.vm_name(node)), ("nic", self.nic_name(node))):
            try:
                _, headers, _ = self.call("DELETE", self.url(kind, name))
            except AzureError as exc:
                if exc.status == 404:
                    continue
                raise
            self.wait(headers, f"delete {name}")

    def stop(self, nodes: list[str]) -> dict[str, str]:
        """Delete the nodes' VMs (those without one are already off)."""
        existing = self.vms()
        gone = [n for n in nodes if n in existing]
        results = {node: "ok" for node in nodes}

        def delete(node: str) -> str:
            try:
                self.delete_vm(node)
            except AzureError as exc:
                return str(exc)
            log(self.config, f"delete {node}: {existing[node]['name']}")
            return "ok"

        if gone:
            with ThreadPoolExecutor(max_workers=min(PARALLEL, len(gone))) as pool:
                results |= dict(zip(gone, pool.map(delete, gone), strict=True))
        return results
