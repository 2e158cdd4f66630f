"""EC2 operations the head's botocore may not know, as a botocore "sdk-extras" file.

The head's power program uses the distribution's python3-botocore: Debian 12 has 1.29 and Ubuntu
22.04 1.23, both older than DescribeInstanceTopology (botocore 1.33, November 2023); their client
has no `describe_instance_topology` (found on the EC2 twin's elastic cluster). botocore's loader
merges `<service>/<api-version>/service-2.sdk-extras.json` found on its search path into the
service's model, so role slurm_power ships that file with the operation and the shapes it uses,
taken from the controller's pinned botocore (the vendor's model, documentation left out) and
renamed with a prefix so that they cannot clash with an older model's shapes (shape names are not
on the wire; member and location names are). tests/aws/test_botocore_extras.py keeps the
shipped file equal to this function's output and drives an old model with it.
"""

from __future__ import annotations

from typing import Any

OPERATIONS = ("DescribeInstanceTopology",)
PREFIX = "Clusterbake"
SERVICE, API_VERSION = "ec2", "2016-11-15"


def _renamed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (PREFIX + v if k == "shape" else _renamed(v)) for k, v in value.items() if k != "documentation"}
    if isinstance(value, list):
        return [_renamed(v) for v in value]
    return value


def sdk_extras(model: dict) -> dict:
    """The extras file for OPERATIONS of the EC2 service model `model` (botocore's service-2)."""
    shapes: dict[str, dict] = {}

    def take(name: str) -> None:
        if name in shapes:
            return
        shape = shapes[name] = model["shapes"][name]
        for member in shape.get("members", {}).values():
            take(member["shape"])
        for key in ("member", "key", "value"):
            if key in shape:
                take(shape[key]["shape"])

    operations = {}
    for name in OPERATIONS:
        operation = model["operations"][name]
        for part in ("input", "output"):
            if part in operation:
                take(operation[part]["shape"])
        operations[name] = _renamed(operation)
    return {
        "version": 1.0,
        "merge": {"operations": operations, "shapes": {PREFIX + n: _renamed(s) for n, s in sorted(shapes.items())}},
    }
