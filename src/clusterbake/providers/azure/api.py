"""Azure SDK clients, the credential, and one error policy for every call.

Endpoint: Azure Resource Manager at `https://management.azure.com` unless
`AZURE_RESOURCE_MANAGER_ENDPOINT` names another (a sovereign cloud, Azure Stack, or the
twin): the only thing that tells clusterbake where ARM is, as AWS_ENDPOINT_URL does for
boto3. Key Vault's data plane is reached at each vault's own `vaultUri`, as ARM reports it.

Credential: azure-identity's DefaultAzureCredential, i.e. the standard environment
(AZURE_CLIENT_ID / AZURE_TENANT_ID / AZURE_CLIENT_SECRET, workload identity, a managed
identity, including the App Service form IDENTITY_ENDPOINT / IDENTITY_HEADER), then the
Azure CLI's login. TLS: the SDK's (requests') verification, with its standard
REQUESTS_CA_BUNDLE; proxies from HTTPS_PROXY / NO_PROXY.

Long-running operations poll as ARM's Retry-After says (azure-core's default otherwise).
Throttling (429) and transient 5xx are retried by azure-core's RetryPolicy, waiting as
Retry-After says (Compute's throttling answers say how long), else with exponential backoff;
every other error reaches the caller at once (AllocationFailed must reach the group's rollback,
not be retried). An Azure Policy denial is said plainly: the assignment, the property it
refused, why the cluster needs it, what to do (policy.py).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import importlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from clusterbake.errors import ClusterbakeError
from clusterbake.providers.azure import policy

ARM_ENDPOINT_ENV = "AZURE_RESOURCE_MANAGER_ENDPOINT"
PUBLIC_ARM = "https://management.azure.com"
ARM_SCOPE = "https://management.azure.com/.default"


def arm_endpoint() -> str:
    return (os.environ.get(ARM_ENDPOINT_ENV) or PUBLIC_ARM).rstrip("/")


@functools.cache
def credential():
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential(exclude_interactive_browser_credential=True)


def _options() -> dict:
    return {"base_url": arm_endpoint(), "user_agent": "clusterbake"}


class _ManagementClient:
    """An attribute of Clients: the SDK's management client class `name` of module `module` for the
    subscription, imported and made when first used, then kept on the instance."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __set_name__(self, owner: type, attribute: str) -> None:
        self.attribute = attribute

    def __get__(self, clients: Clients | None, owner: type | None = None) -> Any:
        if clients is None:
            return self
        made = getattr(importlib.import_module(self.module), self.name)(
            credential(), clients.subscription_id, **_options()
        )
        clients.__dict__[self.attribute] = made
        return made


class Clients:
    """The management clients of one subscription, made when first used."""

    compute = _ManagementClient("azure.mgmt.compute", "ComputeManagementClient")
    network = _ManagementClient("azure.mgmt.network", "NetworkManagementClient")
    resources = _ManagementClient("azure.mgmt.resource.resources", "ResourceManagementClient")
    msi = _ManagementClient("azure.mgmt.msi", "ManagedServiceIdentityClient")
    keyvault = _ManagementClient("azure.mgmt.keyvault", "KeyVaultManagementClient")
    storage = _ManagementClient("azure.mgmt.storage", "StorageManagementClient")
    storagecache = _ManagementClient("azure.mgmt.storagecache", "StorageCacheManagementClient")
    authorization = _ManagementClient("azure.mgmt.authorization", "AuthorizationManagementClient")

    def __init__(self, subscription_id: str):
        self.subscription_id = subscription_id

    def secrets(self, vault_url: str):
        from azure.keyvault.secrets import SecretClient

        return SecretClient(vault_url, credential())


def caller_identity() -> tuple[str, str]:
    """(object id, tenant id) of the principal this process runs as: the `oid` and `tid` claims of its
    ARM token (a JWT), as `az ad signed-in-user show` would tell, without a Graph call."""
    token = credential().get_token(ARM_SCOPE).token
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return claims["oid"], claims["tid"]


def error_code(exc: BaseException) -> str:
    error = getattr(exc, "error", None)
    return getattr(error, "code", None) or ""


def not_found(exc: BaseException) -> bool:
    from azure.core.exceptions import ResourceNotFoundError

    return isinstance(exc, ResourceNotFoundError) or error_code(exc) in ("ResourceNotFound", "NotFound")


def get_or_none(operation: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`operation(...)`, or None when the resource does not exist."""
    from azure.core.exceptions import HttpResponseError

    try:
        return operation(*args, **kwargs)
    except HttpResponseError as exc:
        if not_found(exc):
            return None
        raise


def listed(operation: Callable[..., Any], *args: Any, **kwargs: Any) -> list:
    """Every item of a paged listing, or none when its scope (a resource group) does not exist."""
    return get_or_none(lambda: list(operation(*args, **kwargs))) or []


def message(exc: BaseException) -> str:
    denial = policy.explain(exc)  # an Azure Policy deny: which assignment, what the cluster needed, what to do
    if denial is not None:
        return denial
    error = getattr(exc, "error", None)
    if error is not None and getattr(error, "code", None):
        return f"{error.code}: {error.message}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


@contextlib.contextmanager
def azure_error_translation() -> Iterator[None]:
    """Turn the SDK's exceptions into ClusterbakeError: a message, no traceback."""
    from azure.core.exceptions import AzureError, ClientAuthenticationError, HttpResponseError

    try:
        yield
    except ClientAuthenticationError as exc:
        raise ClusterbakeError(
            "Azure: no credentials (set AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET, use a managed "
            f"identity, or run `az login`): {str(exc).splitlines()[0]}"
        ) from None
    except HttpResponseError as exc:
        raise ClusterbakeError(f"Azure: {message(exc)}") from exc
    except AzureError as exc:
        raise ClusterbakeError(f"Azure: {exc}") from exc


def azure_errors(method: Callable) -> Callable:
    """azure_error_translation around a function (a contextmanager is a ContextDecorator too)."""
    return azure_error_translation()(method)
