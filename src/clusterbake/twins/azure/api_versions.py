"""Which api-versions the twin's resource providers answer, per resource type (review D3, B3).

ARM routes a request by resource type and api-version; a version the type's provider does not
register is refused with 400 NoRegisteredProviderFound, naming the supported versions (the shape
of a real refusal: flatcar/mantle#520, "No registered resource provider found for location
'westus' and API version '2022-08-01' for type 'galleries'. The supported api-versions are ...").
Microsoft.Compute registers three families: virtual machines and most compute types with
`-01` dates, disks and snapshots (the disk resource provider) with `-02` and galleries (the
gallery resource provider) with `-03`, so one hard-coded version cannot serve them all.

The lists are the stable versions of the azure-rest-api-specs folders of each family that the twin
knows (the azure-mgmt-compute 39 SDK's own are the newest of each); a preview version, or a type
outside these families, is accepted as any date (lenient: listed in docs/twin.md).
"""

from __future__ import annotations

from clusterbake.twins.azure.resource import CANONICAL_TYPES, ArmError

COMPUTE = [
    "2017-03-30",
    "2017-12-01",
    "2018-04-01",
    "2018-06-01",
    "2018-10-01",
    "2019-03-01",
    "2019-07-01",
    "2019-12-01",
    "2020-06-01",
    "2020-12-01",
    "2021-03-01",
    "2021-04-01",
    "2021-07-01",
    "2021-11-01",
    "2022-03-01",
    "2022-08-01",
    "2022-11-01",
    "2023-03-01",
    "2023-07-01",
    "2023-09-01",
    "2024-03-01",
    "2024-07-01",
    "2024-11-01",
    "2025-04-01",
    "2025-11-01",
    "2026-04-01",
]
DISKS = [
    "2017-03-30",
    "2018-04-01",
    "2018-06-01",
    "2018-09-30",
    "2019-03-01",
    "2019-07-01",
    "2019-11-01",
    "2020-05-01",
    "2020-06-30",
    "2020-09-30",
    "2020-12-01",
    "2021-04-01",
    "2021-08-01",
    "2021-12-01",
    "2022-03-02",
    "2022-07-02",
    "2023-01-02",
    "2023-04-02",
    "2023-10-02",
    "2024-03-02",
    "2025-01-02",
    "2026-03-02",
]
GALLERIES = [
    "2018-06-01",
    "2019-03-01",
    "2019-07-01",
    "2019-12-01",
    "2020-09-30",
    "2021-07-01",
    "2021-10-01",
    "2022-01-03",
    "2022-03-03",
    "2022-08-03",
    "2023-07-03",
    "2024-03-03",
    "2025-03-03",
    "2026-03-03",
]
UNCHECKED = ["2024-03-01"]
# Resource type (lower case; a type and its children) -> its provider's versions. The longest
# matching prefix wins.
FAMILIES: dict[str, list[str]] = {
    "microsoft.compute/virtualmachines": COMPUTE,
    "microsoft.compute/virtualmachinescalesets": COMPUTE,
    "microsoft.compute/availabilitysets": COMPUTE,
    "microsoft.compute/proximityplacementgroups": COMPUTE,
    "microsoft.compute/images": COMPUTE,
    "microsoft.compute/disks": DISKS,
    "microsoft.compute/snapshots": DISKS,
    "microsoft.compute/galleries": GALLERIES,
}


def supported(type_key: str) -> list[str] | None:
    """The versions registered for a resource type (`namespace/type[/child...]`), None: not checked."""
    key = type_key.lower()
    best = max((prefix for prefix in FAMILIES if key == prefix or key.startswith(prefix + "/")), key=len, default=None)
    return FAMILIES[best] if best else None


def check(type_key: str, version: str, location: str) -> None:
    """Refuse `version` for the type as ARM does: 400 NoRegisteredProviderFound."""
    versions = supported(type_key)
    if versions is None or version in versions or version.endswith("-preview"):
        return
    type_name = type_key.split("/", 1)[1] if "/" in type_key else type_key
    raise ArmError(
        400,
        "NoRegisteredProviderFound",
        f"No registered resource provider found for location '{location}' and API version '{version}' for type "
        f"'{type_name}'. The supported api-versions are '{', '.join(versions)}'. The supported locations are "
        "'eastus, westeurope'.",
    )


def provider(namespace: str, locations: list[str]) -> dict:
    """GET /subscriptions/{s}/providers/{namespace}: the resource types the twin checks, with their versions."""
    prefix = namespace.lower() + "/"
    types = [
        {
            "resourceType": name.split("/", 1)[1],
            "locations": locations,
            # newest first, as ARM lists them; a type the twin does not check: the version it answers with
            "apiVersions": list(reversed(supported(key) or UNCHECKED)),
        }
        for key, name in CANONICAL_TYPES.items()
        if key.startswith(prefix)
    ]
    return {
        "id": f"/providers/{namespace}",
        "namespace": namespace,
        "registrationState": "Registered",
        "resourceTypes": types,
    }
