"""EC2's Filters for the resources the twin keeps itself (placement groups, capacity reservations)."""

from __future__ import annotations


def matches(resource: dict, filters: dict[str, list[str]], fields: dict[str, str]) -> bool:
    """Whether `resource` (EC2's shape, with Tags) passes every filter: each of `fields` (filter name ->
    the resource's key) and tag:KEY; filters the resource has no field for are ignored, as moto does."""
    tags = {t["Key"]: t["Value"] for t in resource.get("Tags", [])}
    for name, values in filters.items():
        if name in fields and resource.get(fields[name]) not in values:
            return False
        if name.startswith("tag:") and tags.get(name[4:]) not in values:
            return False
    return True
