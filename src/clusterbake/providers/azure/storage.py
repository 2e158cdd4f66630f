"""NFS Azure file shares for the config's `azure_files` storage entries.

Microsoft's requirements for an NFS 4.1 share (docs: "Mount NFS Azure file share on Linux"):
a premium FileStorage account, secure transfer (HTTPS only) off because NFS carries no
TLS, and network access from the nodes' subnet only: the subnet's `Microsoft.Storage`
service endpoint and a virtual network rule on the account, default action Deny. The
nodes mount `<account>.file.core.windows.net:/<account>/<share>` with
`vers=4,minorversion=1,sec=sys` (the shared_storage role's unit).

One account per cluster holds the shares of every entry without `storage_account`; its
name is global in Azure, so it is derived from the subscription, resource group and
cluster (`cb` + 22 hex digits) and tagged `clusterbake-cluster` so that `cluster down`
deletes it (unless an entry says `retain`). An entry naming `storage_account` puts its
share in that existing account, which clusterbake never creates, changes or deletes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from clusterbake.config import AzureFilesStorage, ClusterConfig
from clusterbake.errors import ConfigError
from clusterbake.progress import say
from clusterbake.providers.azure import tags
from clusterbake.providers.azure.api import get_or_none
from clusterbake.providers.azure.checks import Subnet

SERVICE_ENDPOINT = "Microsoft.Storage"


@dataclass(frozen=True)
class Share:
    field: str  # storage.<i> (<name>): what errors name
    entry: AzureFilesStorage
    account: str
    owned: bool  # the cluster's own account (created and deleted by clusterbake)


def cluster_account_name(config: ClusterConfig, purpose: str = "") -> str:
    """The cluster's own account (names are global): cb + 22 hex digits of subscription, group,
    cluster and the account's purpose (none: the FileStorage account of the shares)."""
    azure = config.azure
    seed = "/".join(filter(None, (azure.subscription_id, azure.resource_group, config.cluster_name, purpose)))
    return "cb" + hashlib.sha256(seed.lower().encode()).hexdigest()[:22]


def in_accounts(config: ClusterConfig, kind: type, record: Callable, purpose: str = "") -> list:
    """The config's storage entries of `kind`, each as record(field, entry, account, owned): in the
    account the entry names, or the cluster's own account for `purpose` (owned)."""
    found = []
    for index, entry in enumerate(config.storage or []):
        if isinstance(entry, kind):
            account = entry.storage_account or cluster_account_name(config, purpose)
            found.append(record(f"storage.{index} ({entry.name})", entry, account, entry.storage_account is None))
    return found


def shares(config: ClusterConfig) -> list[Share]:
    """The azure_files entries of the config, each with the account its share lives in."""
    return in_accounts(config, AzureFilesStorage, Share)


def share_name(entry: AzureFilesStorage) -> str:
    return entry.name.lower().replace("_", "-")


def check_service_endpoint(subnet: Subnet, config: ClusterConfig) -> None:
    """Read-only: the cluster's storage accounts (NFS shares, blob containers) let the nodes in through the
    subnet's Microsoft.Storage service endpoint."""
    from clusterbake.providers.azure import blobs

    wanted = [(s.field, "the NFS Azure file share", "use type nfs (the head's export)") for s in shares(config)]
    wanted += [
        (c.field, "the blob container", "name an existing account (storage_account) whose network rules admit them")
        for c in blobs.containers(config)
        if c.owned
    ]
    if not wanted:
        return
    if not set(subnet.service_endpoints) & {SERVICE_ENDPOINT, SERVICE_ENDPOINT + ".Global"}:
        field, what, instead = wanted[0]
        raise ConfigError(
            f"{config.azure.subnet_field}: the subnet has no {SERVICE_ENDPOINT} service endpoint, through which the "
            f"nodes reach {what} of {field}; add it (`az network vnet subnet update "
            f"--ids <subnet id> --service-endpoints {SERVICE_ENDPOINT}`) or {instead}"
        )


