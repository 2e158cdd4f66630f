"""Proximity placement groups, scale sets, virtual machines (size, zone, quota, NICs, image, spot,
identities, OS disk), power actions, the instance view, list query options and usages; user-assigned
identities.

A mixin of ArmState (state.py): the store, `self._base`, `self.start` and the lock come from there."""

from __future__ import annotations

import base64
import copy
import re

from clusterbake.twins.azure import skus, vm_rules
from clusterbake.twins.azure.resource import (
    DEFAULT_FAMILY_LIMIT,
    DEFAULT_LIMITS,
    PLACEMENTS,
    RESERVED_ADMIN_NAMES,
    ArmError,
    Operation,
    ResourceId,
    _now,
    _ref,
    not_found,
)


class ComputeMixin:
    # --- compute ------------------------------------------------------------------------

    def _put_compute_images(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        resource["properties"] = {**(body.get("properties") or {}), "provisioningState": "Succeeded"}
        return resource

    def _put_compute_proximityplacementgroups(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        props = body.get("properties") or {}
        kind = props.get("proximityPlacementGroupType", "Standard")
        if kind not in ("Standard", "Ultra"):
            raise ArmError(
                400, "InvalidParameter", f"proximityPlacementGroupType {kind}.", "proximityPlacementGroupType"
            )
        resource["properties"] = {"proximityPlacementGroupType": kind, "provisioningState": "Succeeded"}
        if props.get("intent"):
            resource["properties"]["intent"] = props["intent"]
        if body.get("zones"):
            resource["zones"] = list(body["zones"])
        return resource

    def _put_compute_virtualmachinescalesets(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        props = body.get("properties") or {}
        if props.get("orchestrationMode") != "Flexible":
            raise ArmError(
                400,
                "InvalidParameter",
                "This twin emulates scale sets with orchestrationMode Flexible only (VMs created on their own "
                "and added to the set by their virtualMachineScaleSet reference).",
                "properties.orchestrationMode",
            )
        if props.get("virtualMachineProfile"):
            raise ArmError(
                400,
                "InvalidParameter",
                "virtualMachineProfile is not emulated by this twin; create VMs that reference the scale set.",
                "properties.virtualMachineProfile",
            )
        faults = props.get("platformFaultDomainCount")
        if faults not in (1, 2, 3, 5):
            raise ArmError(
                400,
                "InvalidParameter",
                "Required parameter 'platformFaultDomainCount' is missing or invalid (1, 2, 3 or 5).",
                "properties.platformFaultDomainCount",
            )
        resource["properties"] = {
            "orchestrationMode": "Flexible",
            "platformFaultDomainCount": faults,
            "singlePlacementGroup": bool(props.get("singlePlacementGroup", False)),
            "uniqueId": existing["properties"]["uniqueId"] if existing else self.guid("vmss"),
            "provisioningState": "Succeeded",
        }
        ppg_type = "Microsoft.Compute/proximityPlacementGroups"
        self._link(resource, props, "proximityPlacementGroup", ppg_type, "properties.proximityPlacementGroup")
        if body.get("zones"):
            resource["zones"] = list(body["zones"])
        return resource

    def _put_compute_availabilitysets(self, rid, body, existing):
        """An availability set (Aligned: for managed disks), never zonal, optionally in a placement group."""
        resource = self._base(rid, body, existing)
        props = body.get("properties") or {}
        sku = (body.get("sku") or {}).get("name", "Classic")
        if sku != "Aligned":
            raise ArmError(
                400,
                "InvalidParameter",
                "Addition of a VM with managed disks to non-managed Availability Set is not supported: "
                "create the availability set with sku Aligned.",
                "sku.name",
            )
        if body.get("zones"):
            raise ArmError(400, "InvalidParameter", "An availability set cannot be zonal.", "zones")
        faults, updates = props.get("platformFaultDomainCount", 2), props.get("platformUpdateDomainCount", 5)
        if faults not in (1, 2, 3) or not 1 <= updates <= 20:
            raise ArmError(
                400,
                "InvalidParameter",
                "platformFaultDomainCount must be 1-3 and platformUpdateDomainCount 1-20.",
                "properties.platformFaultDomainCount",
            )
        resource["sku"] = {"name": "Aligned"}
        resource["properties"] = {"platformFaultDomainCount": faults, "platformUpdateDomainCount": updates}
        ppg_type = "Microsoft.Compute/proximityPlacementGroups"
        self._link(resource, props, "proximityPlacementGroup", ppg_type, "properties.proximityPlacementGroup")
        return resource

    def usage(self, location: str) -> dict[str, tuple[int, int, str]]:
        """usage name -> (current, limit, localized name) for a location."""
        location = location.lower()
        limits = self.quota.get(location, {})
        current: dict[str, int] = {"cores": 0, "lowPriorityCores": 0, "virtualMachines": 0}
        for vm in self._of_type("Microsoft.Compute/virtualMachines"):
            if vm["location"] != location or vm["properties"].get("provisioningState") == "Failed":
                continue
            entry = skus.lookup(vm["properties"]["hardwareProfile"]["vmSize"], location)
            if entry is None:
                continue
            vcpus = int(skus.capability(entry, "vCPUs"))
            current["virtualMachines"] += 1
            if vm["properties"].get("priority") in ("Spot", "Low"):
                current["lowPriorityCores"] += vcpus
            else:
                current["cores"] += vcpus
                current[entry["family"]] = current.get(entry["family"], 0) + vcpus
        result = {
            "cores": (current["cores"], limits.get("cores", DEFAULT_LIMITS["cores"]), "Total Regional vCPUs"),
            "lowPriorityCores": (
                current["lowPriorityCores"],
                limits.get("lowPriorityCores", DEFAULT_LIMITS["lowPriorityCores"]),
                "Total Regional Low-priority vCPUs",
            ),
            "virtualMachines": (
                current["virtualMachines"],
                limits.get("virtualMachines", DEFAULT_LIMITS["virtualMachines"]),
                "Virtual Machines",
            ),
        }
        for family, name in skus.FAMILY_NAMES.items():
            result[family] = (current.get(family, 0), limits.get(family, DEFAULT_FAMILY_LIMIT), name)
        return result

    def _check_quota(self, location: str, entry: dict, spot: bool) -> None:
        vcpus = int(skus.capability(entry, "vCPUs"))
        usage = self.usage(location)
        names = ["lowPriorityCores"] if spot else [entry["family"], "cores"]
        for name in names:
            current, limit, localized = usage[name]
            if current + vcpus > limit:
                raise ArmError(
                    409,
                    "OperationNotAllowed",
                    f"Operation could not be completed as it results in exceeding approved {name} Cores quota. "
                    f"Additional details - Deployment Model: Resource Manager, Location: {location}, Current Limit: "
                    f"{limit}, Current Usage: {current}, Additional Required: {vcpus}, (Minimum) New Limit Required: "
                    f"{current + vcpus}. Submit a request for Quota increase ({localized}).",
                )

    def _put_compute_virtualmachines(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        location = resource["location"]
        props = body.get("properties") or {}
        size = (props.get("hardwareProfile") or {}).get("vmSize")
        if existing:
            # An update: tags (and nothing the twin would have to re-provision).
            if size and size.lower() != existing["properties"]["hardwareProfile"]["vmSize"].lower():
                raise ArmError(
                    409,
                    "OperationNotAllowed",
                    "Changing the size of a VM is not emulated by this twin; delete and create it again.",
                )
            updated = copy.deepcopy(existing)
            updated["tags"] = resource["tags"]
            if body.get("identity") and body["identity"] != existing.get("identity"):
                updated["identity"] = self._vm_identity(rid, body["identity"])
            updated["_lro"] = False
            return updated
        if not size:
            raise ArmError(
                400, "InvalidParameter", "Required parameter 'vmSize' is missing (null).", "hardwareProfile.vmSize"
            )
        entry = skus.lookup(size, location)
        zones = list(body.get("zones") or [])
        if len(zones) > 1:
            raise ArmError(400, "InvalidParameter", "A virtual machine is placed in at most one zone.", "zones")
        if entry is None or any(r["type"] == "Location" for r in entry["restrictions"]):
            raise ArmError(
                409,
                "SkuNotAvailable",
                f"The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: {size}' "
                f"is currently not available in location '{location}'. Please try another size or deploy to a "
                "different location or different zone. See https://aka.ms/azureskunotavailable for details.",
            )
        if zones:
            restricted = {
                z for r in entry["restrictions"] if r["type"] == "Zone" for z in r["restrictionInfo"]["zones"]
            }
            if zones[0] not in entry["locationInfo"][0]["zones"] or zones[0] in restricted:
                raise ArmError(
                    409,
                    "SkuNotAvailable",
                    f"The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: "
                    f"{size}' is currently not available in location '{location}' zones '{zones[0]}'. Please try "
                    "another size or deploy to a different location or different zone.",
                )
        size = entry["name"]
        priority = props.get("priority") or "Regular"
        if priority not in ("Regular", "Low", "Spot"):
            raise ArmError(400, "InvalidParameter", f"The value '{priority}' of priority is not valid.", "priority")
        spot = priority != "Regular"
        if spot:
            if skus.capability(entry, "LowPriorityCapable") != "True":
                raise ArmError(
                    409,
                    "SkuNotAvailable",
                    f"The requested VM size {size} is not available for Spot (LowPriorityCapable False) in "
                    f"'{location}'.",
                )
            if props.get("evictionPolicy") not in ("Delete", "Deallocate"):
                raise ArmError(
                    400,
                    "InvalidParameter",
                    "Required parameter 'evictionPolicy' is missing or invalid for a Spot virtual machine "
                    "(Delete or Deallocate).",
                    "evictionPolicy",
                )
        elif props.get("evictionPolicy"):
            raise ArmError(
                400, "InvalidParameter", "evictionPolicy is only for Spot virtual machines.", "evictionPolicy"
            )
        storage = props.get("storageProfile") or {}
        image = storage.get("imageReference") or {}
        if image.get("id"):
            found = self.resources.get(image["id"].lower())
            if found is None:
                raise ArmError(
                    404,
                    "NotFound",
                    f"The platform image or managed image '{image['id']}' was not found.",
                    "imageReference",
                )
        elif not all(image.get(k) for k in ("publisher", "offer", "sku", "version")):
            raise ArmError(
                400,
                "InvalidParameter",
                "The value of parameter imageReference is invalid: give id, or publisher, offer, sku and version.",
                "imageReference",
            )
        os_profile = props.get("osProfile") or {}
        admin = os_profile.get("adminUsername")
        if not admin or admin.lower() in RESERVED_ADMIN_NAMES:
            raise ArmError(
                400, "InvalidParameter", f"The Admin Username specified is not allowed: {admin!r}.", "adminUsername"
            )
        linux = os_profile.get("linuxConfiguration") or {}
        keys = ((linux.get("ssh") or {}).get("publicKeys")) or []
        if linux.get("disablePasswordAuthentication") and not keys:
            raise ArmError(
                400,
                "InvalidParameter",
                "Authentication using either SSH or by user name and password must be enabled in Linux profile.",
                "linuxConfiguration",
            )
        for key in keys:
            if key.get("path") != f"/home/{admin}/.ssh/authorized_keys":
                raise ArmError(
                    400,
                    "InvalidParameter",
                    f"Destination path for SSH public keys is currently limited to its default value "
                    f"/home/{admin}/.ssh/authorized_keys due to a known issue in Linux provisioning agent.",
                    "linuxConfiguration.ssh.publicKeys.path",
                )
        for key in ("customData",):
            if os_profile.get(key):
                try:
                    base64.b64decode(os_profile[key], validate=True)
                except ValueError:
                    raise ArmError(400, "InvalidParameter", f"{key} must be base64.", f"osProfile.{key}") from None
        if props.get("userData"):
            try:
                base64.b64decode(props["userData"], validate=True)
            except ValueError:
                raise ArmError(400, "InvalidParameter", "userData must be base64.", "userData") from None
        nics = (props.get("networkProfile") or {}).get("networkInterfaces") or []
        if not nics:
            raise ArmError(
                400, "InvalidParameter", "Required parameter 'networkProfile' is missing (null).", "networkProfile"
            )
        for index, ref in enumerate(nics):
            nic = self._require(
                _ref(ref), "Microsoft.Network/networkInterfaces", f"networkProfile.networkInterfaces[{index}]"
            )
            if nic["properties"].get("virtualMachine"):
                raise ArmError(
                    400,
                    "NicInUse",
                    f"Network Interface {nic['id']} is used by existing resource "
                    f"{nic['properties']['virtualMachine']['id']}.",
                )
            if nic["location"] != location:
                raise ArmError(400, "InvalidParameter", f"{nic['id']} is not in {location}.", "networkProfile")
        if body.get("identity"):
            resource["identity"] = self._vm_identity(rid, body["identity"])
        for key, rtype in PLACEMENTS:
            if props.get(key):
                found = self._require(_ref(props[key]), rtype, key)
                if found.get("zones") and zones and found["zones"] != zones:
                    raise ArmError(400, "InvalidParameter", f"The VM's zone {zones} is not the {key}'s.", "zones")
        fabric = vm_rules.check_placement(self.resources, props, zones, entry)
        if fabric is None and skus.capability(entry, "RdmaEnabled") == "True":
            fabric = rid.key  # on its own: an InfiniBand partition no other VM shares
        image_kind, generation, required_security = vm_rules.image_facts(self.resources, image)
        os_disk_type = ((storage.get("osDisk") or {}).get("managedDisk") or {}).get("storageAccountType")
        vm_rules.check_capabilities(
            entry, [self.resources[_ref(ref).lower()] for ref in nics], os_disk_type or "", generation
        )
        security = vm_rules.security_profile(
            props.get("securityProfile"), self.api_version, image_kind, generation, required_security
        )
        self._check_quota(location, entry, spot)

        disk_name = f"{rid.name}_OsDisk_1_{self.guid('disk').replace('-', '')}"
        disk_id = f"{rid.parent_group_id()}/providers/Microsoft.Compute/disks/{disk_name}"
        os_disk = storage.get("osDisk") or {}
        self.resources[disk_id.lower()] = {
            "id": disk_id,
            "name": disk_name,
            "type": "Microsoft.Compute/disks",
            "location": location,
            "tags": {},
            "managedBy": str(rid),
            **({"zones": zones} if zones else {}),
            "properties": {
                "diskSizeGB": int(os_disk.get("diskSizeGB") or 30),
                "diskState": "Attached",
                "osType": "Linux",
                "provisioningState": "Succeeded",
            },
        }
        resource["properties"] = {
            "vmId": self.guid("vm"),
            "hardwareProfile": {"vmSize": size},
            "storageProfile": {
                "imageReference": image,
                "osDisk": {
                    "osType": "Linux",
                    "name": disk_name,
                    "createOption": "FromImage",
                    "caching": os_disk.get("caching", "ReadWrite"),
                    "deleteOption": os_disk.get("deleteOption", "Detach"),
                    "diskSizeGB": int(os_disk.get("diskSizeGB") or 30),
                    "managedDisk": {
                        "id": disk_id,
                        "storageAccountType": (os_disk.get("managedDisk") or {}).get(
                            "storageAccountType", "Premium_LRS"
                        ),
                    },
                },
                "dataDisks": [],
            },
            "osProfile": {
                "computerName": os_profile.get("computerName") or rid.name,
                "adminUsername": admin,
                "linuxConfiguration": linux,
                "secrets": [],
                "allowExtensionOperations": True,
            },
            "networkProfile": {
                "networkInterfaces": [
                    {"id": self.resources[_ref(ref).lower()]["id"], "properties": dict(ref.get("properties") or {})}
                    for ref in nics
                ]
            },
            "priority": priority,
            "provisioningState": "Creating",
            "timeCreated": _now(),
        }
        resource["_custom_data"] = os_profile.get("customData")
        if props.get("userData"):
            resource["_user_data"] = props["userData"]
        if spot:
            resource["properties"]["evictionPolicy"] = props["evictionPolicy"]
            resource["properties"]["billingProfile"] = {
                "maxPrice": (props.get("billingProfile") or {}).get("maxPrice", -1)
            }
        for key, _ in PLACEMENTS:
            if props.get(key):
                resource["properties"][key] = {"id": self.resources[_ref(props[key]).lower()]["id"]}
        if props.get("diagnosticsProfile"):
            resource["properties"]["diagnosticsProfile"] = props["diagnosticsProfile"]
        if security:
            resource["properties"]["securityProfile"] = security
        resource["_ib_fabric"] = fabric
        resource["_api_version"] = self.api_version
        if zones:
            resource["zones"] = zones
        for ref in nics:
            self.resources[_ref(ref).lower()]["properties"]["virtualMachine"] = {"id": str(rid)}
        resource["_power"] = "starting"
        # Capacity: the switch decides whether the allocation succeeds.
        switch = self.capacity.get(size.lower())
        if switch is not None:
            allocated = sum(
                1
                for vm in self._of_type("Microsoft.Compute/virtualMachines")
                if vm["properties"]["hardwareProfile"]["vmSize"].lower() == size.lower()
                and vm["location"] == location
                and vm["properties"].get("provisioningState") != "Failed"
            )
            if allocated >= int(switch.get("limit", 0)):
                code = switch.get("code", "AllocationFailed")
                if code == "SkuNotAvailable":
                    for ref in nics:
                        self.resources[_ref(ref).lower()]["properties"].pop("virtualMachine", None)
                    self.resources.pop(disk_id.lower(), None)
                    raise ArmError(
                        409,
                        "SkuNotAvailable",
                        f"The requested VM size for resource 'Following SKUs have failed for Capacity Restrictions: "
                        f"{size}' is currently not available in location '{location}'"
                        + (f" zones '{zones[0]}'" if zones else "")
                        + ". Please try another size or deploy to a different location or different zone.",
                    )
                messages = {
                    "AllocationFailed": "Allocation failed. We do not have sufficient capacity for the requested VM "
                    "size in this region. Read more about improving likelihood of allocation success at "
                    "http://aka.ms/allocation-guidance",
                    "ZonalAllocationFailed": "Allocation failed. We do not have sufficient capacity for the requested "
                    f"VM size in this zone ({zones[0] if zones else '-'}). Read more about improving likelihood of "
                    "allocation success at http://aka.ms/allocation-guidance",
                    "OverconstrainedAllocationRequest": "Allocation failed. VM(s) with the following constraints "
                    f"cannot be allocated, because the condition is too restrictive: VM Size: {size}, proximity "
                    "placement group or scale set, zone.",
                }
                error = {"code": code, "message": messages.get(code, f"{code}: {size} in {location}")}
                resource["_op"] = self.start("fail", str(rid), location, "Microsoft.Compute", error=error)
        return resource

    def _vm_identity(self, rid, identity: dict) -> dict:
        """A VM's `identity` as Azure keeps it: each user-assigned identity with its principal and client ids."""
        kinds = {k.strip() for k in str(identity.get("type", "")).split(",")}
        if not kinds <= {"SystemAssigned", "UserAssigned", "None"}:
            raise ArmError(400, "InvalidParameter", f"identity type {identity.get('type')}.", "identity.type")
        assigned = identity.get("userAssignedIdentities") or {}
        if ("UserAssigned" in kinds) != bool(assigned):
            raise ArmError(
                400,
                "InvalidParameter",
                "userAssignedIdentities are required with identity type UserAssigned (and only then).",
                "identity",
            )
        out = {}
        for uid in assigned:
            found = self.resources.get(uid.lower())
            if found is None or found["type"] != "Microsoft.ManagedIdentity/userAssignedIdentities":
                raise ArmError(
                    400,
                    "FailedIdentityOperation",
                    f"Identity operation for resource '{rid}' failed with error 'Resource '{uid}' was not found.'",
                )
            out[found["id"]] = {
                "principalId": found["properties"]["principalId"],
                "clientId": found["properties"]["clientId"],
            }
        return {"type": identity["type"], "userAssignedIdentities": out}

    def instance_view(self, vm: dict) -> dict:
        state = vm["properties"].get("provisioningState", "Succeeded")
        statuses = [
            {
                "code": f"ProvisioningState/{state.lower()}" + (f"/{vm['_error']['code']}" if vm.get("_error") else ""),
                "level": "Error" if state == "Failed" else "Info",
                "displayStatus": f"Provisioning {state.lower()}",
                **({"message": vm["_error"]["message"]} if vm.get("_error") else {}),
            }
        ]
        power = vm.get("_power")
        if power:
            statuses.append({"code": f"PowerState/{power}", "level": "Info", "displayStatus": f"VM {power}"})
        view = {
            "computerName": vm["properties"]["osProfile"]["computerName"],
            "osName": "ubuntu",
            "statuses": statuses,
        }
        if vm.get("zones"):
            view["zone"] = vm["zones"][0]  # not in the real view; harmless extra
        return view

    def vm_list(self, vms: list[dict], query: dict) -> list[dict]:
        """VirtualMachines List / ListAll's query options on `vms` (what the caller may read, as ARM returns them):
        `$filter` only `virtualMachineScaleSet/id eq '<id>'`; `$expand=instanceView` only with that filter
        (as documented, and answered BadRequest without it); `statusOnly=true` the run time status of each
        VM and little else (the Go SDK's users report tags and network profiles missing: the twin returns
        id, name, type, location and the instance view alone, the strict reading)."""
        text = query.get("$filter")
        if text is not None:
            match = re.fullmatch(r"\s*'?virtualMachineScaleSet/id'?\s+eq\s+'([^']+)'\s*", text, re.IGNORECASE)
            if match is None:
                raise ArmError(400, "InvalidParameter", f"The value '{text}' of parameter '$filter' is not valid.",
                               "$filter")  # fmt: skip
            scale_set = match.group(1).lower()
            vms = [v for v in vms if (_ref(v["properties"].get("virtualMachineScaleSet")) or "").lower() == scale_set]
        expand = query.get("$expand")
        if expand is not None:
            if expand.lower() != "instanceview":
                raise ArmError(400, "InvalidParameter", f"The value '{expand}' of parameter '$expand' is not valid.",
                               "$expand")  # fmt: skip
            if text is None:
                raise ArmError(
                    400, "BadRequest", "Expand Instance View is only supported when Virtual Machine Scale Set "
                    "resource filter is applied"
                )  # fmt: skip
            return [self.view(self.resources[v["id"].lower()], expand_instance_view=True) for v in vms]
        if query.get("statusOnly") == "true":
            return [
                {k: v[k] for k in ("id", "name", "type", "location")}
                | {"properties": {"instanceView": self.instance_view(self.resources[v["id"].lower()])}}
                for v in vms
            ]
        return vms

    def vm_action(self, rid: ResourceId, action: str) -> Operation | None:
        vm = self.resources.get(rid.key)
        if vm is None or vm["type"] != "Microsoft.Compute/virtualMachines":
            raise not_found(str(rid), "Microsoft.Compute/virtualMachines")
        if vm["properties"]["provisioningState"] in ("Creating", "Deleting"):
            raise ArmError(
                409,
                "OperationNotAllowed",
                f"Operation '{action}' is not allowed on VM '{rid.name}' since the VM is "
                f"{vm['properties']['provisioningState'].lower()}.",
            )
        if action == "simulateEviction":
            if vm["properties"].get("priority") not in ("Spot", "Low"):
                raise ArmError(409, "OperationNotAllowed", "Eviction can be simulated only for Spot virtual machines.")
            if vm["properties"].get("evictionPolicy") == "Delete":
                self._remove(rid.key)
            else:
                vm["_power"] = "deallocated"
            return None
        transitions = {
            "deallocate": ("deallocating", "deallocated"),
            "start": ("starting", "running"),
            "poweroff": ("stopping", "stopped"),
            "restart": ("starting", "running"),
        }
        if action.lower() not in transitions:
            raise ArmError(400, "InvalidRequestFormat", f"Unknown action {action}.")
        during, after = transitions[action.lower()]
        if vm["properties"]["provisioningState"] == "Failed" and action.lower() == "start":
            raise ArmError(409, "OperationNotAllowed", f"VM '{rid.name}' failed to provision; delete it.")
        vm["_power"] = during
        return self.start("power", str(rid), vm["location"], "Microsoft.Compute", state=after)

    # --- identities ---------------------------------------------------------------------

    def _put_managedidentity_userassignedidentities(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        resource["properties"] = (
            dict(existing["properties"])
            if existing
            else {"tenantId": self.tenant, "principalId": self.guid("principal"), "clientId": self.guid("client")}
        )
        if not existing:  # its service principal replicates in Entra ID (replication.py)
            self.replication.identity_made(resource["properties"]["principalId"])
        return resource

    def identity_by(self, field: str, value: str) -> dict | None:
        """The user-assigned identity whose `field` (clientId, principalId) is `value`."""
        for identity in self._of_type("Microsoft.ManagedIdentity/userAssignedIdentities"):
            if identity["properties"][field] == value:
                return identity
        return None

    def identity_by_client_id(self, client_id: str) -> dict | None:
        return self.identity_by("clientId", client_id)
