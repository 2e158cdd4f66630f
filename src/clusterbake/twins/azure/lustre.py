"""Azure Managed Lustre in the twin's subscription (Microsoft.StorageCache), mixed into ArmState.

What Azure checks, from Microsoft's AMLFS documentation ("Create an Azure Managed Lustre file
system using Azure Resource Manager templates", "Azure Managed Lustre file system prerequisites")
and the REST API's shapes (azure-mgmt-storagecache):

- `amlFilesystems` PUT (long-running): `sku.name` one of the AMLFS-Durable-Premium SKUs,
  `properties.storageCapacityTiB` the SKU's minimum or a multiple of it (SKU_STEPS),
  `filesystemSubnet` an existing subnet of the file system's location, exactly one zone
  of the location, `maintenanceWindow` with a weekday and HH:MM; size, SKU, subnet and
  zone cannot change afterwards. When done: `clientInfo` with the MGS address, an address
  of the subnet the file system holds (the lowest free one, as Azure's own allocation
  gives; NICs cannot take it), and Microsoft's mount command.
- `checkAmlFSSubnets` (POST, subscription level): the subnet exists, is in the location,
  and is at least as large as the documented minimum for the size ("Network size
  requirements": /27 up to 16 TiB, /26 to 40, /25 to 92, /24 to 196, /23 to 400), with
  room left for the file system's addresses. The answer's shape is Azure's:
  400 `{"filesystemSubnet": {"status": "Invalid", "message": ...}}`.

Who the file system's servers reach (amlfs_clients): Azure Managed Lustre's servers open connections to
their clients on TCP 988 and 1019-1023 ("Configure a network security group for Azure Managed Lustre",
outbound rule 108; the prerequisites: "Your network security group must allow inbound and outbound access
on port 988 and ports 1019-1023"). Each NIC of the file system's virtual network is asked about with the
NSGs on the path (nsg.py, network.flow_verdict), from the file system's address; the twin's nodes cannot
mount a file system whose servers cannot reach them (daemon.sync_storage, mount_helper.py). Strict switch
`amlfs_nsg` (`PUT /_twin/strict`), on by default.

A file system in a subnet that holds NICs is a warning, not a refusal (amlfs_warnings, in `GET
/_twin/state`): Azure creates it (the prerequisites let an AKS cluster share the file system's subnet),
but Microsoft's NSG guide speaks of "the unique subnet ... where the Azure Managed Lustre file system
exists", and an older revision of the prerequisites said "Each file system you create must have its own
unique subnet".

Not emulated: Lustre itself (the twin's mount helper binds a directory: docs/twin.md),
HSM (blob integration), customer-managed keys, root squash (kept as sent), archive jobs.
A real file system takes 10 minutes or more to create; here `operation_seconds`.
"""

from __future__ import annotations

import ipaddress
import re

from clusterbake.twins.azure import nsg, skus
from clusterbake.twins.azure.resource import ArmError

SKU_STEPS = {
    "AMLFS-Durable-Premium-40": 48,
    "AMLFS-Durable-Premium-125": 16,
    "AMLFS-Durable-Premium-250": 8,
    "AMLFS-Durable-Premium-500": 4,
}
# (largest size in TiB, smallest subnet prefix length) of the prerequisites' table.
SUBNET_SIZES = ((16, 27), (40, 26), (92, 25), (196, 24), (400, 23))
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
TYPE = "Microsoft.StorageCache/amlFilesystems"
LUSTRE_VERSION = "2.16"
# The ports the servers connect to on a client; LNet connects from a privileged port, 1023 first.
LNET_PORTS = (988, 1019, 1020, 1021, 1022, 1023)
LNET_SOURCE_PORT = 1023


def needed_prefix(capacity_tib: int) -> int:
    """The longest subnet prefix (the smallest subnet) Microsoft's table gives for a size."""
    for largest, prefix in SUBNET_SIZES:
        if capacity_tib <= largest:
            return prefix
    return 22


