"""Config checks that need EC2 (read-only calls): run before anything is created.

Each failure is a ConfigError (exit status 2) that names the config field.
"""

from __future__ import annotations

from botocore.exceptions import ClientError

from clusterbake.config import ClusterConfig
from clusterbake.errors import ConfigError
from clusterbake.progress import say
from clusterbake.providers.aws.api import call, error_code, paginate
from clusterbake.providers.aws.catalogue import Catalogue, InstanceTypeInfo
from clusterbake.providers.common import check_fallback_types, instance_type_fields


def subnet_zone(client, config: ClusterConfig) -> str:
    """The Availability Zone of aws.subnet_id, which must be in aws.vpc_id."""
    return describe_subnet(client, config)["AvailabilityZone"]


def describe_subnet(client, config: ClusterConfig) -> dict:
    """aws.subnet_id as DescribeSubnets has it (zone, CIDR block); it must be in aws.vpc_id."""
    aws = config.aws
    try:
        subnets = call(client.describe_subnets, SubnetIds=[aws.subnet_id])["Subnets"]
    except ClientError as exc:
        if error_code(exc).startswith("InvalidSubnetID"):
            raise ConfigError(f"aws.subnet_id: {aws.subnet_id} does not exist in {aws.region}") from None
        raise
    subnet = subnets[0]
    if subnet["VpcId"] != aws.vpc_id:
        raise ConfigError(f"aws.subnet_id: {aws.subnet_id} is in {subnet['VpcId']}, not in aws.vpc_id {aws.vpc_id}")
    return subnet


def offered(client, location_type: str, location: str, types: list[str]) -> set[str]:
    offerings = paginate(
        client,
        "describe_instance_type_offerings",
        "InstanceTypeOfferings",
        LocationType=location_type,
        Filters=[
            {"Name": "location", "Values": [location]},
            {"Name": "instance-type", "Values": sorted(set(types))},
        ],
    )
    return {o["InstanceType"] for o in offerings}


def check_instance_types(client, config: ClusterConfig, catalogue: Catalogue, zone: str) -> dict[str, InstanceTypeInfo]:
    aws = config.aws
    fields = instance_type_fields(config)
    types = [t for _, t in fields]
    in_region = offered(client, "region", aws.region, types)
    for field, value in fields:
        if value not in in_region:
            raise ConfigError(f"{field}: {value} is not an instance type offered in {aws.region}")
    in_zone = offered(client, "availability-zone", zone, types)
    for field, value in fields:
        if value not in in_zone:
            raise ConfigError(f"{field}: {value} is not offered in {zone} (subnet {aws.subnet_id})")
    infos = catalogue.get(types)
    for index, group in enumerate(config.node_groups):
        field = f"node_groups.{index}"
        for info in (infos[t] for t in group.types):
            if group.efa and not info.efa_supported:
                raise ConfigError(
                    f"{field}.efa: {info.name} has no EFA support; set efa: false or pick an EFA type "
                    "(p5.48xlarge, p4d.24xlarge, ...)"
                )
            if group.spot and info.usage_classes and "spot" not in info.usage_classes:
                raise ConfigError(f"{field}.spot: {info.name} is not sold as spot; set spot: false")
            if group.wants_placement_group and info.placement_strategies and "cluster" not in info.placement_strategies:
                raise ConfigError(
                    f"{field}.placement_group: {info.name} cannot run in a cluster placement group; "
                    "set placement_group: false"
                )
        check_fallback_types(field, [infos[t] for t in group.types])
        if group.wants_placement_group and len(group.types) > 1:
            # EC2 User Guide, "Placement strategies": more than one type in a cluster placement group
            # makes insufficient capacity errors likelier (realcloud review A12).
            say(
                f"    warning: {field}: fallback instance types in one cluster placement group; EC2 advises one "
                "type per group (a fallback type may then find no capacity beside the others)"
            )
    return infos


def check_existing_placement_groups(client, config: ClusterConfig) -> None:
    """Each placement group a node group names exists and is a cluster placement group (read-only)."""
    for index, group in enumerate(config.node_groups):
        name = group.existing_placement_group
        if not name:
            continue
        found = call(client.describe_placement_groups, Filters=[{"Name": "group-name", "Values": [name]}])
        groups = found.get("PlacementGroups", [])
        field = f"node_groups.{index}.placement_group"
        if not groups:
            raise ConfigError(f"{field}: no placement group named {name} in {config.aws.region}")
        if groups[0].get("Strategy") != "cluster":
            raise ConfigError(f"{field}: {name} has strategy {groups[0].get('Strategy')}; name a cluster one")


