"""`cluster down` on Azure: every resource tagged clusterbake-cluster=<cluster>, in an order that
lets each delete succeed, then the resource groups clusterbake created once nothing else is in them.

First the head identity's grants and custom role (an identity's assignments outlive it as "Identity
not found"), then the compute nodes' group, then the cluster's (VMs first in each), then a
soft-deleted vault is purged (its name would stay taken for 90 days) and the local state goes.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from clusterbake.errors import ClusterbakeError
from clusterbake.progress import say
from clusterbake.providers.azure import power, rbac, tags
from clusterbake.providers.azure.api import get_or_none

if TYPE_CHECKING:
    from clusterbake.providers.azure.provider import AzureProvider

# Delete order: what holds on to what comes first.
DELETE_ORDER = (
    "Microsoft.Compute/virtualMachines",
    "Microsoft.Network/networkInterfaces",
    "Microsoft.Compute/disks",
    "Microsoft.Compute/virtualMachineScaleSets",
    "Microsoft.Compute/availabilitySets",
    "Microsoft.Compute/proximityPlacementGroups",
    "Microsoft.Network/networkSecurityGroups",
    "Microsoft.Network/applicationSecurityGroups",
    "Microsoft.ManagedIdentity/userAssignedIdentities",
    "Microsoft.KeyVault/vaults",
    "Microsoft.StorageCache/amlFilesystems",
    "Microsoft.Storage/storageAccounts",
)
# How each type is deleted: (Clients attribute, its operations group, method). A `begin_` method is a
# long-running operation, waited for after all of a type's deletes have started. Other types go by
# their resource id through the generic resources API, with an api-version their resource provider
# registers (api_version_of: one fixed version fails for a provider with another family, review B3).
DELETERS = {
    "Microsoft.Compute/virtualMachines": ("compute", "virtual_machines", "begin_delete"),
    "Microsoft.Network/networkInterfaces": ("network", "network_interfaces", "begin_delete"),
    "Microsoft.Compute/disks": ("compute", "disks", "begin_delete"),
    "Microsoft.Compute/virtualMachineScaleSets": ("compute", "virtual_machine_scale_sets", "begin_delete"),
    "Microsoft.Compute/availabilitySets": ("compute", "availability_sets", "delete"),
    "Microsoft.Compute/proximityPlacementGroups": ("compute", "proximity_placement_groups", "delete"),
    "Microsoft.Network/networkSecurityGroups": ("network", "network_security_groups", "begin_delete"),
    "Microsoft.Network/applicationSecurityGroups": ("network", "application_security_groups", "begin_delete"),
    "Microsoft.ManagedIdentity/userAssignedIdentities": ("msi", "user_assigned_identities", "delete"),
    "Microsoft.KeyVault/vaults": ("keyvault", "vaults", "delete"),
    "Microsoft.Storage/storageAccounts": ("storage", "storage_accounts", "delete"),
    "Microsoft.StorageCache/amlFilesystems": ("storagecache", "aml_filesystems", "begin_delete"),
}


def destroy_cluster(provider: AzureProvider) -> list[str]:
    azure, clients = provider.azure, provider.clients
    removed: list[str] = []
    identities = [
        item
        for item in provider._tagged(azure.resource_group)
        if item.type == "Microsoft.ManagedIdentity/userAssignedIdentities"
    ]
    removed += _delete_role_assignments(provider, identities)
    removed += power.delete_role(
        clients.authorization, azure.subscription_id, azure.resource_group, provider.config.cluster_name
    )
    for rg in provider._groups():
        removed += _destroy_group(provider, rg)
    deleted = get_or_none(clients.keyvault.vaults.get_deleted, provider.vault_name, azure.location)
    if deleted is not None:
        clients.keyvault.vaults.begin_purge_deleted(provider.vault_name, azure.location).result()
        removed.append(f"soft-deleted key vault {provider.vault_name} (purged)")
    if provider.cluster.root.exists():
        shutil.rmtree(provider.cluster.root)
        removed.append(f"state {provider.cluster.root}")
    return removed


def _destroy_group(provider: AzureProvider, rg: str) -> list[str]:
    """The cluster's resources in `rg` in DELETE_ORDER, then the group itself when clusterbake created it
    for this cluster and nothing else is in it."""
    clients = provider.clients
    api = clients.resources
    removed: list[str] = []
    # OS disks carry no tags: those of the cluster's VMs that were kept (deleteOption Detach).
    prefix = f"{provider.config.cluster_name}-"
    disks = [d for d in clients.compute.disks.list_by_resource_group(rg) if d.name.startswith(prefix)]
    by_type: dict[str, list] = {}
    for resource in provider._tagged(rg):
        if tags.retained(resource):
            say(f"    keeping {resource.name}: its storage entry says retain")
            continue
        by_type.setdefault(resource.type, []).append(resource)
    by_type.setdefault("Microsoft.Compute/disks", []).extend(d for d in disks if not d.managed_by)
    for kind in DELETE_ORDER:
        items = by_type.pop(kind, [])
        if items:
            removed += _delete_all(provider, rg, kind, items)
    for kind, items in by_type.items():
        removed += _delete_all(provider, rg, kind, items)
    group = get_or_none(api.resource_groups.get, rg)
    if group is not None and provider._created_by_us(group):
        left = list(api.resources.list_by_resource_group(rg))
        if left:
            say(f"    keeping resource group {rg}: it holds {len(left)} resource(s) clusterbake did not create")
        else:
            api.resource_groups.begin_delete(rg).result()
            removed.append(f"resource group {rg}")
    return removed


def _delete_role_assignments(provider: AzureProvider, identities: list) -> list[str]:
    """Before the identities go: their role assignments (Azure would keep them as "Identity not found")."""
    azure, clients = provider.azure, provider.clients
    principals = {}
    for item in identities:
        found = get_or_none(clients.msi.user_assigned_identities.get, azure.resource_group, item.name)
        if found is not None:
            principals[f"identity {item.name}"] = found.principal_id
    if not principals:
        return []
    return rbac.delete_all(clients.authorization, azure.subscription_id, principals)


def _delete_all(provider: AzureProvider, rg: str, kind: str, items: list) -> list[str]:
    clients = provider.clients
    pollers = []
    for item in items:
        if kind in DELETERS:
            client, operations, method = DELETERS[kind]
            answer = getattr(getattr(getattr(clients, client), operations), method)(rg, item.name)
            if method.startswith("begin_"):
                pollers.append(answer)
        else:
            version = api_version_of(clients, kind)
            pollers.append(clients.resources.resources.begin_delete_by_id(item.id, api_version=version))
    for poller in pollers:
        poller.result()
    label = kind.split("/")[-1]
    return sorted(f"{label} {item.name}" for item in items)


def api_version_of(clients, kind: str) -> str:
    """The newest stable api-version the resource provider registers for `kind` (Namespace/type)."""
    namespace, rtype = kind.split("/", 1)
    for entry in clients.resources.providers.get(namespace).resource_types or []:
        if (entry.resource_type or "").lower() == rtype.lower():
            stable = [v for v in entry.api_versions or [] if not v.endswith("-preview")]
            if stable:
                return max(stable)
    raise ClusterbakeError(f"Azure lists no api-version for {kind}: delete it by hand (az resource delete --ids ...)")