def ensure(storage_client, config: ClusterConfig, subnet_id: str) -> None:
    """Create the cluster's account and each missing share (a re-run creates nothing)."""
    from azure.mgmt.storage.models import FileShare

    rg = config.azure.resource_group
    wanted = shares(config)
    for account in sorted({s.account for s in wanted if s.owned}):
        if get_or_none(storage_client.storage_accounts.get_properties, rg, account) is None:
            retain = any(s.entry.retain for s in wanted if s.account == account)
            say(f"    creating storage account {account} (premium FileStorage, NFS from the subnet only)")
            storage_client.storage_accounts.begin_create(rg, account, _account_body(config, subnet_id, retain)).result()
    for share in wanted:
        if not share.owned and get_or_none(storage_client.storage_accounts.get_properties, rg, share.account) is None:
            raise ConfigError(
                f"{share.field}: storage account {share.account} does not exist in resource group {rg}; "
                "give an existing FileStorage account or leave storage_account out"
            )
        name = share_name(share.entry)
        if get_or_none(storage_client.file_shares.get, rg, share.account, name) is None:
            say(f"    creating NFS file share {share.account}/{name} ({share.entry.quota_gib} GiB)")
            storage_client.file_shares.create(
                rg,
                share.account,
                name,
                FileShare(
                    enabled_protocols="NFS",
                    # The nodes create each user's home as root: root must stay root on the share.
                    root_squash="NoRootSquash",
                    share_quota=share.entry.quota_gib,
                ),
            )


def _account_body(config: ClusterConfig, subnet_id: str, retain: bool):
    # NFS 4.1 shares carry no TLS: Azure refuses their mounts on accounts that require secure transfer.
    return account_body(config, subnet_id, retain, kind="FileStorage", sku="Premium_LRS", https_only=False)


def account_body(config: ClusterConfig, subnet_id: str, retain: bool, *, kind: str, sku: str, https_only: bool, **more):
    """A storage account of the cluster (tagged, retained when an entry says so): TLS 1.2, no public blob
    access, reached from the cluster's subnet only (its Microsoft.Storage service endpoint); `more`: other
    StorageAccountCreateParameters."""
    from azure.mgmt.storage.models import NetworkRuleSet, Sku, StorageAccountCreateParameters, VirtualNetworkRule

    body_tags = tags.cluster_tags(config.cluster_name)
    if retain:
        body_tags[tags.RETAIN] = "true"
    return StorageAccountCreateParameters(
        location=config.azure.location,
        kind=kind,
        sku=Sku(name=sku),
        tags=body_tags,
        enable_https_traffic_only=https_only,
        minimum_tls_version="TLS1_2",
        allow_blob_public_access=False,
        network_rule_set=NetworkRuleSet(
            default_action="Deny",
            bypass="AzureServices",
            virtual_network_rules=[VirtualNetworkRule(virtual_network_resource_id=subnet_id, action="Allow")],
        ),
        **more,
    )


def with_accounts(storage_client, config: ClusterConfig, entries: list) -> Iterator[tuple[Any, Any]]:
    """(entry, its storage account's properties) of each Share or Container whose account exists;
    each account read once."""
    accounts: dict[str, object] = {}
    for entry in entries:
        if entry.account not in accounts:
            get = storage_client.storage_accounts.get_properties
            accounts[entry.account] = get_or_none(get, config.azure.resource_group, entry.account)
        if accounts[entry.account] is not None:
            yield entry, accounts[entry.account]


def service_url(account, name: str, service: str) -> str:
    """The account's endpoint of `service` (file, blob) as ARM reports it, else Azure's public form."""
    reported = getattr(account.primary_endpoints, service) if account.primary_endpoints else None
    return reported or f"https://{name}.{service}.core.windows.net/"


def endpoints(storage_client, config: ClusterConfig) -> dict[str, dict]:
    """Per entry name, what the nodes mount: the account's file host and the share's NFS export."""
    return {
        share.entry.name: {
            "dns_name": urlparse(service_url(account, share.account, "file")).hostname,
            "export": f"/{share.account}/{share_name(share.entry)}",
            "account": share.account,
        }
        for share, account in with_accounts(storage_client, config, shares(config))
    }
