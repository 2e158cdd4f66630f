"""The cluster's security group and launch templates: found by name and tag, created once.

Security group `clusterbake-<cluster>` (in aws.vpc_id):
- all traffic from and to itself (EFA's OS-bypass traffic needs both directions),
- TCP 22 from each of aws.ssh_cidrs (rules for other CIDRs on port 22 are revoked),
- EC2's default egress to 0.0.0.0/0 stays (package mirrors, S3).
With login nodes, security group `clusterbake-<cluster>-login` besides it on theirs: TCP 22 from
each of login_nodes.ssh_cidrs (the users' networks), nothing else of its own.

Launch template `clusterbake-<cluster>-<nodegroup>` (and `clusterbake-<cluster>-head`):
AMI, type, the node role's instance profile, IMDSv2 required, the network interfaces (EFA
groups: an ENA primary interface and one EFA-only interface per EFA network card, see
network_interfaces), the placement group, spot or on-demand, the capacity reservation,
and the tags of the instance, its volumes and its network interfaces. A template whose
latest version differs from what the config asks for gets a new version; instances
launch from that version.
"""

from __future__ import annotations

import ipaddress
import json

from clusterbake.errors import ClusterbakeError
from clusterbake.providers.aws import tags
from clusterbake.providers.aws.api import THROTTLING, call, or_if_gone, paginate
from clusterbake.providers.aws.catalogue import InstanceTypeInfo
from clusterbake.providers.common import resource_name

DEPENDENCY = frozenset({"DependencyViolation"})


# clusterbake-<cluster> (the security group), clusterbake-<cluster>-<node group> (a launch
# template, a placement group).
security_group_name = template_name = placement_group_name = resource_name


# --- security group ---------------------------------------------------------------


def _rule_keys(permissions: list[dict]) -> set[tuple]:
    """Flatten EC2 IpPermissions into (protocol, from, to, kind, value) tuples."""
    keys = set()
    for perm in permissions:
        proto = perm["IpProtocol"]
        ports = (perm.get("FromPort"), perm.get("ToPort")) if proto != "-1" else (None, None)
        for item in perm.get("IpRanges", []):
            keys.add((proto, *ports, "cidr", item["CidrIp"]))
        for item in perm.get("Ipv6Ranges", []):
            keys.add((proto, *ports, "cidr", item["CidrIpv6"]))
        for item in perm.get("UserIdGroupPairs", []):
            keys.add((proto, *ports, "group", item["GroupId"]))
    return keys


def _permission(key: tuple) -> dict:
    proto, from_port, to_port, kind, value = key
    perm: dict = {"IpProtocol": proto}
    if proto != "-1":
        perm |= {"FromPort": from_port, "ToPort": to_port}
    if kind == "group":
        perm["UserIdGroupPairs"] = [{"GroupId": value}]
    elif ipaddress.ip_network(value).version == 6:
        perm["Ipv6Ranges"] = [{"CidrIpv6": value, "Description": "clusterbake ssh"}]
    else:
        perm["IpRanges"] = [{"CidrIp": value, "Description": "clusterbake ssh"}]
    return perm


# The login nodes' own security group: clusterbake-<cluster>-login.
LOGIN_GROUP_SUFFIX = "login"


def desired_rules(group_id: str, ssh_cidrs: list[str], within: bool = True) -> tuple[set[tuple], set[tuple]]:
    """(ingress, egress) rule keys a group must have: the cluster's (`within`: all traffic among its
    members) or the login nodes' (SSH only)."""
    itself = {("-1", None, None, "group", group_id)} if within else set()
    ingress = itself | {("tcp", 22, 22, "cidr", str(ipaddress.ip_network(c))) for c in ssh_cidrs}
    return ingress, itself


def cluster_security_group(groups: list[dict], cluster: str) -> dict | None:
    """Of the groups tagged for the cluster, the cluster's own (not the login nodes')."""
    return next((g for g in groups if g.get("GroupName") == security_group_name(cluster)), None)


