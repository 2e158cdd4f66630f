"""DescribeInstanceTopology in the EC2 twin, which moto 5.2.5 does not implement.

As the EC2 User Guide's "Amazon EC2 instance topology" describes it: for each running
instance of a supported type (the prerequisites' list; 4 network nodes for p6-b200 and
p6-b300, 3 for the others), its NetworkNodes from the top of the zone's network down to the
node it hangs on; instances of other types, and instances not running, are left out of the
answer without an error. InstanceIds (at most 100), Filters instance-type and
availability-zone, MaxResults (5 to 100; not with InstanceIds) and NextToken.

Where instances hang is the twin's declared layout: the file $MOTO_TOPOLOGY_FILE
({"per_leaf": 4, "leaves_per_spine": 2}; default 16 and 4; "stand_in_types": small types answered
as a p5 is, for tests whose nodes are containers, see levels()) deals a zone's supported instances, in
the order the twin first saw them running, onto leaves of `per_leaf`, spines of
`leaves_per_spine` leaves, one top per zone. A real zone's layout is EC2's own: this one is for
tests (whether nodes land under one leaf), not a model of AWS's network.
"""

from __future__ import annotations

import json
import os

from moto.core.responses import ActionResult
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.responses import EC2Response

from clusterbake.providers.aws.discover import topology_levels
from clusterbake.twins.aws.filters import matches

DEFAULT_LAYOUT = {"per_leaf": 16, "leaves_per_spine": 4}
# (account, region) -> zone -> instance ids in the order they were first seen running.
_SEEN: dict[tuple[str, str], dict[str, list[str]]] = {}


def levels(instance_type: str, declared: dict) -> int:
    """How many network nodes the twin returns for the type (EC2's documented types; 0: no topology),
    and 3 for the layout's `stand_in_types`: small types a test's nodes can be (a container has this
    machine's 2 CPUs, not a p5's 192) answered as EC2 answers for a p5. EC2 itself answers for none
    of them."""
    return topology_levels(instance_type) or (3 if instance_type in declared.get("stand_in_types", ()) else 0)


def layout() -> dict:
    path = os.environ.get("MOTO_TOPOLOGY_FILE")
    if path and os.path.exists(path):
        with open(path) as f:
            return DEFAULT_LAYOUT | json.load(f)
    return DEFAULT_LAYOUT


def network_nodes(zone: str, index: int, depth: int, declared: dict) -> list[str]:
    leaf = index // declared["per_leaf"]
    spine = leaf // declared["leaves_per_spine"]
    path = [f"nn-{zone}-top", f"nn-{zone}-spine-{spine}", f"nn-{zone}-leaf-{leaf}"]
    if depth == 4:  # one more level below the leaf (the NVLink domain's switch on p6-b200)
        path.append(f"nn-{zone}-leaf-{leaf}-{index % declared['per_leaf'] // 2}")
    return path


def describe_instance_topology(self: EC2Response) -> ActionResult:
    ids = self._get_param("InstanceIds", []) or []
    max_results = self._get_param("MaxResults")
    if ids and max_results:
        raise EC2ClientError("InvalidParameterCombination", "MaxResults cannot be used with InstanceIds.")
    if len(ids) > 100:
        raise EC2ClientError("InvalidParameterValue", "InstanceIds: at most 100 instance IDs.")
    if max_results is not None and not 5 <= int(max_results) <= 100:
        raise EC2ClientError("InvalidParameterValue", "MaxResults must be between 5 and 100.")
    filters = self._filters_from_querystring()
    seen = _SEEN.setdefault((self.current_account, self.region), {})
    declared = layout()
    running = sorted(
        (
            i
            for i in self.ec2_backend.all_instances()
            if i._state.name == "running" and levels(i.instance_type, declared)
        ),
        key=lambda i: (str(i.launch_time), i.id),
    )
    zone_ids = {z.name: z.zone_id for z in self.ec2_backend.describe_availability_zones()}
    answer = []
    for instance in running:
        zone = instance.placement.zone
        order = seen.setdefault(zone, [])
        if instance.id not in order:
            order.append(instance.id)
        entry = {
            "InstanceId": instance.id,
            "InstanceType": instance.instance_type,
            "NetworkNodes": network_nodes(
                zone, order.index(instance.id), levels(instance.instance_type, declared), declared
            ),
            "AvailabilityZone": zone,
            "ZoneId": zone_ids.get(zone, ""),
        }
        if instance.placement.group_name:
            entry["GroupName"] = instance.placement.group_name
        if ids and instance.id not in ids:
            continue
        if matches(entry, filters, {"instance-type": "InstanceType", "availability-zone": "AvailabilityZone"}):
            answer.append(entry)
    start = int(self._get_param("NextToken") or 0)
    size = int(max_results or 100) if not ids else len(answer) or 1
    page = answer[start : start + size]
    result = {"Instances": page}
    if start + size < len(answer):
        result["NextToken"] = str(start + size)
    return ActionResult(result)


ACTIONS = {"describe_instance_topology": describe_instance_topology}
