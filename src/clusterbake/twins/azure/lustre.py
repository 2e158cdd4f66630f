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

Not emulated: Lustre itself (the twin's mount helper binds a directory: docs/twin.md),
HSM (blob integration), customer-managed keys, root squash (kept as sent), archive jobs.
A real file system takes 10 minutes or more to create; here `operation_seconds`.
"""

from __future__ import annotations

import ipaddress
import re

from clusterbake.twins.azure import skus
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