def ensure_security_group(
    client, cluster: str, vpc_id: str, ssh_cidrs: list[str], login: bool = False
) -> tuple[str, bool]:
    """The cluster's security group id, or (`login`) the login nodes', created when missing, with its
    rules in sync."""
    name = security_group_name(cluster, LOGIN_GROUP_SUFFIX) if login else security_group_name(cluster)
    filters = [{"Name": "vpc-id", "Values": [vpc_id]}, {"Name": "group-name", "Values": [name]}]
    found = call(client.describe_security_groups, Filters=filters)["SecurityGroups"]
    created = not found
    if found:
        group = found[0]
        if tags.as_dict(group.get("Tags")).get(tags.CLUSTER) != cluster:
            raise ClusterbakeError(
                f"security group {name} ({group['GroupId']}) in {vpc_id} is not tagged {tags.CLUSTER}={cluster}; "
                "rename the cluster or delete that group"
            )
    else:
        group_id = call(
            client.create_security_group,
            GroupName=name,
            Description=f"clusterbake cluster {cluster}: SSH to the login nodes from login_nodes.ssh_cidrs"
            if login
            else f"clusterbake cluster {cluster}: all traffic within the cluster, SSH from ssh_cidrs",
            VpcId=vpc_id,
            TagSpecifications=[tags.spec("security-group", {tags.CLUSTER: cluster, "Name": name})],
        )["GroupId"]
        group = call(client.describe_security_groups, GroupIds=[group_id])["SecurityGroups"][0]
    sync_rules(client, group, ssh_cidrs, within=not login)
    return group["GroupId"], created


def sync_rules(client, group: dict, ssh_cidrs: list[str], within: bool = True) -> None:
    group_id = group["GroupId"]
    want_in, want_out = desired_rules(group_id, ssh_cidrs, within)
    have_in = _rule_keys(group.get("IpPermissions", []))
    have_out = _rule_keys(group.get("IpPermissionsEgress", []))
    stale_ssh = {k for k in have_in - want_in if k[:4] == ("tcp", 22, 22, "cidr")}
    if stale_ssh:
        call(client.revoke_security_group_ingress, GroupId=group_id, IpPermissions=[_permission(k) for k in stale_ssh])
    if want_in - have_in:
        call(
            client.authorize_security_group_ingress,
            GroupId=group_id,
            IpPermissions=[_permission(k) for k in sorted(want_in - have_in, key=str)],
        )
    if want_out - have_out:
        call(
            client.authorize_security_group_egress,
            GroupId=group_id,
            IpPermissions=[_permission(k) for k in sorted(want_out - have_out, key=str)],
        )


def find_security_groups(client, cluster: str) -> list[dict]:
    return call(client.describe_security_groups, Filters=[tags.cluster_filter(cluster)])["SecurityGroups"]


def delete_security_group(client, group_id: str) -> None:
    # The network interfaces of just-terminated instances hold on to the group for a while.
    call(client.delete_security_group, GroupId=group_id, retry_codes=THROTTLING | DEPENDENCY, attempts=12)


# --- launch templates -------------------------------------------------------------


def network_interfaces(info: InstanceTypeInfo, efa: bool, subnet_id: str, group_ids: list[str]) -> list[dict]:
    """The primary (ENA) interface, and for EFA groups one EFA-only interface per EFA card.

    AWS EC2 user guide, "Maximize network bandwidth on Amazon EC2 instances with multiple
    network cards" (P5/P5e "use case 1: save IP addresses and avoid potential Linux IP
    issues"): network card 0, device index 0: an ENA interface (an EFA-only interface
    cannot be the primary); card 0, device index 1: EFA-only, when card 0 takes EFA;
    every further EFA card: EFA-only at device index 0. One private IP per node, so no
    multi-interface routing (hostname, source address) trouble. p5.48xlarge: ENA + 32
    EFA-only; p4d.24xlarge: ENA + 4; p6-b300 (card 0 takes no EFA): ENA + cards 1-16.
    The primary leaves InterfaceType out: the API's default, `interface`.
    """
    common = {"SubnetId": subnet_id, "Groups": list(group_ids), "DeleteOnTermination": True}
    if not efa:
        return [{"DeviceIndex": 0, **common}]
    primary = {"NetworkCardIndex": 0, "DeviceIndex": 0, **common}
    return [primary] + [
        {"NetworkCardIndex": card, "DeviceIndex": 1 if card == 0 else 0, "InterfaceType": "efa-only", **common}
        for card in info.efa_cards
    ]


