"""The tags that mark what clusterbake created on Azure: everything it finds, it finds by these.

Azure tag names may not hold `<>%&\\?/`, so they are dashed (AWS's are `clusterbake:...`).
"""

from __future__ import annotations

CLUSTER = "clusterbake-cluster"
ROLE = "clusterbake-role"
NODEGROUP = "clusterbake-nodegroup"
NAME = "clusterbake-name"
# On a resource group clusterbake created (and so may delete when it is empty of anything else).
CREATED_GROUP = "clusterbake-created"
# On storage a storage entry says to keep (`retain`): `cluster down` leaves it.
RETAIN = "clusterbake-retain"


def cluster_tags(cluster: str) -> dict[str, str]:
    return {CLUSTER: cluster}


def node_tags(cluster: str, role: str, nodegroup: str, name: str | None = None) -> dict[str, str]:
    tags = {CLUSTER: cluster, ROLE: role, NODEGROUP: nodegroup}
    if name:
        tags[NAME] = name
    return tags


def tag_filter(cluster: str) -> str:
    """The $filter of a resource list for the cluster's resources."""
    return f"tagName eq '{CLUSTER}' and tagValue eq '{cluster}'"


def retained(resource) -> bool:
    return (getattr(resource, "tags", None) or {}).get(RETAIN) == "true"