def check_key_pair(client, config: ClusterConfig) -> None:
    aws = config.aws
    if not aws.key_name:
        return
    try:
        call(client.describe_key_pairs, KeyNames=[aws.key_name])
    except ClientError as exc:
        if error_code(exc).startswith("InvalidKeyPair"):
            raise ConfigError(f"aws.key_name: no key pair named {aws.key_name} in {aws.region}") from None
        raise


def check_checkpoint_bucket(s3, config: ClusterConfig) -> None:
    """checkpoints.copy_to's bucket exists and is reachable (HeadBucket: read-only)."""
    copy_to = config.checkpoints.copy_to or ""
    if not copy_to.startswith("s3://"):
        return
    bucket = copy_to.removeprefix("s3://").split("/", 1)[0]
    try:
        call(s3.head_bucket, Bucket=bucket)
    except ClientError as exc:
        code = error_code(exc)
        what = "does not exist" if code in ("404", "NoSuchBucket") else f"cannot be reached ({code})"
        raise ConfigError(
            f"checkpoints.copy_to: bucket {bucket} {what}; create it (clusterbake does not create buckets) or "
            "name another"
        ) from None


def check_image(client, config: ClusterConfig, ami_id: str, infos: dict[str, InstanceTypeInfo], source: str) -> None:
    """The AMI exists in the region and runs on every instance type's architecture."""
    try:
        images = call(client.describe_images, ImageIds=[ami_id])["Images"]
    except ClientError as exc:
        if not error_code(exc).startswith("InvalidAMIID"):
            raise
        images = []
    if not images:
        raise ConfigError(f"{source}: {ami_id} does not exist in {config.aws.region} (or is not shared with you)")
    architecture = images[0].get("Architecture")
    for field, value in instance_type_fields(config):
        archs = infos[value].architectures
        if architecture and archs and architecture not in archs:
            raise ConfigError(f"{field}: {value} runs {'/'.join(archs)}, but {ami_id} is {architecture}")


# EC2 starts terminating a Capacity Block's instances this long before the block ends (User Guide,
# "Monitor Capacity Blocks using EventBridge": the warning 40 minutes before says "in 10 minutes").
CAPACITY_BLOCK_END_NOTICE = 30 * 60


def describe_reservations(client, config: ClusterConfig) -> dict[str, dict]:
    """Each group's capacity reservation as DescribeCapacityReservations has it (group name -> reservation);
    one EC2 does not know is left out."""
    found: dict[str, dict] = {}
    for group in config.node_groups:
        if not group.capacity_reservation_id:
            continue
        try:
            answer = call(client.describe_capacity_reservations, CapacityReservationIds=[group.capacity_reservation_id])
        except ClientError as exc:
            if error_code(exc).startswith("InvalidCapacityReservationId"):
                continue
            raise
        found[group.name] = answer["CapacityReservations"][0]
    return found


def check_capacity_reservations(client, config: ClusterConfig, zone: str) -> dict[str, dict]:
    """describe_reservations, refused where EC2 would refuse the group's launches (User Guide, "Launch
    instances into an existing Capacity Reservation": matching type and zone, room, active; "Launch
    instances using Capacity Blocks")."""
    found = describe_reservations(client, config)
    for index, group in enumerate(config.node_groups):
        if not group.capacity_reservation_id:
            continue
        field = f"node_groups.{index}.capacity_reservation_id"
        if group.name not in found:
            raise ConfigError(
                f"{field}: no capacity reservation {group.capacity_reservation_id} in {config.aws.region}"
            )
        _check_reservation(field, group, found[group.name], zone)
    return found