def template_data(
    *,
    ami_id: str,
    info: InstanceTypeInfo,
    subnet_id: str,
    group_ids: list[str],
    node_tags: dict[str, str],
    efa: bool = False,
    placement_group: str | None = None,
    spot: bool = False,
    capacity_reservation_id: str | None = None,
    capacity_block: bool = False,
    key_name: str | None = None,
    instance_profile: str | None = None,
) -> dict:
    data: dict = {
        "ImageId": ami_id,
        "InstanceType": info.name,
        # Hop limit 1: a container behind the node (one routing hop) gets no IMDSv2 token. Set here,
        # never left to EC2: an AMI registered with ImdsSupport v2.0 (ours) defaults to 2.
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1},
        "NetworkInterfaces": network_interfaces(info, efa, subnet_id, group_ids),
        "TagSpecifications": [
            tags.spec("instance", node_tags),
            tags.spec("volume", {tags.CLUSTER: node_tags[tags.CLUSTER]}),
            # Every interface (p5: 33), so that a leftover one is found by the cluster's tag.
            tags.spec("network-interface", node_tags),
        ],
    }
    if key_name:
        data["KeyName"] = key_name
    if instance_profile:
        # The node role: read this cluster's join bundles, nothing else (iam.py).
        data["IamInstanceProfile"] = {"Name": instance_profile}
    if placement_group:
        data["Placement"] = {"GroupName": placement_group}
    if spot:
        data["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    if capacity_block:
        # A Capacity Block's reservation takes only launches of this market type (User Guide,
        # "Launch instances using Capacity Blocks").
        data["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    if capacity_reservation_id:
        data["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": capacity_reservation_id}
        }
    return data


MANAGED_KEYS = (
    "ImageId",
    "IamInstanceProfile",
    "InstanceType",
    "KeyName",
    "MetadataOptions",
    "NetworkInterfaces",
    "Placement",
    "InstanceMarketOptions",
    "CapacityReservationSpecification",
    "TagSpecifications",
)


def _like(actual, desired):
    """`actual` reduced to the keys `desired` has (EC2 may add defaults of its own)."""
    if isinstance(desired, dict) and isinstance(actual, dict):
        return {k: _like(actual.get(k), v) for k, v in desired.items()}
    if isinstance(desired, list) and isinstance(actual, list) and len(desired) == len(actual):
        return [_like(a, d) for a, d in zip(actual, desired, strict=True)]
    return actual


def template_differs(actual: dict, desired: dict) -> bool:
    actual = dict(actual)
    if "TagSpecifications" in actual:
        # Only the resource types clusterbake sets (moto adds the template's own tags here).
        kinds = {spec["ResourceType"] for spec in desired.get("TagSpecifications", [])}
        actual["TagSpecifications"] = [s for s in actual["TagSpecifications"] if s.get("ResourceType") in kinds]
    for key in MANAGED_KEYS:
        if (key in actual) != (key in desired):
            return True
        if key in desired:
            canon = json.dumps(_like(actual[key], desired[key]), sort_keys=True)
            if canon != json.dumps(desired[key], sort_keys=True):
                return True
    return False


def ensure_launch_template(client, name: str, data: dict, cluster: str) -> tuple[str, str, str]:
    """(template id, version to launch, what happened: created / updated / unchanged)."""
    found = call(client.describe_launch_templates, Filters=[{"Name": "launch-template-name", "Values": [name]}])
    templates = found.get("LaunchTemplates", [])
    if not templates:
        created = call(
            client.create_launch_template,
            LaunchTemplateName=name,
            LaunchTemplateData=data,
            TagSpecifications=[tags.spec("launch-template", {tags.CLUSTER: cluster})],
        )["LaunchTemplate"]
        return created["LaunchTemplateId"], str(created["LatestVersionNumber"]), "created"
    template = templates[0]
    if tags.as_dict(template.get("Tags")).get(tags.CLUSTER) != cluster:
        raise ClusterbakeError(
            f"launch template {name} exists but is not tagged {tags.CLUSTER}={cluster}; "
            "rename the cluster or delete that template"
        )
    template_id = template["LaunchTemplateId"]
    latest = call(client.describe_launch_template_versions, LaunchTemplateId=template_id, Versions=["$Latest"])
    current = latest["LaunchTemplateVersions"][0]
    if not template_differs(current["LaunchTemplateData"], data):
        return template_id, str(current["VersionNumber"]), "unchanged"
    version = call(
        client.create_launch_template_version,
        LaunchTemplateId=template_id,
        LaunchTemplateData=data,
        VersionDescription="clusterbake: config changed",
    )["LaunchTemplateVersion"]
    return template_id, str(version["VersionNumber"]), "updated"


def find_launch_templates(client, cluster: str) -> list[dict]:
    return paginate(client, "describe_launch_templates", "LaunchTemplates", Filters=[tags.cluster_filter(cluster)])


def delete_launch_template(client, template_id: str) -> None:
    gone = "InvalidLaunchTemplateId.NotFound"
    or_if_gone(gone, None, lambda: call(client.delete_launch_template, LaunchTemplateId=template_id))
