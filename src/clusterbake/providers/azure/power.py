"""Elastic node groups on Azure: what the head's power program (role slurm_power, backend `azure`) needs.

The head gets a user-assigned identity of its own, `clusterbake-<cluster>-head`, besides the
nodes' (the VM has both; the program asks IMDS for this one's token by its client id). The
identity may do exactly what powering nodes up and down takes, through a custom role
`clusterbake-power-<cluster>-<8 hex>` (role names are unique per tenant) whose actions are the
resource provider operations of a NIC and a VM create and delete (ACTIONS), assignable at the
cluster's resource groups and the groups of its subnet and image, and assigned:

- at the compute nodes' resource group (resources.nodes_group_name): their VMs, NICs, OS disks,
  placement groups and availability sets, and nothing else: the head's VM is in azure.resource_group,
  so the power identity cannot rewrite it (security review finding 2);
- at the subnet, the network security group and the application security group a NIC joins
  (`.../join/action`: ARM checks them as linked actions of the NIC);
- at the image, when it is a resource (a managed image or gallery image version).

Giving a VM an identity is a linked action on that identity (`.../userAssignedIdentities/assign/
action`): the head may give the nodes' identity only, through Microsoft's built-in Managed
Identity Operator role assigned at that identity alone, never its own (security review finding
2: a VM it made cannot carry the power role). Only the head's root and SlurmUser reach its token
(roles/cloud_boot's metadata guard).

`cluster down` deletes the assignments (rbac.delete_all), then the role definition (waiting while
Azure still counts the assignments just deleted). A new role's first assignments wait until Azure
knows the role (rbac.while_replicating).

power_vars() is the inventory's `slurm_power_azure` (power.json's `azure`): the ARM endpoint
this controller uses (the twin's too), the head identity's client id, and per elastic group its
sizes in order, the NIC and VM bodies of resources.py (the program fills in the node's address,
name, size and user data), the user data template and each elastic node's planned address.
"""

from __future__ import annotations

import hashlib
import uuid

from clusterbake.providers.azure import rbac
from clusterbake.providers.azure.api import arm_endpoint
from clusterbake.providers.common import resource_name

NAMESPACE = uuid.UUID("9d7f5c1a-2b3e-4f60-8a1d-5e6c7b8a9f01")
# The api-versions of the azure-mgmt-compute 39 and azure-mgmt-network 33 operations the controller creates
# static nodes with: one version for every VM of the cluster, so that defaults that change between versions
# (the security type, review B4/B10) cannot differ between a static node and an elastic one. Raise them with
# the SDK pins (requirements.lock); test_azure_elastic compares them with what the SDK sends.
API_VERSIONS = {"compute": "2026-04-01", "network": "2026-03-01"}
# The resource provider operations of creating and deleting a node's NIC and VM (Microsoft's
# "Azure resource provider operations": Microsoft.Compute, Microsoft.Network, Microsoft.ManagedIdentity).
ACTIONS = [
    "Microsoft.Compute/virtualMachines/read",
    "Microsoft.Compute/virtualMachines/write",
    "Microsoft.Compute/virtualMachines/delete",
    "Microsoft.Compute/virtualMachines/instanceView/read",
    "Microsoft.Compute/disks/read",
    "Microsoft.Compute/disks/delete",
    "Microsoft.Compute/images/read",
    "Microsoft.Compute/galleries/images/versions/read",
    "Microsoft.Compute/proximityPlacementGroups/read",
    "Microsoft.Compute/proximityPlacementGroups/write",
    "Microsoft.Compute/availabilitySets/read",
    "Microsoft.Compute/availabilitySets/write",
    "Microsoft.Compute/locations/operations/read",
    "Microsoft.Network/networkInterfaces/read",
    "Microsoft.Network/networkInterfaces/write",
    "Microsoft.Network/networkInterfaces/delete",
    "Microsoft.Network/networkInterfaces/join/action",
    "Microsoft.Network/networkSecurityGroups/join/action",
    "Microsoft.Network/applicationSecurityGroups/joinIpConfiguration/action",
    "Microsoft.Network/virtualNetworks/subnets/join/action",
    "Microsoft.Network/locations/operations/read",
]


def head_identity_name(cluster: str) -> str:
    return resource_name(cluster, "head")


def _seed(subscription_id: str, resource_group: str, cluster: str) -> str:
    return f"{subscription_id}/{resource_group}/{cluster}".lower()


def role_id(subscription_id: str, resource_group: str, cluster: str) -> str:
    return str(uuid.uuid5(NAMESPACE, _seed(subscription_id, resource_group, cluster) + "/power"))


