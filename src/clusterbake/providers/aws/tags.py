"""The tags that mark what clusterbake created: everything it finds, it finds by these."""

from __future__ import annotations

CLUSTER = "clusterbake:cluster"
ROLE = "clusterbake:role"
NODEGROUP = "clusterbake:nodegroup"
NAME = "clusterbake:name"


def as_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": key, "Value": value} for key, value in tags.items()]


def as_dict(tags: list[dict[str, str]] | None) -> dict[str, str]:
    return {tag["Key"]: tag["Value"] for tag in tags or []}


def cluster_filter(cluster: str) -> dict:
    return {"Name": f"tag:{CLUSTER}", "Values": [cluster]}


def spec(resource_type: str, tags: dict[str, str]) -> dict:
    return {"ResourceType": resource_type, "Tags": as_list(tags)}


def node_tags(cluster: str, role: str, nodegroup: str, name: str | None = None) -> dict[str, str]:
    """A node's tags; with `name` also its clusterbake:name and the console's Name."""
    tags = {CLUSTER: cluster, ROLE: role, NODEGROUP: nodegroup}
    if name:
        tags |= {NAME: name, "Name": f"{cluster}-{name}"}
    return tags
