"""Storage accounts, NFS file shares and blob containers, as ARM validates them.

A mixin of ArmState (state.py): the store, `self._base`, `self.start` and the lock come from there."""

from __future__ import annotations

from clusterbake.twins.azure.resource import (
    CONTAINER_NAME,
    SHARE_NAME,
    STORAGE_ACCOUNT_NAME,
    STORAGE_KINDS,
    ArmError,
    ResourceId,
    _now,
    not_found,
)


class StorageMixin:
    # --- storage (accounts and NFS file shares) --------------------------------------------

    def _put_storage_storageaccounts(self, rid, body, existing):
        if not STORAGE_ACCOUNT_NAME.match(rid.name):
            raise ArmError(
                400,
                "AccountNameInvalid",
                f"{rid.name} is not a valid storage account name. Storage account name must be between 3 and 24 "
                "characters in length and use numbers and lower-case letters only.",
            )
        taken = next((a for a in self._of_type("Microsoft.Storage/storageAccounts") if a["name"] == rid.name), None)
        if taken is not None and taken["id"].lower() != rid.key:
            raise ArmError(409, "StorageAccountAlreadyTaken", f"The storage account named {rid.name} is already taken.")
        kind = body.get("kind")
        if kind not in STORAGE_KINDS:
            raise ArmError(400, "InvalidRequestPropertyValue", f"The value '{kind}' is not allowed for 'kind'.")
        sku = (body.get("sku") or {}).get("name") or ""
        if kind == "FileStorage" and not sku.startswith("Premium_"):
            raise ArmError(
                400, "InvalidRequestPropertyValue", f"Sku '{sku}' is not supported for kind FileStorage (Premium only)."
            )
        props = body.get("properties") or {}
        resource = self._base(rid, body, existing)
        acls = props.get("networkAcls") or {"defaultAction": "Allow", "bypass": "AzureServices"}
        for rule in acls.get("virtualNetworkRules") or []:
            subnet = self._require(rule.get("id"), "Microsoft.Network/virtualNetworks/subnets", "virtualNetworkRules")
            services = {e["service"] for e in subnet["properties"].get("serviceEndpoints", [])}
            if not services & {"Microsoft.Storage", "Microsoft.Storage.Global"}:
                raise ArmError(
                    400,
                    "NetworkAclsValidationFailure",
                    f"Validation of network acls failure: SubnetsHaveNoServiceEndpointsConfigured:Subnets "
                    f"{subnet['name']} of virtual network {rid.subscription} do not have ServiceEndpoints for "
                    "Microsoft.Storage resources configured. Add Microsoft.Storage to subnet's ServiceEndpoints "
                    "collection before trying to ACL Microsoft.Storage resources to these subnets..",
                )
            rule.setdefault("action", "Allow")
            rule["state"] = "Succeeded"
        name = rid.name
        resource["kind"] = kind
        resource["sku"] = {"name": sku, "tier": "Premium" if sku.startswith("Premium_") else "Standard"}
        resource["properties"] = {
            "provisioningState": "Succeeded",
            "creationTime": existing["properties"]["creationTime"] if existing else _now(),
            "primaryLocation": resource["location"],
            "statusOfPrimary": "available",
            "supportsHttpsTrafficOnly": props.get("supportsHttpsTrafficOnly", True),
            "minimumTlsVersion": props.get("minimumTlsVersion", "TLS1_0"),
            "allowBlobPublicAccess": props.get("allowBlobPublicAccess", False),
            "allowSharedKeyAccess": props.get("allowSharedKeyAccess", True),
            "networkAcls": acls,
            "primaryEndpoints": {
                "file": f"https://{name}.file.core.windows.net/",
                "blob": f"https://{name}.blob.core.windows.net/",
                "queue": f"https://{name}.queue.core.windows.net/",
                "table": f"https://{name}.table.core.windows.net/",
            },
        }
        return resource

    def _service_account(self, rid, service: str) -> dict:
        """The storage account of a share or container `rid` (below the account's one `service` service)."""
        if rid.names[1] != "default":
            raise ArmError(400, "InvalidResourceName", f"The {service} service name must be 'default'.")
        account = self.resources.get(rid.parent().parent().key)
        if account is None:
            raise not_found(str(rid.parent().parent()), "Microsoft.Storage/storageAccounts")
        return account

    def _put_storage_storageaccounts_fileservices_shares(self, rid, body, existing):
        account = self._service_account(rid, "file")
        if not SHARE_NAME.match(rid.name):
            raise ArmError(400, "InvalidResourceName", f"The specifed resource name '{rid.name}' is invalid.")
        props = body.get("properties") or {}
        protocol = props.get("enabledProtocols", "SMB")
        if protocol == "NFS" and account["kind"] != "FileStorage":
            raise ArmError(
                400, "InvalidHeaderValue", "NFS file shares need a premium FileStorage account (kind FileStorage)."
            )
        if existing and existing["properties"]["enabledProtocols"] != protocol:
            raise ArmError(400, "InvalidHeaderValue", "enabledProtocols cannot be changed on an existing share.")
        quota = props.get("shareQuota", 102400 if account["kind"] == "FileStorage" else 5120)
        if account["kind"] == "FileStorage" and not 100 <= int(quota) <= 102400:
            raise ArmError(400, "InvalidHeaderValue", "shareQuota of a premium share must be 100 to 102400 GiB.")
        resource = self._base(rid, body, existing, location=False)
        resource["type"] = "Microsoft.Storage/storageAccounts/fileServices/shares"
        resource["properties"] = {
            "enabledProtocols": protocol,
            "rootSquash": props.get("rootSquash", "NoRootSquash") if protocol == "NFS" else None,
            "shareQuota": int(quota),
            "lastModifiedTime": _now(),
            "accessTier": "Premium" if account["kind"] == "FileStorage" else "TransactionOptimized",
        }
        return resource

    def _put_storage_storageaccounts_blobservices_containers(self, rid, body, existing):
        account = self._service_account(rid, "blob")
        if account["kind"] == "FileStorage":
            raise ArmError(
                400, "FeatureNotSupportedForAccount", "Blob is not supported for the account (kind FileStorage)."
            )
        if not CONTAINER_NAME.match(rid.name):
            raise ArmError(400, "ContainerNameInvalid", f"The specified container name '{rid.name}' is invalid.")
        props = body.get("properties") or {}
        access = props.get("publicAccess", "None")
        if access not in ("None", "Container", "Blob"):
            raise ArmError(400, "InvalidRequestPropertyValue", f"publicAccess {access!r}.")
        if access != "None" and not account["properties"]["allowBlobPublicAccess"]:
            raise ArmError(409, "PublicAccessNotPermitted", "Public access is not permitted on this storage account.")
        resource = self._base(rid, body, existing, location=False)
        resource["type"] = "Microsoft.Storage/storageAccounts/blobServices/containers"
        resource["properties"] = {
            "publicAccess": access,
            "lastModifiedTime": _now(),
            "leaseStatus": "Unlocked",
            "leaseState": "Available",
            "hasImmutabilityPolicy": False,
            "hasLegalHold": False,
        }
        return resource

    def blob_containers(self) -> list[tuple[dict, dict]]:
        """(account, container) of every blob container."""
        found = []
        for container in self._of_type("Microsoft.Storage/storageAccounts/blobServices/containers"):
            account = self.resources.get(ResourceId.parse(container["id"]).parent().parent().key)
            if account is not None:
                found.append((account, container))
        return found

    def account_by_name(self, name: str) -> dict | None:
        return next((a for a in self._of_type("Microsoft.Storage/storageAccounts") if a["name"] == name), None)

    def nfs_shares(self) -> list[tuple[dict, dict]]:
        """(account, share) of every NFS share: what the twin's nodes may mount."""
        found = []
        for share in self._of_type("Microsoft.Storage/storageAccounts/fileServices/shares"):
            if share["properties"]["enabledProtocols"] != "NFS":
                continue
            account = self.resources.get(ResourceId.parse(share["id"]).parent().parent().key)
            if account is not None:
                found.append((account, share))
        return found
