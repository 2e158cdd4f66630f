"""The Azure twin's process: the ARM fake, Key Vault for the nodes, IMDS, DNS and the node keeper.

Started by `clusterbake twin up azure` (src/clusterbake/twins/azure/control.py), in a
session of its own, logging to <twin dir>/twin.log. One process, threads:

- the ARM fake (arm.py: ARM, the App Service managed identity endpoint, the Key Vault
  CONNECT proxy) on the twin's bridge address, so the host and every node reach the same
  API; its state and TLS files in <twin dir>/arm;
- Key Vault for the nodes: `https://<vault>.vault.azure.net` at the bridge address, port
  443 (the nodes' DNS answers each vault's name with it), arm.py's Key Vault handler with
  the vault taken from the Host header, behind the twin's certificate;
- Azure's IMDS (imds.py) at 169.254.169.254:80 and Azure's DNS (dns.py) at
  168.63.129.16:53, both in a service namespace on the bridge; the identity endpoint's
  tokens are signed by the ARM fake's own signing function (arm.Twin.token), for the
  principal of a user-assigned identity the VM has, so Key Vault decides on them by its
  access policies as it does for the host's tokens;
- the node keeper: every VM whose image is the twin's image becomes a node (nodes.py) at
  its NIC's private IP and follows the VM's power state within a fraction of a second
  (running; stopped and deallocated keep the disk; a deleted VM's node and disk go; a
  restart reboots the node); a node that powers itself off leaves its VM stopped, as
  Azure does. The keeper reads the subscription as `GET /_twin/state` shows it
  (ArmState.snapshot, in this process);
- a control socket for tests and the CLI (<twin dir>/control.sock, root only): `GET
  /status`; scheduled events on a VM's IMDS: `PUT /vms/<vm name>/scheduledevents
  {"EventType": "Preempt", "NotBeforeSeconds": 30}` adds one (`"Evict": true`: the Spot VM is
  evicted at NotBefore, as Azure does after its notice), `DELETE` removes them all; a VM's
  InfiniBand links (infiniband.py): `PUT /vms/<vm name>/infiniband {"state": "Down"}` (or
  "Active").

The twin's subscription, tenant, resource group `clusterbake-twin`, virtual network,
subnets (`nodes`, and `amlfs`: the next /24, for Managed Lustre file systems) and image are
the same on every start, so a config file can name them.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import re
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any

from clusterbake.twins.azure import infiniband
from clusterbake.twins.runtime import daemon_parser, in_netns, keep_reconciling, log, run_daemon, serve_control

POLL = 0.25
SERVICE_NETNS = "cbsvc-twin-azure"
RESOURCE_GROUP = "clusterbake-twin"
VNET = "clusterbake-twin"
SUBNET = "nodes"
AMLFS_SUBNET = "amlfs"  # a subnet of its own for Azure Managed Lustre file systems, as Microsoft recommends
IMAGE = "clusterbake-twin-node"
NODE_VAULT_PORT = 443
API = {"group": "2021-04-01", "network": "2024-05-01", "compute": "2024-07-01"}
VAULT_HOST = re.compile(r"^([a-z0-9-]{3,24})\.vault\.azure\.net$")
FILE_HOST = re.compile(r"^([a-z0-9]{3,24})\.file\.core\.windows\.net$")
BLOB_HOST = re.compile(r"^([a-z0-9]{3,24})\.blob\.core\.windows\.net$")
# Azure's notice per event type ("Scheduled Events for Linux VMs"): NotBefore seconds, duration.
EVENT_DEFAULTS = {
    "Preempt": (30, -1),
    "Terminate": (300, -1),
    "Freeze": (900, 5),
    "Reboot": (900, -1),
    "Redeploy": (600, -1),
}
RUNNING = ("starting", "running")
# The nodes' storage directory (nodes.TwinNodes.storage): Lustre file systems and blob containers.
AMLFS = "amlfs"
BLOBS = "blobs"


def next_subnet(cidr: str) -> str:
    """The range of the same size right after `cidr` (10.91.0.0/24 -> 10.91.1.0/24)."""
    network = ipaddress.ip_network(cidr)
    return str(ipaddress.ip_network((int(network.network_address) + network.num_addresses, network.prefixlen)))


class AzureTwin:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.root = Path(args.state)
        self.address = args.address
        self.vnet_cidr = args.vnet_cidr
        self.images: dict[str, Path] = {}  # image resource id (lower case) -> image root
        self.image_ids: dict[str, str] = {}  # image name -> resource id
        self.events: dict[str, dict[str, Any]] = {}  # VM name (lower) -> {"incarnation", "events"}
        self.link_states: dict[str, str] = {}  # VM name (lower) -> its InfiniBand links' state, when not Active
        self.by_address: dict[str, dict[str, Any]] = {}  # the running VMs as IMDS answers them
        self.vms: dict[str, dict[str, Any]] = {}  # vmId -> what status shows
        self.operations_seen: set[str] = set()  # the ARM fake's operation ids the keeper has looked at
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.servers: list = []
        self.nodes = None

    # --- the ARM fake -----------------------------------------------------------------------

    def start_arm(self) -> None:
        from clusterbake.twins.azure import arm
        from clusterbake.twins.azure.nodes import AzureNodes
        from clusterbake.twins.azure.tls import make_certificates
        from clusterbake.twins.nodes import NodeKeeper

        directory = self.root / "arm"
        # The server certificate names the bridge address too (serve() makes none if these exist).
        self.ca_file, _, _ = make_certificates(directory / "tls", extra_ips=(self.address,))
        self.arm, servers = arm.serve(directory, host=self.address, port=self.args.port,
                                      proxy_port=self.args.proxy_port)  # fmt: skip
        self.servers += servers
        self.endpoints = json.loads((directory / "endpoints.json").read_text())
        self.context = ssl.create_default_context(cafile=str(self.ca_file))
        self.nodes = AzureNodes(self.root, self.vnet_cidr, self.ca_file, log)
        self.keeper = NodeKeeper(self.nodes, log)
        self.arm.blob_root = self.nodes.storage / BLOBS
        self.arm.console_log = lambda vm_id: self.nodes.paths(vm_id).console_log
        log(f"ARM on {self.arm.base_url}, Key Vault proxy on {self.endpoints['proxy']}")

    def arm_call(self, method: str, path: str, body: dict | None = None) -> dict:
        """A request to the ARM fake with the controller's token, as any client makes it."""
        from clusterbake.twins.azure.arm import ARM_AUDIENCE

        token, _ = self.arm.token(self.arm.controller_oid, ARM_AUDIENCE, "clusterbake-twin")
        request = urllib.request.Request(
            self.arm.base_url + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self.context)
        )
        try:
            with opener.open(request, timeout=30) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from None

    def setup_subscription(self) -> None:
        """The twin's resource group, virtual network and subnets, and its image: through the API."""
        sub = f"/subscriptions/{self.arm.state.subscription}"
        group = f"{sub}/resourceGroups/{RESOURCE_GROUP}"
        location = self.args.location
        tags = {"clusterbake-twin": "true"}
        self.arm_call("PUT", f"{group}?api-version={API['group']}", {"location": location, "tags": tags})
        vnet = f"{group}/providers/Microsoft.Network/virtualNetworks/{VNET}"
        self.arm_call(
            "PUT",
            f"{vnet}?api-version={API['network']}",
            {
                "location": location,
                "tags": tags,
                "properties": {
                    "addressSpace": {"addressPrefixes": [self.vnet_cidr]},
                    # With the Microsoft.Storage service endpoint, as NFS Azure file shares need.
                    "subnets": [
                        {
                            "name": SUBNET,
                            "properties": {
                                "addressPrefix": self.args.subnet_cidr,
                                "serviceEndpoints": [{"service": "Microsoft.Storage"}],
                            },
                        },
                        {"name": AMLFS_SUBNET, "properties": {"addressPrefix": next_subnet(self.args.subnet_cidr)}},
                    ],
                },
            },
        )
        for spec in self.args.image:
            name, _, path = spec.partition("=")
            image_id = f"{group}/providers/Microsoft.Compute/images/{IMAGE}"
            self.arm_call(
                "PUT",
                f"{image_id}?api-version={API['compute']}",
                {
                    "location": location,
                    "tags": {**tags, "clusterbake-twin-image": name},
                    "properties": {
                        "hyperVGeneration": "V2",
                        "storageProfile": {"osDisk": {"osType": "Linux", "osState": "Generalized"}},
                    },
                },
            )
            self.images[image_id.lower()] = Path(path) / "rootfs"
            self.image_ids[name] = image_id
        deadline = time.monotonic() + 30
        while self.arm_call("GET", f"{vnet}?api-version={API['network']}")["properties"]["provisioningState"] != (
            "Succeeded"
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{vnet} was not provisioned")
            time.sleep(0.1)
        self.vnet_id = vnet
        self.subnet_id = f"{vnet}/subnets/{SUBNET}"
        log(f"subscription ready: {self.subnet_id}, images {self.image_ids}")

    # --- Key Vault, IMDS and DNS for the nodes ----------------------------------------------

    def start_node_vault(self) -> None:
        """`https://<vault>.vault.azure.net/` and `https://<account>.blob.core.windows.net/` for the nodes:
        arm.py's Key Vault and blob service (blob.py), by Host header."""
        from clusterbake.twins.azure import arm, blob, egress
        from clusterbake.twins.azure.tls import server_context

        directory = self.root / "arm" / "tls"

        class NodeVaultHandler(arm.VaultHandler, arm.ServiceHandler):
            def _by_host(self) -> None:
                host = (self.headers.get("Host") or "").rsplit(":", 1)[0].lower()
                service = "Microsoft.Storage" if BLOB_HOST.match(host) else "Microsoft.KeyVault"
                with self.twin.state.lock:
                    reachable = egress.reaches(self.twin.state, self.client_address[0], service)
                if not reachable:  # no outbound path: nothing answers (egress.py)
                    log(f"{self.client_address[0]} has no outbound access to {host} (egress.py): connection closed")
                    self.close_connection = True
                    return
                if (blob_host := BLOB_HOST.match(host)) is not None:
                    self.reply(*blob.handle(
                        self.twin, self.command, self.path, self.headers, self.client_address[0], blob_host.group(1),
                        self.twin.blob_root,
                    ))  # fmt: skip
                    return
                match = VAULT_HOST.match(host)
                if match is None:
                    self._send(404, {"error": {"code": "NotFound", "message": f"{host} is not a Key Vault host"}})
                    return
                self.vault_name = match.group(1)
                self._dispatch()

            do_GET = do_PUT = do_DELETE = do_POST = do_PATCH = do_HEAD = _by_host

        handler = type("TwinNodeVaultHandler", (NodeVaultHandler,), {"twin": self.arm})
        context = server_context(directory / "server.pem", directory / "server.key")
        server = arm.TlsServer((self.address, NODE_VAULT_PORT), handler, context)
        threading.Thread(target=server.serve_forever, name="vault", daemon=True).start()
        self.servers.append(server)
        log(f"Key Vault for the nodes on https://*.vault.azure.net -> {self.address}:{NODE_VAULT_PORT}")

    def token(self, identity: dict, resource: str) -> tuple[str, int]:
        """A managed identity token, signed as the ARM fake signs its own (arm.Twin.identity_token)."""
        return self.arm.identity_token(identity, resource)

    def lookup(self, address: str) -> dict[str, Any] | None:
        with self.lock:
            return self.by_address.get(address)

    def scheduled_events(self, vm: str) -> dict[str, Any]:
        with self.lock:
            entry = self.events.setdefault(vm.lower(), {"incarnation": 1, "events": []})
            return {"DocumentIncarnation": entry["incarnation"], "Events": list(entry["events"])}

    def approve(self, vm: str, ids: list[str]) -> None:
        with self.lock:
            entry = self.events.setdefault(vm.lower(), {"incarnation": 1, "events": []})
            kept = [e for e in entry["events"] if e["EventId"] not in ids]
            if len(kept) != len(entry["events"]):
                entry["events"] = kept
                entry["incarnation"] += 1
        log(f"scheduled events approved by {vm}: {ids}")

    def resolve(self, name: str) -> str | None:
        """Azure's DNS as the twin's nodes see it: vaults of the subscription, and the VMs' names."""
        name = name.rstrip(".").lower()
        match = VAULT_HOST.match(name)
        if match:
            with self.arm.state.lock:
                return self.address if self.arm.state.vault_by_name(match.group(1)) else None
        match = FILE_HOST.match(name) or BLOB_HOST.match(name)
        if match:
            with self.arm.state.lock:
                accounts = self.arm.state.resources.values()
                found = any(a["type"] == "Microsoft.Storage/storageAccounts" and a["name"] == match.group(1)
                            for a in accounts)  # fmt: skip
            return self.address if found else None
        from clusterbake.twins.azure.nodes import DNS_SUFFIX

        host = name.removesuffix("." + DNS_SUFFIX)
        with self.lock:
            for address, vm in self.by_address.items():
                if vm["instance"]["compute"]["osProfile"]["computerName"].lower() == host:
                    return address
        return None

    def start_services(self) -> None:
        from clusterbake.twins.aws.imds import listen
        from clusterbake.twins.azure.dns import DnsServer, listen_udp
        from clusterbake.twins.azure.imds import MetadataServer
        from clusterbake.twins.azure.nodes import DNS_ADDRESS, METADATA_ADDRESS

        sock = in_netns(SERVICE_NETNS, lambda: listen(METADATA_ADDRESS, 80))
        imds = MetadataServer(sock, self.lookup, self.token, self.scheduled_events, self.approve,
                              lambda m: log(f"imds {m}"))  # fmt: skip
        threading.Thread(target=imds.serve_forever, name="imds", daemon=True).start()
        self.servers.append(imds)
        dns = DnsServer(in_netns(SERVICE_NETNS, lambda: listen_udp(DNS_ADDRESS)), self.resolve, log)
        dns.start()
        log(f"IMDS on {METADATA_ADDRESS}:80, DNS on {DNS_ADDRESS}:53")

    # --- the node keeper ----------------------------------------------------------------------

    def snapshot(self) -> tuple[dict, set[str]]:
        """The subscription as `GET /_twin/state` answers it (operations that are due finish first),
        and the VMs (ids, lower case) a start or restart was asked of since the last round."""
        state = self.arm.state
        with state.lock:
            started = set()
            for op in list(state.operations.values()):
                if op.id not in self.operations_seen and op.kind == "power" and op.params.get("state") == "running":
                    started.add(op.target.lower())
                self.operations_seen.add(op.id)
            state.advance()
            return state.snapshot(), started

    def describe(self, vm: dict, resources: dict) -> dict[str, Any] | None:
        """What the keeper and IMDS need of a VM of the twin's image; None for other VMs."""
        props = vm["properties"]
        image = ((props.get("storageProfile") or {}).get("imageReference") or {}).get("id")
        root = self.images.get((image or "").lower())
        if root is None:
            return None
        nic_ref = props["networkProfile"]["networkInterfaces"][0]["id"]
        nic = resources.get(nic_ref.lower())
        if nic is None:
            return None
        config = nic["properties"]["ipConfigurations"][0]["properties"]
        subnet = resources.get(config["subnet"]["id"].lower())
        prefix = subnet["properties"]["addressPrefix"] if subnet else None
        address = config["privateIPAddress"]
        mac = nic["properties"]["macAddress"]
        parts = vm["id"].split("/")
        os_profile = props.get("osProfile") or {}
        linux = os_profile.get("linuxConfiguration") or {}
        tags = vm.get("tags") or {}
        identities = [
            {"id": rid, "clientId": v["clientId"], "principalId": v["principalId"]}
            for rid, v in ((vm.get("identity") or {}).get("userAssignedIdentities") or {}).items()
        ]
        network = ipaddress.ip_network(prefix) if prefix else None
        image_ref = props["storageProfile"]["imageReference"]
        os_disk = props["storageProfile"].get("osDisk") or {}
        scale_set = (props.get("virtualMachineScaleSet") or {}).get("id", "")
        spot = props.get("priority") in ("Spot", "Low")
        compute = {
            "azEnvironment": "AzurePublicCloud",
            "customData": "",  # never served by Azure's IMDS
            "evictionPolicy": props.get("evictionPolicy", "") if spot else "",
            "isHostCompatibilityLayerVm": "false",
            "licenseType": "",
            "location": vm["location"],
            "name": vm["name"],
            "offer": image_ref.get("offer", ""),
            "osProfile": {
                "adminUsername": os_profile.get("adminUsername", ""),
                "computerName": os_profile.get("computerName", vm["name"]),
                "disablePasswordAuthentication": str(bool(linux.get("disablePasswordAuthentication"))).lower(),
            },
            "osType": "Linux",
            "placementGroupId": "",
            "plan": {"name": "", "product": "", "publisher": ""},
            "platformFaultDomain": "0",
            "platformUpdateDomain": "0",
            "priority": props.get("priority", "") if spot else "",
            "provider": "Microsoft.Compute",
            "publicKeys": [
                {"keyData": k.get("keyData", ""), "path": k.get("path", "")}
                for k in (linux.get("ssh") or {}).get("publicKeys") or []
            ],
            "publisher": image_ref.get("publisher", ""),
            "resourceGroupName": parts[4],
            "resourceId": vm["id"],
            "securityProfile": {"secureBootEnabled": "false", "virtualTpmEnabled": "false"},
            "sku": image_ref.get("sku", ""),
            "storageProfile": {
                "dataDisks": [],
                "imageReference": {
                    "id": image_ref.get("id", ""),
                    "offer": image_ref.get("offer", ""),
                    "publisher": image_ref.get("publisher", ""),
                    "sku": image_ref.get("sku", ""),
                    "version": image_ref.get("version", ""),
                },
                "osDisk": {
                    "caching": os_disk.get("caching", ""),
                    "createOption": os_disk.get("createOption", "FromImage"),
                    "diskSizeGB": str(os_disk.get("diskSizeGB", "")),
                    "managedDisk": {
                        "id": (os_disk.get("managedDisk") or {}).get("id", ""),
                        "storageAccountType": (os_disk.get("managedDisk") or {}).get("storageAccountType", ""),
                    },
                    "name": os_disk.get("name", ""),
                    "osType": "Linux",
                },
            },
            "subscriptionId": parts[2],
            "tags": ";".join(f"{k}:{v}" for k, v in sorted(tags.items())),
            "tagsList": [{"name": k, "value": v} for k, v in sorted(tags.items())],
            "userData": vm.get("_user_data") or "",
            "version": image_ref.get("version", ""),
            "vmId": props["vmId"],
            "vmScaleSetName": scale_set.rsplit("/", 1)[-1] if scale_set else "",
            "vmSize": props["hardwareProfile"]["vmSize"],
            "zone": (vm.get("zones") or [""])[0],
        }
        instance = {
            "compute": compute,
            "network": {
                "interface": [
                    {
                        "ipv4": {
                            "ipAddress": [{"privateIpAddress": address, "publicIpAddress": ""}],
                            "subnet": [{"address": str(network.network_address), "prefix": str(network.prefixlen)}]
                            if network
                            else [],
                        },
                        "ipv6": {"ipAddress": []},
                        "macAddress": mac.replace("-", "").upper(),
                    }
                ]
            },
        }
        return {
            "key": props["vmId"],
            "vm": vm["name"],
            "id": vm["id"],
            "power": vm.get("_power"),
            "provisioning": props.get("provisioningState"),
            "address": address,
            "subnet_cidr": prefix,
            "mac": mac.replace("-", ":").lower(),
            "image_root": root,
            "instance": instance,
            "identities": identities,
            "infiniband": infiniband.ports(
                props["hardwareProfile"]["vmSize"], self.link_states.get(vm["name"].lower(), "Active")
            ),
        }

    def reconcile(self) -> None:
        from clusterbake.twins.nodes import RUN, STOP, NodeSpec, Wanted

        snap, restarted = self.snapshot()
        resources = snap["resources"]
        self.sync_storage()
        vnet = ipaddress.ip_network(self.vnet_cidr)
        seen: dict[str, dict] = {}
        wanted = []

        def outside(info: dict) -> str | None:
            inside = info["subnet_cidr"] is not None and ipaddress.ip_network(info["subnet_cidr"]).subnet_of(vnet)
            return None if inside else f"is not in the twin's virtual network {self.vnet_cidr}"

        def stopped_inside(vm: dict) -> None:
            # Azure leaves a VM whose OS powered off stopped (still allocated).
            with self.arm.state.lock:
                live = self.arm.state.resources.get(vm["id"].lower())
                if live is not None and live.get("_power") in RUNNING:
                    live["_power"] = "stopped"

        for vm in resources.values():
            if vm["type"] != "Microsoft.Compute/virtualMachines":
                continue
            info = self.describe(vm, resources)
            if info is None:
                continue
            seen[info["key"]] = info
            run = info["power"] in RUNNING and info["provisioning"] not in ("Failed", "Deleting")
            wanted.append(
                Wanted(
                    key=info["key"],
                    what=f"VM {info['vm']}",
                    state=RUN if run else STOP,
                    spec=lambda info=info: NodeSpec(
                        key=info["key"],
                        address=info["address"],
                        subnet_cidr=info["subnet_cidr"],
                        image_root=info["image_root"],
                        hostname=info["instance"]["compute"]["osProfile"]["computerName"],
                        mac=info["mac"],
                        uuid=info["key"],
                        hardware={"infiniband": info["infiniband"]},
                    ),
                    outside=lambda info=info: outside(info),
                    restart=info["id"].lower() in restarted,
                    stopped_inside=lambda vm=vm: stopped_inside(vm),
                )
            )
        up = self.keeper.keep(wanted, time.monotonic)
        addresses = {seen[key]["address"]: seen[key] for key in up}
        running = self.nodes.running()
        for key in set(up) & set(running):  # a link a test took down (or up) on a running node
            if infiniband.write(self.nodes.paths(key).root, seen[key]["infiniband"]):
                log(f"InfiniBand ports of VM {seen[key]['vm']}: {seen[key]['infiniband'][:1]}")
        with self.lock:
            self.by_address = addresses
            self.vms = {
                key: {
                    "name": info["vm"],
                    "id": info["id"],
                    "vm_id": key,
                    "power": info["power"],
                    "provisioning": info["provisioning"],
                    "address": info["address"],
                    "node": "running" if key in running else ("stopped" if key in self.nodes.known() else "absent"),
                }
                for key, info in seen.items()
            }
            live_names = {info["vm"].lower() for info in seen.values()}
            self.events = {name: entry for name, entry in self.events.items() if name in live_names}
            self.link_states = {name: state for name, state in self.link_states.items() if name in live_names}

    def sync_storage(self) -> None:
        """What the twin's nodes may mount, a directory each (the stand-ins bind them, docs/twin.md):
        - an NFS file share when its account allows no HTTPS-only traffic (NFS has no TLS) and lets the
          twin's subnet in (default action Allow, or a virtual network rule for it), as Azure requires
          before a mount succeeds (named by the account's file host);
        - a Managed Lustre file system of a subnet of the twin's network, once provisioned (named by its
          MGS address, as `mount -t lustre <mgs>@tcp:/lustrefs` names it), with the nodes whose NSGs keep
          its servers out (lustre.amlfs_clients), which cannot mount it;
        - a blob container (blobfuse2's stand-in asks the blob service, which applies the account's
          network rules and the identity's role, before it binds the directory)."""
        directories: set[str] = set()
        endpoints: dict[str, dict[str, str]] = {}
        vnet = ipaddress.ip_network(self.vnet_cidr)
        with self.arm.state.lock:
            state = self.arm.state
            shares = state.nfs_shares()
            for fs in state.amlfs_filesystems():
                subnet = state.resources.get(fs["properties"]["filesystemSubnet"].lower())
                if subnet is None or not ipaddress.ip_network(subnet["properties"]["addressPrefix"]).subnet_of(vnet):
                    continue
                directories.add(f"{AMLFS}/{fs['name'].lower()}")
                endpoints[fs["properties"]["clientInfo"]["mgsAddress"]] = {
                    "dir": f"{AMLFS}/{fs['name'].lower()}",
                    "fs_name": "lustrefs",  # every AMLFS file system's name
                    # The nodes its servers cannot reach (their NSGs): their mount fails (mount_helper.py).
                    "refused": {a: why for a, why in state.amlfs_clients(fs).items() if why},
                }
            directories |= {f"{BLOBS}/{account['name']}/{c['name']}" for account, c in state.blob_containers()}
        for account, share in shares:
            props = account["properties"]
            acls = props.get("networkAcls") or {}
            rules = {(r.get("id") or "").lower() for r in acls.get("virtualNetworkRules") or []}
            if props.get("supportsHttpsTrafficOnly", True):
                continue
            if acls.get("defaultAction", "Allow") != "Allow" and self.subnet_id.lower() not in rules:
                continue
            directory = f"files/{account['name']}/{share['name']}"
            directories.add(directory)
            host = f"{account['name']}.file.core.windows.net"
            endpoints[host] = {"dir": f"files/{account['name']}", "prefix": account["name"]}
        self.nodes.sync_storage(directories, endpoints)

    def keep_nodes(self) -> None:
        keep_reconciling(self.reconcile, self.stopping, POLL)

    def close(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.server_close()

    # --- control ------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        with self.lock:
            vms = [
                {**v, "scheduled_events": list(self.events.get(v["name"].lower(), {}).get("events", []))}
                for v in self.vms.values()
            ]
        return {"vms": sorted(vms, key=lambda v: v["name"])}

    def set_link_state(self, vm: str, state: Any) -> tuple[int, Any]:
        """Every InfiniBand link of the VM Down (Polling) or Active again; the node's ibstat shows it
        within a reconcile round."""
        if state not in infiniband.LINK_STATES:
            return HTTPStatus.BAD_REQUEST, {"error": f"state {state!r}: one of {', '.join(infiniband.LINK_STATES)}"}
        with self.lock:
            if vm.lower() not in {v["name"].lower() for v in self.vms.values()}:
                return HTTPStatus.NOT_FOUND, {"error": f"no VM {vm} of the twin's image"}
            if state == "Active":
                self.link_states.pop(vm.lower(), None)
            else:
                self.link_states[vm.lower()] = state
        log(f"InfiniBand links of {vm}: {state}")
        return HTTPStatus.OK, {"vm": vm, "state": state}

    def set_events(self, vm: str, body: dict | None) -> dict[str, Any]:
        with self.lock:
            names = {v["name"].lower(): v["name"] for v in self.vms.values()}
            if vm.lower() not in names:
                raise KeyError(vm)
            entry = self.events.setdefault(vm.lower(), {"incarnation": 1, "events": []})
            if body is None:
                entry["events"] = []
            else:
                kind = body.get("EventType", "Preempt")
                if kind not in EVENT_DEFAULTS:
                    raise ValueError(f"EventType must be one of {', '.join(EVENT_DEFAULTS)}")
                notice, duration = EVENT_DEFAULTS[kind]
                not_before = datetime.now(UTC) + timedelta(seconds=float(body.get("NotBeforeSeconds", notice)))
                if body.get("Evict"):
                    if kind != "Preempt":
                        raise ValueError("Evict: only a Preempt event is carried out")
                    seconds = max(0.0, (not_before - datetime.now(UTC)).total_seconds())
                    timer = threading.Timer(seconds, self.evict, args=(names[vm.lower()],))
                    timer.daemon = True
                    timer.start()
                entry["events"].append(
                    {
                        "EventId": body.get("EventId") or str(uuid.uuid4()).upper(),
                        "EventStatus": body.get("EventStatus", "Scheduled"),
                        "EventType": kind,
                        "ResourceType": "VirtualMachine",
                        "Resources": [names[vm.lower()]],
                        "NotBefore": format_datetime(not_before, usegmt=True),
                        "Description": body.get("Description", ""),
                        "EventSource": body.get("EventSource", "Platform"),
                        "DurationInSeconds": int(body.get("DurationInSeconds", duration)),
                    }
                )
            entry["incarnation"] += 1
            answer = {"DocumentIncarnation": entry["incarnation"], "Events": list(entry["events"])}
        log(f"scheduled events of {vm}: {answer}")
        return answer

    def evict(self, name: str) -> None:
        """Carry out a Preempt at its NotBefore as Azure evicts a Spot VM: deleted (eviction policy Delete) or
        deallocated (Deallocate), through the ARM fake's simulateEviction."""
        from clusterbake.twins.azure.resource import ArmError, ResourceId

        state = self.arm.state
        with state.lock:
            vm = next(
                (
                    r
                    for r in state.resources.values()
                    if r["type"] == "Microsoft.Compute/virtualMachines" and r["name"] == name
                ),
                None,
            )
            try:
                if vm is not None:
                    state.vm_action(ResourceId.parse(vm["id"]), "simulateEviction")
            except ArmError as error:
                log(f"evict {name}: {error.code}: {error.message}")
                return
        with self.lock:
            self.events.pop(name.lower(), None)
        self.arm.save()
        log(f"evicted {name} at its Preempt's NotBefore")

    def control(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if method == "GET" and path == "/status":
            return HTTPStatus.OK, self.status()
        parts = path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "vms" and parts[2] == "scheduledevents" and method in ("PUT", "DELETE"):
            try:
                return HTTPStatus.OK, self.set_events(parts[1], body if method == "PUT" else None)
            except KeyError:
                return HTTPStatus.NOT_FOUND, {"error": f"no VM {parts[1]} of the twin's image"}
            except (ValueError, TypeError, AttributeError) as exc:
                return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        if len(parts) == 3 and parts[0] == "vms" and parts[2] == "infiniband" and method == "PUT":
            return self.set_link_state(parts[1], (body or {}).get("state"))
        return HTTPStatus.NOT_FOUND, {"error": f"{method} {path}"}


def main(argv: list[str] | None = None) -> int:
    parser = daemon_parser("Azure", 8443, "ARM and Key Vault listen", "NAME=IMAGE_DIR, created as a managed image")
    parser.add_argument("--proxy-port", type=int, default=8444)
    parser.add_argument("--location", default="eastus")
    parser.add_argument("--vnet-cidr", required=True)
    args = parser.parse_args(argv)
    twin = AzureTwin(args)
    root = Path(args.state)

    def start() -> dict[str, Any]:
        twin.start_arm()
        twin.setup_subscription()
        twin.start_node_vault()
        twin.start_services()
        serve_control(root / "control.sock", twin.control)
        return {
            "endpoint": twin.arm.base_url,
            "proxy": twin.endpoints["proxy"],
            "ca_file": str(twin.ca_file),
            "subscription_id": twin.arm.state.subscription,
            "tenant_id": twin.arm.state.tenant,
            "controller_object_id": twin.arm.controller_oid,
            "location": args.location,
            "resource_group": RESOURCE_GROUP,
            "vnet_id": twin.vnet_id,
            "subnet_id": twin.subnet_id,
            "vnet_cidr": args.vnet_cidr,
            "subnet_cidr": args.subnet_cidr,
            "images": twin.image_ids,
            "image_dirs": {image_id: str(path.parent) for image_id, path in twin.images.items()},
            "env": twin.endpoints["env"],
        }

    return run_daemon(root, twin, start)


if __name__ == "__main__":
    sys.exit(main())