def role_name(subscription_id: str, resource_group: str, cluster: str) -> str:
    digest = hashlib.sha256(_seed(subscription_id, resource_group, cluster).encode()).hexdigest()[:8]
    return f"clusterbake-power-{cluster}-{digest}"


def group_scope(resource_id: str) -> str:
    """/subscriptions/<s>/resourceGroups/<g> of a resource id."""
    return "/".join(resource_id.split("/")[:5])


def scopes(subscription_id: str, nodes_group: str, joined: list[str], image: str) -> tuple[list[str], list[str]]:
    """(assignable scopes of the role, scopes it is assigned at): the compute nodes' resource group,
    what a NIC joins (`joined`: the subnet and security groups, by resource id) and the image."""
    assigned = [f"/subscriptions/{subscription_id}/resourceGroups/{nodes_group}", *joined]
    if image.startswith("/"):
        assigned.append(image)
    assignable = sorted({group_scope(s).lower(): group_scope(s) for s in assigned}.values())
    return assignable, assigned


def ensure_role(authorization, subscription_id: str, resource_group: str, cluster: str, assignable: list[str]) -> str:
    """The custom role (created, or its actions and scopes put right): its definition id."""
    from azure.core.exceptions import HttpResponseError

    guid = role_id(subscription_id, resource_group, cluster)
    scope = f"/subscriptions/{subscription_id}"
    wanted = {"actions": ACTIONS, "scopes": sorted(s.lower() for s in assignable)}
    try:
        found = authorization.role_definitions.get(scope, guid)
    except HttpResponseError as exc:
        if exc.status_code != 404:
            raise
        found = None
    if found is not None:
        have = {
            "actions": [a for p in found.permissions or [] for a in p.actions or []],
            "scopes": sorted(s.lower() for s in found.assignable_scopes or []),
        }
        if have == wanted:
            return found.id
    definition = authorization.role_definitions.create_or_update(
        scope,
        guid,
        {
            "properties": {
                "roleName": role_name(subscription_id, resource_group, cluster),
                "description": f"clusterbake: the head of cluster {cluster} powers its elastic nodes up and down",
                "type": "CustomRole",
                "permissions": [{"actions": ACTIONS, "notActions": []}],
                "assignableScopes": assignable,
            }
        },
    )
    return definition.id


def ensure_grants(
    authorization, subscription_id: str, principal_id: str, role: str, assigned: list[str], nodes_identity: str
) -> int:
    """The role for the head's identity at each scope (and nowhere else: a grant of an older layout, at the
    whole cluster's group, goes), and Managed Identity Operator at the nodes' identity (the one a VM it
    makes may carry); how many assignments this call made or removed."""
    guid = role.rsplit("/", 1)[-1]
    made = sum(rbac.ensure(authorization, subscription_id, scope, principal_id, guid) for scope in assigned)
    made += rbac.prune(authorization, subscription_id, principal_id, guid, assigned)
    return made + rbac.ensure(authorization, subscription_id, nodes_identity, principal_id, rbac.IDENTITY_OPERATOR)


def delete_role(authorization, subscription_id: str, resource_group: str, cluster: str) -> list[str]:
    from azure.core.exceptions import HttpResponseError

    scope = f"/subscriptions/{subscription_id}"
    guid = role_id(subscription_id, resource_group, cluster)
    name = role_name(subscription_id, resource_group, cluster)
    try:
        authorization.role_definitions.get(scope, guid)
    except HttpResponseError as exc:
        if exc.status_code == 404:
            return []
        raise
    # The assignments were deleted a moment ago (rbac.delete_all): Azure counts them until that replicated.
    rbac.while_replicating(
        lambda: authorization.role_definitions.delete(scope, guid),
        ("RoleDefinitionHasAssignments",),
        f"role definition {name}",
        f"remove the role assignments that still use it (`az role assignment list --role {name} --all`), "
        "then run `clusterbake cluster down` again",
    )
    return [f"role definition {name}"]


def power_vars(*, config, nodes_group: str, head_client_id: str, name_placeholder: str, groups: dict) -> dict:
    """The program creates and deletes VMs and NICs in `nodes_group` (the compute nodes' resource group)."""
    azure = config.azure
    return {
        "arm_endpoint": arm_endpoint(),
        "subscription_id": azure.subscription_id,
        "resource_group": nodes_group,
        "cluster": config.cluster_name,
        "identity_client_id": head_client_id,
        "name_placeholder": name_placeholder,
        "api_versions": API_VERSIONS,
        "groups": groups,
    }