class AmlfsMixin:
    """AMLFS on ArmState: `self.resources`, `self._require`, `self._base`, ArmError come from there."""

    def amlfs_addresses(self, subnet_id: str) -> set[str]:
        """MGS addresses the file systems in a subnet hold."""
        return {
            fs["properties"]["clientInfo"]["mgsAddress"]
            for fs in self._of_type(TYPE)
            if fs["properties"]["filesystemSubnet"].lower() == subnet_id.lower()
        }

    def _amlfs_subnet(self, subnet_id: str | None, location: str, target: str) -> dict:
        subnet = self._require(subnet_id, "Microsoft.Network/virtualNetworks/subnets", target)
        vnet = self.resources[subnet["id"].lower().rsplit("/subnets/", 1)[0]]
        if vnet["location"] != location:
            raise ArmError(
                400,
                "InvalidParameter",
                f"The subnet {subnet['id']} is in {vnet['location']}; the file system is in {location}.",
                target,
            )
        return subnet

    def _amlfs_sku_and_size(self, sku: str | None, capacity) -> int:
        if sku not in SKU_STEPS:
            raise ArmError(
                400,
                "InvalidParameter",
                f"The SKU '{sku}' is not available. Available SKUs: {', '.join(SKU_STEPS)}.",
                "sku.name",
            )
        step = SKU_STEPS[sku]
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < step or capacity % step:
            raise ArmError(
                400,
                "InvalidParameter",
                f"The storage capacity {capacity} TiB is not valid for SKU {sku}: it must be at least {step} TiB and "
                f"a multiple of {step} TiB.",
                "properties.storageCapacityTiB",
            )
        return capacity

    def _put_storagecache_amlfilesystems(self, rid, body, existing):
        if not re.fullmatch(r"[0-9a-zA-Z][-0-9a-zA-Z_]{0,78}[0-9a-zA-Z]", rid.name):
            raise ArmError(400, "InvalidResourceName", f"The file system name '{rid.name}' is invalid.")
        resource = self._base(rid, body, existing)
        location = resource["location"]
        props = body.get("properties") or {}
        sku = (body.get("sku") or {}).get("name")
        capacity = self._amlfs_sku_and_size(sku, props.get("storageCapacityTiB"))
        subnet = self._amlfs_subnet(props.get("filesystemSubnet"), location, "properties.filesystemSubnet")
        zones = list(body.get("zones") or props.get("zones") or [])
        offered = sorted({z for zones_ in skus.LOCATIONS.get(location, {}).values() for z in zones_})
        if len(zones) != 1 or zones[0] not in offered:
            raise ArmError(
                400,
                "InvalidParameter",
                f"An Azure Managed Lustre file system needs exactly one availability zone of {location} "
                f"({', '.join(offered)}), not {zones}.",
                "zones",
            )
        window = props.get("maintenanceWindow") or {}
        if window.get("dayOfWeek") not in WEEKDAYS or not re.fullmatch(
            r"([01]\d|2[0-3]):[0-5]\d", str(window.get("timeOfDayUTC", ""))
        ):
            raise ArmError(
                400,
                "InvalidParameter",
                "maintenanceWindow needs dayOfWeek (Monday to Sunday) and timeOfDayUTC (HH:MM).",
                "properties.maintenanceWindow",
            )
        if existing:
            before = existing["properties"]
            fixed = (
                (existing["sku"]["name"], sku, "sku"),
                (before["storageCapacityTiB"], capacity, "storageCapacityTiB"),
                (before["filesystemSubnet"].lower(), subnet["id"].lower(), "filesystemSubnet"),
                (existing["zones"], zones, "zones"),
            )
            for old, new, what in fixed:
                if old != new:
                    raise ArmError(
                        400, "InvalidParameter", f"{what} of a file system cannot be changed after it is created."
                    )
            mgs = before["clientInfo"]["mgsAddress"]
        else:
            mgs = self._amlfs_free_address(subnet)
        resource["sku"] = {"name": sku}
        resource["zones"] = zones
        resource["properties"] = {
            "storageCapacityTiB": capacity,
            "filesystemSubnet": subnet["id"],
            "maintenanceWindow": {"dayOfWeek": window["dayOfWeek"], "timeOfDayUTC": window["timeOfDayUTC"]},
            "throughputProvisionedMBps": capacity * int(sku.rsplit("-", 1)[1]),
            "clientInfo": {
                "mgsAddress": mgs,
                "mountCommand": f"mount -t lustre -o noatime,flock {mgs}@tcp:/lustrefs /lustrefs",
                "lustreVersion": LUSTRE_VERSION,
            },
            "health": {"state": "Available", "statusCode": "0", "statusDescription": "Available"},
            "rootSquashSettings": props.get("rootSquashSettings") or {"mode": "None"},
            "provisioningState": "Succeeded",
        }
        return resource

    def _amlfs_free_address(self, subnet: dict) -> str:
        network = ipaddress.ip_network(subnet["properties"]["addressPrefix"])
        hosts = list(network.hosts())
        reserved = {str(a) for a in hosts[:3]} | {str(network.broadcast_address)}
        taken = self._addresses_in_use(subnet["id"]) | self.amlfs_addresses(subnet["id"])
        for address in hosts:
            if str(address) not in reserved and str(address) not in taken:
                return str(address)
        raise ArmError(400, "SubnetIsFull", f"Subnet {subnet['name']} has no free address for the file system.")

    def check_amlfs_subnets(self, body: dict) -> None:
        """POST checkAmlFSSubnets: None when the subnet fits, else the ArmError Azure answers."""
        location = self._location(body.get("location"))
        sku = (body.get("sku") or {}).get("name")
        try:
            capacity = self._amlfs_sku_and_size(sku, body.get("storageCapacityTiB"))
            subnet = self._amlfs_subnet(body.get("filesystemSubnet"), location, "filesystemSubnet")
        except Exception as exc:
            raise self._subnet_invalid(getattr(exc, "message", str(exc))) from None
        network = ipaddress.ip_network(subnet["properties"]["addressPrefix"])
        prefix = needed_prefix(capacity)
        if network.prefixlen > prefix:
            raise self._subnet_invalid(
                f"The subnet {subnet['name']} ({network}) is too small for a {capacity} TiB file system: it needs "
                f"a /{prefix} or larger."
            )

    def _subnet_invalid(self, message: str):
        error = ArmError(400, "InvalidParameter", message)
        error.custom_body = {"filesystemSubnet": {"status": "Invalid", "message": message}}
        return error

    def amlfs_filesystems(self) -> list[dict]:
        """Every file system that finished provisioning: what the twin's nodes may mount."""
        return [fs for fs in self._of_type(TYPE) if fs["properties"].get("provisioningState") == "Succeeded"]

    def amlfs_clients(self, fs: dict) -> dict[str, str | None]:
        """Each private address of a NIC in the file system's virtual network -> None when the file system's
        servers can open connections to it on every Lustre port, else why not (the first port denied)."""
        vnet_id = fs["properties"]["filesystemSubnet"].lower().rsplit("/subnets/", 1)[0]
        server = fs["properties"]["clientInfo"]["mgsAddress"]
        clients: dict[str, str | None] = {}
        if vnet_id not in self.resources:  # its network's group was deleted under it: no client left
            return clients
        for _, config in self._network_configs(vnet_id):
            address = config["properties"]["privateIPAddress"]
            clients[address] = None
            for port in LNET_PORTS if self.strict["amlfs_nsg"] else ():
                flow = nsg.Flow(server, address, "Tcp", port, LNET_SOURCE_PORT)
                verdict = self.flow_verdict(vnet_id, flow)
                if not verdict.allowed:
                    clients[address] = (
                        f"the servers of Azure Managed Lustre {fs['name']} cannot open connections to this client: "
                        f"{verdict.reason(flow)} (they connect to their clients on TCP 988 and 1019-1023)"
                    )
                    break
        return clients

    def amlfs_warnings(self) -> list[dict]:
        """File systems whose subnet holds NICs (see the module's docstring: Azure allows it)."""
        warnings = []
        for fs in self._of_type(TYPE):
            subnet = self.resources.get(fs["properties"]["filesystemSubnet"].lower())
            configs = self.view(subnet)["properties"]["ipConfigurations"] if subnet else []
            nics = sorted({c["id"].rsplit("/ipConfigurations/", 1)[0] for c in configs})
            if nics:
                message = (
                    f"Azure Managed Lustre {fs['name']} is in subnet {fs['properties']['filesystemSubnet']}, which "
                    f"holds {len(nics)} network interface(s) of other resources; Microsoft's NSG guidance assumes "
                    "the file system's own subnet"
                )
                # The twin's own code: Azure creates such a file system without a word.
                warnings.append({"code": "AmlfsSubnetShared", "target": fs["id"], "message": message, "nics": nics})
        return warnings
