"""Key Vault's data plane at the vault's real URL (https://<vault>.vault.azure.net/, through the twin's CONNECT
proxy): Key Vault's challenge, access policies, versioned secrets, soft delete."""

from __future__ import annotations

import hashlib
import re
import time

from clusterbake.twins.azure.handler import VAULT_AUDIENCE, Handler, Reply
from clusterbake.twins.azure.state import ArmError

# "a maximum size of 25 KB each" (About Azure Key Vault secrets). Counted in bytes, the strict reading of
# the service's own words below ("characters"): the same for the ASCII values clusterbake writes.
SECRET_VALUE_LIMIT = 25 * 1024
# What Key Vault answers beyond it, as `az keyvault secret set` shows it (Azure/azure-cli#5639, and a
# public project's record of the inner code); the status is Key Vault's for BadParameter.
SECRET_TOO_LARGE = {
    "error": {
        "code": "BadParameter",
        "message": f"Secret is beyond the maximum permitted length of {SECRET_VALUE_LIMIT} characters.",
        "innererror": {"code": "SecretTooLarge"},
    }
}
KEYVAULT_API_VERSION = re.compile(r"^(\d+\.\d+(-preview(\.\d+)?)?|\d{4}-\d{2}-\d{2}(-preview)?)$")


class VaultHandler(Handler):
    """`https://<vault>.vault.azure.net/secrets/...` inside a CONNECT tunnel (vault_name set per tunnel)."""

    vault_name = ""

    def route(self, path: str, query: dict, body) -> None:
        state = self.twin.state
        vault = state.vault_by_name(self.vault_name)
        if vault is None:
            raise ArmError(404, "VaultNotFound", f"The vault {self.vault_name} does not exist.")
        version = query.get("api-version")
        if not version or not KEYVAULT_API_VERSION.match(version):
            raise ArmError(400, "BadParameter", "The request URI contains an invalid API version.")
        if not self.headers.get("Authorization"):
            # Key Vault's challenge: where to get a token, for which resource.
            raise Reply(
                401,
                {"error": {"code": "Unauthorized", "message": "AKV10000: Request is missing a Bearer or PoP token."}},
                {
                    "WWW-Authenticate": f'Bearer authorization="https://login.microsoftonline.com/{state.tenant}", '
                    f'resource="{VAULT_AUDIENCE}"'
                },
            )
        try:
            claims = self.twin.verify(self.headers.get("Authorization"), VAULT_AUDIENCE)
        except ArmError as error:
            raise Reply(401, {"error": {"code": "Unauthorized", "message": error.message}}) from None
        parts = [p for p in path.split("/") if p]
        permission = {"GET": "get", "PUT": "set", "PATCH": "set", "DELETE": "delete"}.get(self.command, "")
        if parts and parts[0] == "secrets" and (len(parts) == 1 or parts[2:] == ["versions"]):
            permission = "list"
        if parts and parts[0] == "deletedsecrets":
            permission = {"GET": "get", "DELETE": "purge"}.get(self.command, "")
        if not state.secret_access(vault, claims["oid"], permission):
            raise Reply(
                403,
                {
                    "error": {
                        "code": "Forbidden",
                        "message": f"The user, group or application 'appid={claims['appid']};oid={claims['oid']}' "
                        f"does not have secrets {permission} permission on key vault '{vault['name']};location="
                        f"{vault['location']}'.",
                        "innererror": {"code": "AccessDenied"},
                    }
                },
            )
        store = state.secrets.setdefault(vault["name"].lower(), {})
        deleted = state.secrets.setdefault("deleted:" + vault["name"].lower(), {})
        uri = vault["properties"]["vaultUri"].rstrip("/")
        if parts[:1] == ["secrets"] and len(parts) == 1 and self.command == "GET":
            items = [
                {
                    "id": f"{uri}/secrets/{name}",
                    "attributes": versions[-1]["attributes"],
                    "tags": versions[-1].get("tags"),
                }
                for name, versions in sorted(store.items())
            ]
            raise Reply(200, {"value": items, "nextLink": None})
        if parts[:1] == ["secrets"] and len(parts) in (2, 3):
            name = parts[1]
            if not re.fullmatch(r"[0-9a-zA-Z-]{1,127}", name):
                raise Reply(400, {"error": {"code": "BadParameter", "message": f"Invalid secret name {name}."}})
            if self.command == "PUT" and len(parts) == 2:
                if name.lower() in deleted:
                    raise Reply(
                        409,
                        {
                            "error": {
                                "code": "Conflict",
                                "message": f"Secret {name} is currently in a deleted but recoverable state.",
                            }
                        },
                    )
                if not isinstance(body.get("value"), str):
                    raise Reply(400, {"error": {"code": "BadParameter", "message": "The secret value is required."}})
                if state.strict["keyvault_secret_size"] and len(body["value"].encode()) > SECRET_VALUE_LIMIT:
                    raise Reply(400, SECRET_TOO_LARGE)
                now = int(time.time())
                version_id = hashlib.sha256(
                    f"{vault['name']}/{name}/{len(store.get(name.lower(), []))}".encode()
                ).hexdigest()[:32]
                bundle = {
                    "value": body["value"],
                    "id": f"{uri}/secrets/{name}/{version_id}",
                    "attributes": {
                        "enabled": True,
                        "created": now,
                        "updated": now,
                        "recoveryLevel": "Recoverable+Purgeable",
                    },
                    "tags": body.get("tags") or {},
                }
                if body.get("contentType"):
                    bundle["contentType"] = body["contentType"]
                store.setdefault(name.lower(), []).append(bundle)
                raise Reply(200, bundle)
            versions = store.get(name.lower())
            if not versions:
                raise Reply(
                    404,
                    {
                        "error": {
                            "code": "SecretNotFound",
                            "message": f"A secret with (name/id) {name} was not found in this key vault.",
                        }
                    },
                )
            if self.command == "GET" and parts[2:] == ["versions"]:
                items = [{k: v for k, v in version.items() if k != "value"} for version in versions]
                raise Reply(200, {"value": items, "nextLink": None})
            chosen = versions[-1]
            if len(parts) == 3 and parts[2]:
                match = [v for v in versions if v["id"].endswith("/" + parts[2])]
                if not match:
                    raise Reply(404, {"error": {"code": "SecretNotFound", "message": f"No version {parts[2]}."}})
                chosen = match[0]
            if self.command == "PATCH" and len(parts) == 3:
                # UpdateSecret: attributes (enabled), content type and tags of one version; never its value.
                chosen["attributes"].update(
                    {k: v for k, v in (body.get("attributes") or {}).items() if k in ("enabled", "exp", "nbf")}
                )
                chosen["attributes"]["updated"] = int(time.time())
                for key in ("contentType", "tags"):
                    if key in body:
                        chosen[key] = body[key]
                raise Reply(200, {k: v for k, v in chosen.items() if k != "value"})
            if self.command == "GET":
                if not chosen["attributes"].get("enabled", True):
                    raise Reply(
                        403,
                        {
                            "error": {
                                "code": "Forbidden",
                                "message": "Operation get is not allowed on a disabled secret.",
                                "innererror": {"code": "SecretDisabled"},
                            }
                        },
                    )
                raise Reply(200, chosen)
            if self.command == "DELETE" and len(parts) == 2:
                store.pop(name.lower())
                latest = dict(versions[-1])
                latest.pop("value")
                deleted[name.lower()] = latest | {
                    "recoveryId": f"{uri}/deletedsecrets/{name}",
                    "deletedDate": int(time.time()),
                    "scheduledPurgeDate": int(time.time()) + 90 * 86400,
                }
                raise Reply(200, deleted[name.lower()])
        if parts[:1] == ["deletedsecrets"] and len(parts) == 2:
            item = deleted.get(parts[1].lower())
            if item is None:
                raise Reply(
                    404, {"error": {"code": "SecretNotFound", "message": f"Deleted Secret not found: {parts[1]}"}}
                )
            if self.command == "GET":
                raise Reply(200, item)
            if self.command == "DELETE":
                deleted.pop(parts[1].lower())
                raise Reply(204)
        raise Reply(404, {"error": {"code": "NotFound", "message": f"{self.command} {path} is not emulated."}})