def _check_reservation(field: str, group, reservation: dict, zone: str) -> None:
    reservation_id = reservation["CapacityReservationId"]
    block = reservation.get("ReservationType") == "capacity-block"
    state = reservation.get("State")
    if state == "scheduled":
        raise ConfigError(
            f"{field}: {reservation_id} starts at {reservation.get('StartDate')}; its instances cannot launch before "
            "then: run `cluster up` once it is active"
        )
    if state != "active":
        raise ConfigError(f"{field}: {reservation_id} is {state}; name an active reservation")
    if reservation.get("InstanceType") != group.instance_type:
        raise ConfigError(
            f"{field}: {reservation_id} holds {reservation.get('InstanceType')}, not the group's {group.instance_type}"
        )
    if reservation.get("AvailabilityZone") != zone:
        raise ConfigError(
            f"{field}: {reservation_id} is in {reservation.get('AvailabilityZone')}, but aws.subnet_id is in {zone}; "
            "use a subnet in the reservation's zone"
        )
    if group.max_nodes > reservation.get("TotalInstanceCount", 0):
        raise ConfigError(
            f"{field}: {reservation_id} holds {reservation.get('TotalInstanceCount')} instances; the group has "
            f"{group.max_nodes} nodes"
        )
    reserved_group = (reservation.get("PlacementGroupArn") or "").rpartition("placement-group/")[2] or None
    placement_field = field.replace("capacity_reservation_id", "placement_group")
    if block:
        if group.elastic:
            raise ConfigError(
                f"{field}: {reservation_id} is a Capacity Block, paid for the whole block: give the group a count "
                "(static nodes), not min_count/max_count"
            )
        if group.wants_placement_group:
            raise ConfigError(
                f"{placement_field}: EC2 places a Capacity Block's instances itself (UltraClusters); set "
                "placement_group: false"
            )
    elif reserved_group and group.existing_placement_group != reserved_group:
        raise ConfigError(
            f"{placement_field}: {reservation_id} is in placement group {reserved_group}; instances outside it do not "
            f"match the reservation: set placement_group: {reserved_group}"
        )
    elif not reserved_group and group.wants_placement_group:
        raise ConfigError(
            f"{placement_field}: {reservation_id} is in no placement group, and instances in one do not match it: set "
            "placement_group: false"
        )


# A default route through one of these reaches AWS's public endpoints from a private address.
PRIVATE_EGRESS = ("NatGatewayId", "TransitGatewayId", "NetworkInterfaceId", "InstanceId", "VpcPeeringConnectionId")


def _route_table(client, subnet: dict) -> dict | None:
    """The subnet's route table: its own association, else the VPC's main table."""
    for filters in (
        [{"Name": "association.subnet-id", "Values": [subnet["SubnetId"]]}],
        [{"Name": "vpc-id", "Values": [subnet["VpcId"]]}, {"Name": "association.main", "Values": ["true"]}],
    ):
        tables = call(client.describe_route_tables, Filters=filters)["RouteTables"]
        if tables:
            return tables[0]
    return None


def check_secret_store_reachable(client, config: ClusterConfig, subnet: dict) -> None:
    """Nodes read their join bundle from Secrets Manager at boot: the subnet needs a way there (realcloud
    review C4), or they never join. Read-only: the subnet's default route (a NAT gateway or the like; an
    internet gateway only for addresses a public IP goes with), else a secretsmanager interface endpoint
    with private DNS in the VPC."""
    region, subnet_id = config.aws.region, subnet["SubnetId"]
    table = _route_table(client, subnet) or {}
    default = next(
        (
            r
            for r in table.get("Routes", [])
            if r.get("DestinationCidrBlock") == "0.0.0.0/0" and r.get("State") != "blackhole"
        ),
        {},
    )
    if any(default.get(key) for key in PRIVATE_EGRESS):
        return
    endpoints = call(
        client.describe_vpc_endpoints,
        Filters=[
            {"Name": "vpc-id", "Values": [subnet["VpcId"]]},
            {"Name": "service-name", "Values": [f"com.amazonaws.{region}.secretsmanager"]},
        ],
    )["VpcEndpoints"]
    if any(e.get("PrivateDnsEnabled") and e.get("State", "available").lower() == "available" for e in endpoints):
        return
    multi_interface = [g.name for g in config.node_groups if g.efa]
    if str(default.get("GatewayId", "")).startswith("igw-") and subnet.get("MapPublicIpOnLaunch"):
        if not multi_interface:
            return
        raise ConfigError(
            f"aws.subnet_id: {subnet_id} reaches the internet through {default['GatewayId']} only, and EFA groups "
            f"({', '.join(multi_interface)}) have several interfaces, which get no public address: their nodes could "
            f"not reach Secrets Manager to join. Use a private subnet with a NAT gateway route, or add an interface "
            f"endpoint com.amazonaws.{region}.secretsmanager with private DNS to {subnet['VpcId']}"
        )
    raise ConfigError(
        f"aws.subnet_id: nodes in {subnet_id} could not reach Secrets Manager to read their join bundle: its route "
        f"table ({table.get('RouteTableId', 'none')}) has no 0.0.0.0/0 route through a NAT gateway, and "
        f"{subnet['VpcId']} has no interface endpoint com.amazonaws.{region}.secretsmanager with private DNS. Add "
        "either (an S3 gateway endpoint too when checkpoints.copy_to is s3://)"
    )
