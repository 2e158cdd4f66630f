"""moto_server with the two EC2 behaviours these tests need and moto 5.2.5 lacks.

Run as `python tests/aws/moto_ec2_server.py -H 127.0.0.1 -p PORT` (same options as
`moto_server`). Everything is moto's own server and EC2 backend, except:

- Placement groups: moto 5.2.5 answers CreatePlacementGroup, DescribePlacementGroups
  and DeletePlacementGroup with "action has not been implemented" (HTTP 500). This
  adds a minimal in-memory version (name, strategy, state, tags; filters group-name
  and tag:KEY) so that `clusterbake cluster up/down` can run end to end against the
  server. Its request and response shapes go through botocore's real EC2 model (moto
  parses the query and serializes the result from it); the exact calls clusterbake
  makes are also checked against that model with botocore's Stubber
  (tests/aws/test_placement.py).
- Capacity: real EC2 fails RunInstances with InsufficientInstanceCapacity when an
  Availability Zone has no capacity left for a type; moto never does. When the file
  named by $MOTO_CAPACITY_FILE exists ({"p5.48xlarge": 1}), RunInstances fails with
  that error once the number of non-terminated instances of the type would exceed
  the limit. No file: moto's behaviour.
"""

from __future__ import annotations

import json
import os
import sys
import uuid

from moto.core.responses import ActionResult, EmptyResult
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.responses import EC2Response
from moto.server import main

_PLACEMENT_GROUPS: dict[tuple[str, str], dict[str, dict]] = {}


def _groups(response: EC2Response) -> dict[str, dict]:
    return _PLACEMENT_GROUPS.setdefault((response.current_account, response.region), {})


def create_placement_group(self: EC2Response) -> ActionResult:
    name = self._get_param("GroupName")
    groups = _groups(self)
    if name in groups:
        raise EC2ClientError("InvalidPlacementGroup.Duplicate", f"The placement group '{name}' already exists.")
    tags = self._parse_tag_specification().get("placement-group", {})
    group = {
        "GroupName": name,
        "GroupId": f"pg-{uuid.uuid4().hex[:17]}",
        "Strategy": self._get_param("Strategy") or "cluster",
        "State": "available",
        "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
    }
    groups[name] = group
    return ActionResult({"PlacementGroup": group})


def describe_placement_groups(self: EC2Response) -> ActionResult:
    names = self._get_param("GroupNames", [])
    filters = self._filters_from_querystring()
    found = []
    for group in _groups(self).values():
        tags = {t["Key"]: t["Value"] for t in group["Tags"]}
        if names and group["GroupName"] not in names:
            continue
        if "group-name" in filters and group["GroupName"] not in filters["group-name"]:
            continue
        if any(key.startswith("tag:") and tags.get(key[4:]) not in values for key, values in filters.items()):
            continue
        found.append(group)
    missing = set(names) - {g["GroupName"] for g in found}
    if missing:
        raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{min(missing)}' is unknown.")
    return ActionResult({"PlacementGroups": found})


def delete_placement_group(self: EC2Response) -> ActionResult:
    name = self._get_param("GroupName")
    if _groups(self).pop(name, None) is None:
        raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
    return EmptyResult()


_run_instances = EC2Response.run_instances


def run_instances(self: EC2Response) -> ActionResult:
    path = os.environ.get("MOTO_CAPACITY_FILE")
    if path and os.path.exists(path):
        with open(path) as handle:
            limits = json.load(handle)
        instance_type = self._get_param("InstanceType")
        template = self._get_param("LaunchTemplate", {})
        if not instance_type and template:
            instance_type = self.ec2_backend._get_template_from_args(template).data.get("InstanceType")
        if instance_type in limits:
            count = int(self._get_param("MinCount", if_none="1"))
            used = sum(
                1
                for reservation in self.ec2_backend.all_reservations()
                for instance in reservation.instances
                if instance.instance_type == instance_type and instance.state != "terminated"
            )
            if used + count > limits[instance_type]:
                raise EC2ClientError(
                    "InsufficientInstanceCapacity",
                    f"We currently do not have sufficient {instance_type} capacity in the Availability Zone "
                    "you requested. Our system will be working on provisioning additional capacity.",
                )
    return _run_instances(self)


EC2Response.create_placement_group = create_placement_group
EC2Response.describe_placement_groups = describe_placement_groups
EC2Response.delete_placement_group = delete_placement_group
EC2Response.run_instances = run_instances

if __name__ == "__main__":
    sys.exit(main())
