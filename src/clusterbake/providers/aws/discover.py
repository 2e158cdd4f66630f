"""The cluster's instances, found by tag (paginated), and what the inventory says of each."""

from __future__ import annotations

from clusterbake.progress import say
from clusterbake.providers.aws import tags
from clusterbake.providers.aws.api import paginate
from clusterbake.providers.cloud import Machine, NodeState, RecordFields

PAGE_SIZE = 1000  # DescribeInstances' largest page
LIVE = ("pending", "running", "stopping", "stopped")
NOT_GONE = (*LIVE, "shutting-down")


def cluster_instances(client, cluster: str, states: tuple[str, ...] = LIVE) -> list[dict]:
    filters = [tags.cluster_filter(cluster), {"Name": "instance-state-name", "Values": list(states)}]
    reservations = paginate(client, "describe_instances", "Reservations", Filters=filters, MaxResults=PAGE_SIZE)
    return [instance for reservation in reservations for instance in reservation["Instances"]]


def name_of(instance: dict) -> str | None:
    return tags.as_dict(instance.get("Tags")).get(tags.NAME)


def by_name(instances: list[dict], warn: bool = True) -> dict[str, dict]:
    """Instances by their clusterbake:name tag; of two with one name the older wins (said when `warn`).
    An instance of the cluster without the tag is no node of it: skipped, always said."""
    named: dict[str, dict] = {}
    for instance in sorted(instances, key=lambda i: (str(i.get("LaunchTime", "")), i["InstanceId"])):
        name = name_of(instance)
        if name is None:
            cluster = tags.as_dict(instance.get("Tags")).get(tags.CLUSTER, "?")
            say(
                f"    warning: {instance['InstanceId']} is tagged {tags.CLUSTER}={cluster} but has no {tags.NAME} "
                f"tag: skipped, it is no node of the cluster (tag it with a planned node's name, or terminate it)"
            )
            continue
        if name in named:
            if warn:
                say(
                    f"    warning: {instance['InstanceId']} and {named[name]['InstanceId']} are both named {name}; "
                    f"using {named[name]['InstanceId']}"
                )
            continue
        named[name] = instance
    return named


def host_vars(instance: dict) -> dict:
    """Hostvars from EC2 (besides the shared ones of inventory.build_inventory)."""
    placement = instance.get("Placement", {})
    return {
        "clusterbake_instance_id": instance["InstanceId"],
        "clusterbake_instance_type": instance["InstanceType"],
        "clusterbake_availability_zone": placement.get("AvailabilityZone"),
        "clusterbake_placement_group": placement.get("GroupName") or None,
    }


INSTANCE_STATES = {
    "pending": NodeState.PENDING,
    "running": NodeState.RUNNING,
    "stopping": NodeState.STOPPING,
    "stopped": NodeState.STOPPED,
    "shutting-down": NodeState.STOPPING,
}

# Where an EC2 instance (DescribeInstances) keeps what a Machine holds.
INSTANCE_FIELDS = RecordFields(
    id="InstanceId",
    label="InstanceId",
    address="PrivateIpAddress",
    size="InstanceType",
    state=lambda instance: instance["State"]["Name"],
    states=INSTANCE_STATES,
    image="ImageId",
)


def machines_of(instances: dict[str, dict]) -> dict[str, Machine]:
    """Instances by node name as the cloud providers' machine records."""
    return INSTANCE_FIELDS.machines(instances)


TOPOLOGY_BATCH = 100  # DescribeInstanceTopology's most InstanceIds per call
# The instance types EC2 gives a topology for (the EC2 User Guide, "Amazon EC2 instance topology",
# prerequisites): 3 network nodes, 4 for p6-b200 and p6-b300. "x." is the family's every size.
THREE_LEVELS = (
    "g6e.", "g7e.", "hpc6a.48xlarge", "hpc6id.32xlarge", "hpc7g.", "hpc7a.", "hpc8a.96xlarge", "p3dn.24xlarge",
    "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "p6e-gb200.36xlarge",
    "trn1.", "trn1n.32xlarge", "trn2.48xlarge", "trn2u.48xlarge",
)  # fmt: skip
FOUR_LEVELS = ("p6-b200.48xlarge", "p6-b300.48xlarge")


def topology_levels(instance_type: str) -> int:
    """How many network nodes EC2 returns for an instance of the type; 0: it gives the type no topology."""
    if instance_type in FOUR_LEVELS:
        return 4
    listed = (instance_type == t or (t.endswith(".") and instance_type.startswith(t)) for t in THREE_LEVELS)
    return 3 if any(listed) else 0


def network_paths(client, named: dict[str, dict], nodes: list[str]) -> dict[str, list[str]]:
    """Where each running node of `nodes` hangs (DescribeInstanceTopology's NetworkNodes, top first). EC2
    answers for the instance types it documents (p4d, p5, trn1, hpc7a ...) and leaves others out."""
    ids = {named[n]["InstanceId"]: n for n in nodes if n in named and named[n]["State"]["Name"] == "running"}
    batches = [list(ids)[start : start + TOPOLOGY_BATCH] for start in range(0, len(ids), TOPOLOGY_BATCH)]
    found = [
        i for batch in batches for i in paginate(client, "describe_instance_topology", "Instances", InstanceIds=batch)
    ]
    return {ids[i["InstanceId"]]: list(i["NetworkNodes"]) for i in found if i["InstanceId"] in ids}
