"""The operator's Azure permissions as data: the custom role `clusterbake permissions` prints for a config.

One table (GRANTS) of the ARM actions `cluster up`, `status`, `node`, `ops` and `down` need, each
grant with why and the configs that need it; the role's assignable scope is the subscription (the
cluster's resource groups are made by it). Key Vault secrets are written under the vault's access
policies (no data actions), the blob containers' data by the nodes' identity.

tests/azure/test_azure_permissions.py holds it to the product: the ARM twin records the action of
every request the controller makes (and each linked action: the subnet a NIC joins, ...), all of
which the role must allow; and with the controller held to its role assignments like any
principal, an operator with only this role brings a cluster up and down.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from clusterbake.config import AmlfsStorage, AzureBlobStorage, AzureFilesStorage, ClusterConfig
from clusterbake.providers.common import action_allowed


def _always(config: ClusterConfig) -> bool:
    return True


def _storage(kind: type) -> Callable[[ClusterConfig], bool]:
    return lambda config: any(isinstance(entry, kind) for entry in config.storage or [])


def _rwd(kind: str) -> tuple[str, ...]:
    return (f"{kind}/read", f"{kind}/write", f"{kind}/delete")


@dataclass(frozen=True)
class Grant:
    name: str
    actions: tuple[str, ...]
    why: str
    needed: Callable[[ClusterConfig], bool] = _always


GRANTS: tuple[Grant, ...] = (
    Grant(
        "read-only checks",
        (
            "Microsoft.Resources/subscriptions/resources/read",
            "Microsoft.Compute/skus/read",
            "Microsoft.Compute/locations/usages/read",
            "Microsoft.Compute/images/read",
            "Microsoft.Compute/galleries/images/read",
            "Microsoft.Compute/galleries/images/versions/read",
            "Microsoft.Compute/disks/read",
            "Microsoft.Network/virtualNetworks/read",
            "Microsoft.Network/virtualNetworks/subnets/read",
            "Microsoft.Network/virtualNetworks/CheckIPAddressAvailability/read",
            "Microsoft.Network/natGateways/read",
            "Microsoft.Network/routeTables/read",
        ),
        "sizes, quota, the subnet and its way out, addresses in use, the image, status, what still bills",
    ),
    Grant(
        "resource groups",
        _rwd("Microsoft.Resources/subscriptions/resourceGroups"),
        "the cluster's resource group and its nodes' (made when missing, removed when clusterbake made them)",
    ),
    Grant(
        "network",
        (
            *_rwd("Microsoft.Network/networkSecurityGroups"),
            "Microsoft.Network/networkSecurityGroups/join/action",
            *_rwd("Microsoft.Network/applicationSecurityGroups"),
            "Microsoft.Network/applicationSecurityGroups/joinIpConfiguration/action",
            *_rwd("Microsoft.Network/networkInterfaces"),
            "Microsoft.Network/networkInterfaces/join/action",
            "Microsoft.Network/virtualNetworks/subnets/join/action",
        ),
        "the NSG and ASG, each node's NIC in the subnet",
    ),
    Grant(
        "compute",
        (
            *_rwd("Microsoft.Compute/virtualMachines"),
            "Microsoft.Compute/virtualMachines/start/action",
            "Microsoft.Compute/virtualMachines/deallocate/action",
            "Microsoft.Compute/virtualMachines/powerOff/action",
            "Microsoft.Compute/virtualMachines/restart/action",
            "Microsoft.Compute/virtualMachines/instanceView/read",
            "Microsoft.Compute/virtualMachines/retrieveBootDiagnosticsData/action",
            *_rwd("Microsoft.Compute/proximityPlacementGroups"),
            *_rwd("Microsoft.Compute/availabilitySets"),
            "Microsoft.Compute/disks/delete",
        ),
        "the VMs (node start/stop/replace), placement groups, InfiniBand availability sets, host keys from boot "
        "diagnostics",
    ),
    Grant(
        "identities and roles",
        (
            *_rwd("Microsoft.ManagedIdentity/userAssignedIdentities"),
            "Microsoft.ManagedIdentity/userAssignedIdentities/assign/action",
            *_rwd("Microsoft.Authorization/roleAssignments"),
            *_rwd("Microsoft.Authorization/roleDefinitions"),
        ),
        "the nodes' and the head's identities, their role assignments, the head's custom power role",
    ),
    Grant(
        "Key Vault",
        (
            *_rwd("Microsoft.KeyVault/vaults"),
            "Microsoft.KeyVault/vaults/accessPolicies/write",
            "Microsoft.KeyVault/locations/deletedVaults/read",
            "Microsoft.KeyVault/locations/deletedVaults/purge/action",
        ),
        "the vault of the join bundles, its access policies (the secrets are written under them)",
    ),
    Grant(
        "Azure Files",
        (
            *_rwd("Microsoft.Storage/storageAccounts"),
            *_rwd("Microsoft.Storage/storageAccounts/fileServices/shares"),
        ),
        "the premium FileStorage account and its NFS shares",
        _storage(AzureFilesStorage),
    ),
    Grant(
        "Blob Storage",
        (
            *_rwd("Microsoft.Storage/storageAccounts"),
            *_rwd("Microsoft.Storage/storageAccounts/blobServices/containers"),
        ),
        "the StorageV2 account and its containers (their data: the nodes' identity, by role)",
        _storage(AzureBlobStorage),
    ),
    Grant(
        "Managed Lustre",
        (
            *_rwd("Microsoft.StorageCache/amlFilesystems"),
            "Microsoft.StorageCache/checkAmlFSSubnets/action",
            "Microsoft.StorageCache/getRequiredAmlFSSubnetsSize/action",
        ),
        "Azure Managed Lustre file systems",
        _storage(AmlfsStorage),
    ),
)


def chosen(config: ClusterConfig) -> list[Grant]:
    return [grant for grant in GRANTS if grant.needed(config)]


def role_definition(config: ClusterConfig) -> dict:
    """The custom role, as `az role definition create --role-definition @file` takes it."""
    actions = list(dict.fromkeys(action for grant in chosen(config) for action in grant.actions))
    return {
        "Name": f"clusterbake operator ({config.cluster_name})",
        "IsCustom": True,
        "Description": f"What clusterbake's operator needs for cluster {config.cluster_name} (clusterbake permissions)",
        "Actions": actions,
        "NotActions": [],
        "DataActions": [],
        "NotDataActions": [],
        "AssignableScopes": [f"/subscriptions/{config.azure.subscription_id}"],
    }


def allowed(role: dict, action: str) -> bool:
    """Whether the role's Actions allow `action` (ARM matches them case-insensitively, `*` a wildcard)."""
    return action_allowed(role["Actions"], action)
