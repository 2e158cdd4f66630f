"""Cluster placement groups: the only EC2 calls here that moto 5.2.5 does not implement.

Each function takes the EC2 client, so tests can hand it a botocore Stubber'd
client (tests/aws/test_placement.py checks the exact requests against botocore's
EC2 model).
"""

from __future__ import annotations

from clusterbake.errors import ClusterbakeError
from clusterbake.providers.aws import tags
from clusterbake.providers.aws.api import THROTTLING, call

# EC2 refuses to delete a group while instances that are still shutting down are in it.
IN_USE = frozenset({"InvalidPlacementGroup.InUse"})


def ensure(client, name: str, cluster: str) -> bool:
    """Create the cluster placement group `name` unless it exists; True when created."""
    found = call(client.describe_placement_groups, Filters=[{"Name": "group-name", "Values": [name]}])
    for group in found.get("PlacementGroups", []):
        owner = tags.as_dict(group.get("Tags")).get(tags.CLUSTER)
        if owner != cluster:
            raise ClusterbakeError(
                f"placement group {name} exists but is not tagged {tags.CLUSTER}={cluster}; "
                "rename the cluster or delete that group"
            )
        if group.get("Strategy") != "cluster":
            raise ClusterbakeError(f"placement group {name} has strategy {group.get('Strategy')}, not cluster")
        return False
    call(
        client.create_placement_group,
        GroupName=name,
        Strategy="cluster",
        TagSpecifications=[tags.spec("placement-group", {tags.CLUSTER: cluster})],
    )
    return True


def find(client, cluster: str) -> list[str]:
    """Names of the placement groups tagged for `cluster`."""
    found = call(client.describe_placement_groups, Filters=[tags.cluster_filter(cluster)])
    return sorted(group["GroupName"] for group in found.get("PlacementGroups", []))


def delete(client, name: str) -> None:
    call(client.delete_placement_group, GroupName=name, retry_codes=THROTTLING | IN_USE, attempts=12)
