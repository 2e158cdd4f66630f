"""Blob Storage containers for the config's `azure_blob` entries, mounted with blobfuse2 on every node.

The cluster's own account holds the containers of every entry without `storage_account`:
StorageV2, Standard_LRS, `cb` + 22 hex digits of subscription/group/cluster/`blob` (names
are global; not the azure_files account: a premium FileStorage account holds no blobs),
HTTPS only with TLS 1.2, no public blob access and no shared key access (the nodes read
with their managed identity, nothing else may), network rules Deny with the cluster's
subnet allowed (through its Microsoft.Storage service endpoint, checked first as for
azure_files); a private container (`publicAccess: None`) per entry. Tagged
clusterbake-cluster, so `cluster down` deletes it, unless an entry says retain.

An entry naming `storage_account` uses that existing account of azure.resource_group and
its existing container (both checked before anything is created); clusterbake changes
neither, nor their network rules.

Access (both kinds): the nodes' user-assigned identity gets Storage Blob Data Contributor on
each container (Storage Blob Data Reader for a read_only entry), a role assignment at the
container's scope (rbac.py), deleted by `cluster down`. blobfuse2 on the nodes (role
blobfuse2) authenticates with that identity (azstorage `mode: msi`, `appid`).
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterbake.config import AzureBlobStorage, ClusterConfig
from clusterbake.errors import ConfigError
from clusterbake.progress import say
from clusterbake.providers.azure import rbac, storage
from clusterbake.providers.azure.api import get_or_none


@dataclass(frozen=True)
class Container:
    field: str  # storage.<i> (<name>): what errors name
    entry: AzureBlobStorage
    account: str
    owned: bool  # in the cluster's own account (created and deleted by clusterbake)

    @property
    def name(self) -> str:
        return self.entry.container_name

    @property
    def role(self) -> str:
        return rbac.BLOB_DATA_READER if self.entry.read_only else rbac.BLOB_DATA_CONTRIBUTOR


def containers(config: ClusterConfig) -> list[Container]:
    return storage.in_accounts(config, AzureBlobStorage, Container, purpose="blob")


def scope(config: ClusterConfig, container: Container) -> str:
    azure = config.azure
    return (
        f"/subscriptions/{azure.subscription_id}/resourceGroups/{azure.resource_group}/providers/"
        f"Microsoft.Storage/storageAccounts/{container.account}/blobServices/default/containers/{container.name}"
    )


def check_existing(storage_client, config: ClusterConfig) -> None:
    """Read-only: an entry's existing account and container are there."""
    rg = config.azure.resource_group
    for container in containers(config):
        if container.owned:
            continue
        account = get_or_none(storage_client.storage_accounts.get_properties, rg, container.account)
        if account is None:
            raise ConfigError(
                f"{container.field}: storage account {container.account} does not exist in resource group {rg}; "
                "give an existing account or leave storage_account out"
            )
        if account.kind == "FileStorage":
            raise ConfigError(
                f"{container.field}: storage account {container.account} is a FileStorage account, which holds no "
                "blobs; give a StorageV2 (or BlockBlobStorage) account"
            )
        if get_or_none(storage_client.blob_containers.get, rg, container.account, container.name) is None:
            raise ConfigError(
                f"{container.field}: container {container.name} does not exist in storage account "
                f"{container.account}; create it, or leave storage_account out to get one of the cluster's own"
            )


def ensure(storage_client, config: ClusterConfig, subnet_id: str) -> None:
    """The cluster's account and its missing containers (a re-run creates nothing)."""
    from azure.mgmt.storage.models import BlobContainer

    rg = config.azure.resource_group
    owned = [c for c in containers(config) if c.owned]
    if not owned:
        return
    account = owned[0].account
    if get_or_none(storage_client.storage_accounts.get_properties, rg, account) is None:
        say(f"    creating storage account {account} (StorageV2, blobs for blobfuse2, from the subnet only)")
        storage_client.storage_accounts.begin_create(
            rg, account, _account_body(config, subnet_id, any(c.entry.retain for c in owned))
        ).result()
    for container in owned:
        if get_or_none(storage_client.blob_containers.get, rg, account, container.name) is None:
            say(f"    creating blob container {account}/{container.name}")
            storage_client.blob_containers.create(rg, account, container.name, BlobContainer(public_access="None"))


def _account_body(config: ClusterConfig, subnet_id: str, retain: bool):
    # Only Entra ID (the nodes' managed identity): no account keys, no SAS signed with them.
    return storage.account_body(
        config, subnet_id, retain, kind="StorageV2", sku="Standard_LRS", https_only=True, allow_shared_key_access=False
    )


def grant(authorization, config: ClusterConfig, principal_id: str) -> None:
    """The nodes' identity gets its Storage Blob Data role on each container."""
    for container in containers(config):
        role = "Reader" if container.entry.read_only else "Contributor"
        at = scope(config, container)
        if rbac.ensure(authorization, config.azure.subscription_id, at, principal_id, container.role):
            say(f"    nodes' identity: Storage Blob Data {role} on {container.account}/{container.name}")


def endpoints(storage_client, config: ClusterConfig) -> dict[str, dict]:
    """Per entry name, what blobfuse2 mounts: {account, container, endpoint, read_only}."""
    return {
        container.entry.name: {
            "account": container.account,
            "container": container.name,
            "endpoint": storage.service_url(account, container.account, "blob").rstrip("/"),
            "read_only": container.entry.read_only,
        }
        for container, account in storage.with_accounts(storage_client, config, containers(config))
    }
