"""The blob service of the twin's storage accounts: `https://<account>.blob.core.windows.net/`, the part
blobfuse2 (the twin's stand-in, blobfuse2_helper.py) needs at mount time.

Served in the CONNECT proxy's tunnels (host clients, arm.py) and at the twin's address on
port 443 for the nodes (daemon.py), Azure Storage's way ("Authorize access to blobs using
Microsoft Entra ID", "Blob service REST API"):

- the account's network rules first: with default action Deny, a request is served only
  from a subnet of a virtual network rule (the node's own address says which) or an IP
  rule; else 403 `AuthorizationFailure`;
- a bearer token for `https://storage.azure.com` (the twin's, from IMDS or its token
  endpoint) and `x-ms-version` 2017-11-09 or later; without one 401
  `NoAuthenticationInformation`; shared keys and SAS are not emulated (the product's
  accounts turn shared keys off);
- `HEAD|GET /<container>?restype=container` (Get Container Properties: the role action
  `.../blobServices/containers/read`) and `GET /<container>?restype=container&comp=list`
  (List Blobs: the data action `.../containers/blobs/read`), decided by the principal's
  role assignments at the container's scope or above (rbac.py); without one 403
  `AuthorizationPermissionMismatch`. Listed blobs are the files of the container's
  directory when the twin keeps one (its nodes' storage), else none;
- errors in Azure Storage's XML with the `x-ms-error-code` header.

Not emulated: writing through the API (Put Blob), blob properties, SAS, shared keys.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

BLOB_HOST = re.compile(r"^([a-z0-9]{3,24})\.blob\.core\.windows\.net$")
STORAGE_AUDIENCE = "https://storage.azure.com"
CONTAINER_READ = "Microsoft.Storage/storageAccounts/blobServices/containers/read"
BLOBS_READ = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read"
OAUTH_SINCE = "2017-11-09"
MESSAGES = {
    "AuthorizationFailure": "This request is not authorized to perform this operation.",
    "AuthorizationPermissionMismatch": "This request is not authorized to perform this operation using this "
    "permission.",
    "NoAuthenticationInformation": "Server failed to authenticate the request. Please refer to the information in the "
    "www-authenticate header.",
    "InvalidAuthenticationInfo": "Authentication information is not given in the correct format.",
    "ContainerNotFound": "The specified container does not exist.",
    "ResourceNotFound": "The specified resource does not exist.",
    "MissingRequiredHeader": "An HTTP header that's mandatory for this request is not specified.",
    "UnsupportedHttpVerb": "The resource doesn't support the specified HTTP verb.",
}


class BlobError(Exception):
    def __init__(self, status: int, code: str, detail: str = ""):
        super().__init__(code)
        self.status, self.code, self.detail = status, code, detail


def error_reply(error: BlobError) -> tuple[int, bytes, dict[str, str]]:
    message = MESSAGES.get(error.code, error.code) + (f"\n{error.detail}" if error.detail else "")
    body = (
        f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{error.code}</Code>'
        f"<Message>{escape(message)}</Message></Error>"
    ).encode()
    headers = {"x-ms-error-code": error.code, "Content-Type": "application/xml"}
    if error.status == 401:
        headers["WWW-Authenticate"] = (
            "Bearer authorization_uri=https://login.microsoftonline.com/common/oauth2/authorize "
            f"resource_id={STORAGE_AUDIENCE}"
        )
    return error.status, body, headers


def _network_allows(state, account: dict, source: str) -> bool:
    acls = account["properties"].get("networkAcls") or {}
    if acls.get("defaultAction", "Allow") == "Allow":
        return True
    address = ipaddress.ip_address(source)
    for rule in acls.get("virtualNetworkRules") or []:
        subnet = state.resources.get((rule.get("id") or "").lower())
        if subnet is not None and address in ipaddress.ip_network(subnet["properties"]["addressPrefix"]):
            return True
    return any(
        address in ipaddress.ip_network(rule.get("value", "0.0.0.0/32"), strict=False)
        for rule in acls.get("ipRules") or []
    )


def handle(twin, method: str, path: str, headers, source: str, account_name: str, root: Path | None):
    """(status, body, headers) of one blob service request to `account_name` from `source` (its address)."""
    try:
        return _handle(twin, method, path, headers, source, account_name, root)
    except BlobError as error:
        return error_reply(error)


def _handle(twin, method, path, headers, source, account_name, root):
    state = twin.state
    split = urlsplit(path)
    query = {k: v[-1] for k, v in parse_qs(split.query).items()}
    with state.lock:
        account = state.account_by_name(account_name)
        if account is None:
            raise BlobError(404, "ResourceNotFound", f"no storage account {account_name}")
        if not _network_allows(state, account, source):
            raise BlobError(403, "AuthorizationFailure", f"the account's network rules do not admit {source}")
        authorization = headers.get("Authorization")
        if not authorization:
            raise BlobError(401, "NoAuthenticationInformation")
        try:
            claims = twin.verify(authorization, STORAGE_AUDIENCE)
        except Exception as exc:
            raise BlobError(401, "InvalidAuthenticationInfo", getattr(exc, "message", str(exc))) from None
        if (headers.get("x-ms-version") or "") < OAUTH_SINCE:
            raise BlobError(400, "MissingRequiredHeader", f"x-ms-version {OAUTH_SINCE} or later (OAuth)")
        parts = [p for p in split.path.split("/") if p]
        if len(parts) != 1 or query.get("restype") != "container" or method not in ("GET", "HEAD"):
            raise BlobError(405, "UnsupportedHttpVerb", f"{method} {split.path} is not emulated by the twin")
        container = parts[0]
        found = next(
            (c for a, c in state.blob_containers() if a["id"] == account["id"] and c["name"] == container), None
        )
        if found is None:
            raise BlobError(404, "ContainerNotFound")
        listing = query.get("comp") == "list"
        action = BLOBS_READ if listing else CONTAINER_READ
        if not state.allowed(claims["oid"], action, found["id"], data=listing):
            raise BlobError(403, "AuthorizationPermissionMismatch", f"{claims['oid']} may not {action}")
    common = {"x-ms-version": headers.get("x-ms-version"), "x-ms-blob-public-access": ""}
    if not listing:
        return 200, b"", {**common, "x-ms-lease-status": "unlocked", "x-ms-has-immutability-policy": "false"}
    directory = root / account_name / container if root is not None else None
    names = sorted(
        str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()
    ) if directory is not None and directory.is_dir() else []  # fmt: skip
    blobs = "".join(f"<Blob><Name>{escape(n)}</Name></Blob>" for n in names[: int(query.get("maxresults", 5000))])
    body = (
        f'<?xml version="1.0" encoding="utf-8"?><EnumerationResults ServiceEndpoint='
        f'"https://{account_name}.blob.core.windows.net/" ContainerName="{container}"><Blobs>{blobs}</Blobs>'
        "<NextMarker /></EnumerationResults>"
    ).encode()
    return 200, body, {**common, "Content-Type": "application/xml"}
