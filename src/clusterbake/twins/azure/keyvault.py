"""Key Vault vaults (globally unique names, soft delete) and their secrets.

A mixin of ArmState (state.py): the store, `self._base`, `self.start` and the lock come from there."""

from __future__ import annotations

import copy

from clusterbake.twins.azure.resource import VAULT_NAME, ArmError, Operation, ResourceId, _now, not_found


class KeyVaultMixin:
    # --- key vault ----------------------------------------------------------------------

    def _put_keyvault_vaults(self, rid, body, existing):
        if not VAULT_NAME.match(rid.name) or "--" in rid.name:
            raise ArmError(
                400,
                "VaultNameNotValid",
                f"The vault name '{rid.name}' is invalid. A vault's name must be between 3-24 alphanumeric "
                "characters. The name must begin with a letter, end with a letter or digit, and not contain "
                "consecutive hyphens.",
            )
        props = body.get("properties") or {}
        if not existing:
            for other in self._of_type("Microsoft.KeyVault/vaults"):
                if other["name"].lower() == rid.name.lower():
                    raise ArmError(409, "VaultAlreadyExists", f"The vault name '{rid.name}' is already in use.")
            deleted = self.deleted_vaults.get(rid.name.lower())
            if deleted and props.get("createMode") != "recover":
                raise ArmError(
                    409,
                    "ConflictError",
                    f"Exist soft deleted vault with the same name '{rid.name}'. Recover it (createMode recover) or "
                    "purge it first.",
                )
            if deleted:
                # Recovered as it was deleted: the request's properties other than createMode do not apply.
                self.deleted_vaults.pop(rid.name.lower())
                vault = deleted["_vault"]
                vault["etag"] = f'W/"{self.guid("etag")}"'
                vault["_lro"] = True
                return vault
        resource = self._base(rid, body, existing)
        if props.get("tenantId") != self.tenant:
            raise ArmError(
                400,
                "BadRequest",
                f"The tenant id '{props.get('tenantId')}' of the vault is not the subscription's tenant {self.tenant}.",
            )
        sku = props.get("sku") or {}
        if sku.get("family") != "A" or sku.get("name") not in ("standard", "premium"):
            raise ArmError(400, "BadRequest", "The vault sku must be family A, name standard or premium.", "sku")
        policies = self._access_policies(props)
        resource["properties"] = {
            "tenantId": self.tenant,
            "sku": {"family": "A", "name": sku["name"]},
            "accessPolicies": policies,
            "enableRbacAuthorization": bool(props.get("enableRbacAuthorization", False)),
            "enableSoftDelete": True,
            "softDeleteRetentionInDays": int(props.get("softDeleteRetentionInDays") or 90),
            "enablePurgeProtection": bool(props.get("enablePurgeProtection", False)) or None,
            "vaultUri": f"https://{rid.name.lower()}.vault.azure.net/",
            "provisioningState": "Succeeded",
        }
        if not resource["properties"]["enablePurgeProtection"]:
            resource["properties"].pop("enablePurgeProtection")
        return resource

    def _access_policies(self, props: dict) -> list[dict]:
        policies = props.get("accessPolicies") or []
        for index, policy in enumerate(policies):
            if not policy.get("objectId") or policy.get("tenantId") != self.tenant:
                raise ArmError(
                    400,
                    "BadRequest",
                    f"Access policy {index}: objectId and the vault's tenantId are required.",
                )
        return list(policies)

    def update_access_policy(self, rid: ResourceId, kind: str, body) -> dict:
        """Vaults - Update Access Policy (`PUT .../vaults/{name}/accessPolicies/{operationKind}`): "add" merges
        each entry's permissions into the vault's entry of the same tenant, object and application, or adds the
        entry; the other policies stay. The answer is the request's policies, as ARM's example shows."""
        vault = self.resources.get(rid.parent().key)
        if vault is None:
            raise not_found(str(rid.parent()), "Microsoft.KeyVault/vaults")
        if kind.lower() != "add":
            raise ArmError(
                400,
                "InvalidParameter",
                f"operationKind '{kind}' is not emulated by this twin (add only).",
                "operationKind",
            )
        if not isinstance(body, dict):
            raise ArmError(
                400, "InvalidRequestContent", "The request content was invalid and could not be deserialized."
            )
        added = self._access_policies(body.get("properties") or {})
        if not added:
            raise ArmError(400, "BadRequest", "At least one access policy is required.")
        held = vault["properties"]["accessPolicies"]
        for policy in copy.deepcopy(added):
            same = (policy["tenantId"], policy["objectId"], policy.get("applicationId"))
            entry = next((p for p in held if (p["tenantId"], p["objectId"], p.get("applicationId")) == same), None)
            if entry is None:
                held.append(policy)
                continue
            for kind_of, granted in (policy.get("permissions") or {}).items():
                have = entry.setdefault("permissions", {}).setdefault(kind_of, [])
                have += [g for g in granted if g.lower() not in {h.lower() for h in have}]
        vault["systemData"] = self._system_data(vault)
        return {
            "id": f"{vault['id']}/accessPolicies/",
            "type": "Microsoft.KeyVault/vaults/accessPolicies",
            "properties": {"accessPolicies": added},
        }

    def _soft_delete_vault(self, vault: dict) -> None:
        name = vault["name"].lower()
        self.deleted_vaults[name] = {
            "_vault": copy.deepcopy(vault),
            "id": f"/subscriptions/{self.subscription}/providers/Microsoft.KeyVault/locations/{vault['location']}"
            f"/deletedVaults/{vault['name']}",
            "name": vault["name"],
            "type": "Microsoft.KeyVault/deletedVaults",
            "properties": {
                "vaultId": vault["id"],
                "location": vault["location"],
                "deletionDate": _now(),
                "scheduledPurgeDate": _now(),
                "tags": vault.get("tags", {}),
                "purgeProtectionEnabled": bool(vault["properties"].get("enablePurgeProtection")),
            },
        }

    def vault_by_name(self, name: str) -> dict | None:
        for vault in self._of_type("Microsoft.KeyVault/vaults"):
            if vault["name"].lower() == name.lower():
                return vault
        return None

    def purge_vault(self, location: str, name: str) -> Operation:
        deleted = self.deleted_vaults.get(name.lower())
        if deleted is None or deleted["properties"]["location"] != location.lower():
            raise ArmError(404, "ResourceNotFound", f"The deleted vault '{name}' was not found in {location}.")
        if deleted["properties"]["purgeProtectionEnabled"]:
            raise ArmError(409, "OperationNotAllowed", f"Vault {name} has purge protection enabled.")
        return self.start("purge", name, location, "Microsoft.KeyVault")

    def secret_access(self, vault: dict, oid: str, permission: str) -> bool:
        if vault["properties"]["enableRbacAuthorization"]:
            return False  # role assignments are not emulated: only access policies grant access
        for policy in vault["properties"]["accessPolicies"]:
            if policy["objectId"] == oid and permission in [
                p.lower() for p in (policy.get("permissions") or {}).get("secrets", [])
            ]:
                return True
        return False
