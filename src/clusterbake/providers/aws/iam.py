"""The cluster's node role and instance profile: what a node may read, and nothing else.

Role and instance profile are both `clusterbake-<cluster>-node` (path `/clusterbake/`),
tagged `clusterbake:cluster=<cluster>` and found again by name and tag (IAM cannot list
by tag: ListRoles does not even return tags). The role:

- trusts `ec2.amazonaws.com` (`sts:AssumeRole`), nothing else;
- has one inline policy, `clusterbake-node`, that allows only
  - `secretsmanager:GetSecretValue` of the AWSCURRENT version only (condition
    `secretsmanager:VersionStage`: the boot program names the stage; a version a publish
    replaced is unreadable) and `secretsmanager:DescribeSecret` on
    `arn:<partition>:secretsmanager:<region>:<account>:secret:clusterbake/<cluster>/*`
    (the join bundles of this cluster, see secrets.py; the `*` also covers the six
    random characters Secrets Manager appends to a secret's ARN);
  - `kms:Decrypt` on the configured key (`aws.kms_key_id`, as a key ARN) when there is
    one, only through Secrets Manager (`kms:ViaService`). With the AWS managed key
    `aws/secretsmanager` no KMS statement is needed: its key policy lets every
    principal of the account use it through Secrets Manager. A customer managed key's
    own key policy must let the account's IAM policies grant access (the default key
    policy does);
  - with `s3_buckets`: `s3:ListBucket` on the buckets and
    `s3:GetObject/PutObject/DeleteObject/AbortMultipartUpload` on their objects
    (Mountpoint for S3 on the nodes).

The head role and profile `clusterbake-<cluster>-head` (same path, tags and trust) are
what the head's power program (role slurm_power, `clusterbake-power`) runs with: it
launches and terminates the elastic nodes. Its inline policy `clusterbake-head`
(`head_policy`) allows only

- `ec2:RunInstances` on instances, volumes and network interfaces (`*`: new ones have no
  id yet), the cluster's subnet and security group, its compute launch templates, the
  cluster's AMI, and the placement groups, key pairs, capacity reservations and spot
  requests a template may name;
- `ec2:CreateTags` on instances, volumes, network interfaces and spot requests, when
  RunInstances creates them (condition `ec2:CreateAction`): the tags of the launch;
- `ec2:TerminateInstances` on instances tagged `clusterbake:cluster=<cluster>` (condition
  `ec2:ResourceTag/clusterbake:cluster`);
- `ec2:DescribeInstances`, `ec2:DescribeInstanceStatus` and `ec2:DescribeInstanceTopology` (where
  the running compute instances hang, for topology.conf) (no resource-level permissions in EC2: `*`);
- `iam:PassRole` of the node role only (a template names its profile; the head cannot
  launch anything with its own, stronger role);
- `secretsmanager:GetSecretValue` on the cluster's secrets, and `kms:Decrypt` of
  aws.kms_key_id through Secrets Manager when set.

What the EC2 twin proves of it: moto evaluates actions and resources, not conditions
(a condition never denies there), and checks each EC2 call against resource `*` unless
the twin's additions (twins/aws/moto_ext.py) name the resources: they check RunInstances
against the instance, launch template, subnet, security groups and image, iam:PassRole
of the profile's role, TerminateInstances and CreateTags against each instance. What
AWS additionally evaluates and no test here does: the two conditions above, and
RunInstances' other resources (volumes, network interfaces, placement group, key pair,
capacity reservation, spot request).

IAM is eventually consistent. A role and instance profile created a moment ago are
not yet known to EC2: for about 10 seconds (sometimes longer) RunInstances and
CreateLaunchTemplate-based launches fail with InvalidParameterValue "Invalid IAM
Instance Profile name" (or "... ARN"). `profile_not_ready(exc)` matches exactly that
error, and `call_while_profile_not_ready` retries an EC2 call on it; launch code should
use it when `ensure_node_role` reported `created`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.providers.aws import tags
from clusterbake.providers.aws.api import THROTTLING, call, error_code, paginate

PATH = "/clusterbake/"
POLICY_NAME = "clusterbake-node"
HEAD_POLICY_NAME = "clusterbake-head"
JOBS_POLICY_NAME = "clusterbake-jobs"
# Stands for the job's user in the session policy a node's helper (roles/training_env:
# clusterbake-job-credentials, which has the same literal) fills in for its caller.
JOBS_USER_PLACEHOLDER = "CLUSTERBAKE_USER"
TRUST_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"},
    ],
}
S3_OBJECT_ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[A-Za-z0-9-]+$")

# What EC2 answers while a brand-new instance profile has not reached it yet.
PROFILE_NOT_READY_CODES = frozenset({"InvalidParameterValue"})
PROFILE_NOT_READY = re.compile(
    r"Invalid IAM Instance Profile (name|ARN)|iamInstanceProfile\.(name|arn)\b.*\binvalid", re.IGNORECASE
)
PROFILE_READY_TIMEOUT = 120.0
# IAM is eventually consistent also for itself: a role created a moment ago may still be
# NoSuchEntity to the next call.
JUST_CREATED = THROTTLING | frozenset({"NoSuchEntity"})
PROFILE_POLL = 1.0  # EC2 knows a new profile within seconds; the twin refuses one for 3 s


def node_role_name(cluster: str) -> str:
    return f"clusterbake-{cluster}-node"


def head_role_name(cluster: str) -> str:
    return f"clusterbake-{cluster}-head"


def jobs_role_name(cluster: str) -> str:
    return f"clusterbake-{cluster}-jobs"


def role_arn(name: str, region: str, account: str) -> str:
    return f"arn:{partition(region)}:iam::{account}:role{PATH}{name}"


def partition(region: str) -> str:
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def dns_suffix(region: str) -> str:
    return "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"


def secrets_arn_prefix(cluster: str, region: str, account: str) -> str:
    """The ARN pattern of this cluster's secrets (secrets.secret_name: clusterbake/<cluster>/...)."""
    return f"arn:{partition(region)}:secretsmanager:{region}:{account}:secret:clusterbake/{cluster}/*"


def node_policy(
    cluster: str,
    region: str,
    account: str,
    kms_key_arn: str | None = None,
    s3_buckets: tuple[str, ...] | list = (),
    jobs_role: bool = False,
) -> dict:
    """The inline policy document of the node role (see the module docstring)."""
    statements: list[dict] = [
        {
            # The current bundle only: a version it replaced (an older munge key) stays unreadable.
            "Sid": "JoinBundles",
            "Effect": "Allow",
            "Action": "secretsmanager:GetSecretValue",
            "Resource": secrets_arn_prefix(cluster, region, account),
            "Condition": {"StringEquals": {"secretsmanager:VersionStage": "AWSCURRENT"}},
        },
        {
            "Sid": "JoinBundleMetadata",
            "Effect": "Allow",
            "Action": "secretsmanager:DescribeSecret",
            "Resource": secrets_arn_prefix(cluster, region, account),
        },
    ]
    if kms_key_arn:
        statements.append(_kms_statement(kms_key_arn, region))
    if jobs_role:
        # The node's job credential helper (root) hands a job a session of the jobs role,
        # narrowed to the job user's prefix (roles/training_env: clusterbake-job-credentials).
        statements.append(
            {
                "Sid": "JobCredentials",
                "Effect": "Allow",
                "Action": "sts:AssumeRole",
                "Resource": role_arn(jobs_role_name(cluster), region, account),
            }
        )
    buckets = sorted(set(s3_buckets))
    _check_buckets(buckets)
    if buckets:
        arn = f"arn:{partition(region)}:s3:::"
        statements += [
            {
                "Sid": "DataBuckets",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": [arn + b for b in buckets],
            },
            {
                "Sid": "DataObjects",
                "Effect": "Allow",
                "Action": S3_OBJECT_ACTIONS,
                "Resource": [f"{arn}{b}/*" for b in buckets],
            },
        ]
    return {"Version": "2012-10-17", "Statement": statements}


def _check_buckets(buckets: list[str]) -> None:
    for bucket in buckets:
        if not BUCKET_NAME.match(bucket) or ".." in bucket:
            raise ClusterbakeError(f"S3 bucket {bucket!r}: not a bucket name (no s3://, no prefix)")


def jobs_trust_policy(cluster: str, region: str, account: str) -> dict:
    """Who may assume the jobs role: the node role (its sessions: the nodes' root)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": role_arn(node_role_name(cluster), region, account)},
                "Action": "sts:AssumeRole",
            }
        ],
    }


def jobs_policy(region: str, bucket: str, prefix: str, user: str | None = None) -> dict:
    """What a job's checkpoint copies may do: objects under <prefix>/ (the jobs role), or under
    <prefix>/<user>/ (the session policy the node's helper adds for one user: the intersection of
    the two is what the job gets), and list only there."""
    _check_buckets([bucket])
    below = "/".join(p for p in (prefix.strip("/"), user) if p)
    objects = f"arn:{partition(region)}:s3:::{bucket}/{below + '/' if below else ''}*"
    listing: dict = {
        "Sid": "ListTheCopies",
        "Effect": "Allow",
        "Action": "s3:ListBucket",
        "Resource": f"arn:{partition(region)}:s3:::{bucket}",
    }
    if below:
        listing["Condition"] = {"StringLike": {"s3:prefix": [f"{below}/*"]}}
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "CheckpointCopies", "Effect": "Allow", "Action": S3_OBJECT_ACTIONS, "Resource": objects},
            listing,
        ],
    }


def _kms_statement(kms_key_arn: str, region: str) -> dict:
    if not KMS_KEY_ARN.match(kms_key_arn):
        raise ClusterbakeError(f"KMS key {kms_key_arn!r} is not a key ARN; resolve it with iam.resolve_kms_key")
    return {
        "Sid": "JoinBundleKey",
        "Effect": "Allow",
        "Action": "kms:Decrypt",
        "Resource": kms_key_arn,
        "Condition": {"StringEquals": {"kms:ViaService": f"secretsmanager.{region}.{dns_suffix(region)}"}},
    }


@dataclass(frozen=True)
class HeadLaunches:
    """What the head's power program launches compute nodes with: all its role allows."""

    subnet_id: str
    security_group_id: str
    image_id: str
    launch_template_ids: list[str] | tuple[str, ...]
    instance_types: list[str] | tuple[str, ...]
    key_name: str | None = None
    # Customer managed KMS keys the launched volumes are encrypted with (volume_keys).
    volume_keys: list[str] | tuple[str, ...] = ()


def head_policy(cluster: str, region: str, account: str, launches: HeadLaunches) -> dict:
    """The inline policy document of the head role (see the module docstring)."""
    p = partition(region)
    ec2 = f"arn:{p}:ec2:{region}:{account}"
    if not launches.launch_template_ids or not launches.instance_types:
        raise ClusterbakeError("the head role needs the compute groups' launch templates and instance types")
    templates = [f"{ec2}:launch-template/{t}" for t in sorted(set(launches.launch_template_ids))]
    instance_types = launches.instance_types
    subnet_id, security_group_id = launches.subnet_id, launches.security_group_id
    image_id, key_name = launches.image_id, launches.key_name
    from_templates = {"ArnEquals": {"ec2:LaunchTemplate": templates}}
    created = [f"{ec2}:volume/*", f"{ec2}:network-interface/*"]
    statements: list[dict] = [
        {
            # Instances only from the compute groups' templates, only of the groups' types.
            "Sid": "LaunchComputeNodes",
            "Effect": "Allow",
            "Action": "ec2:RunInstances",
            "Resource": f"{ec2}:instance/*",
            "Condition": {**from_templates, "StringEquals": {"ec2:InstanceType": sorted(set(instance_types))}},
        },
        {
            "Sid": "WhatComputeNodesLaunchWith",
            "Effect": "Allow",
            "Action": "ec2:RunInstances",
            "Resource": [
                *created,
                f"{ec2}:subnet/{subnet_id}",
                f"{ec2}:security-group/{security_group_id}",
                *templates,
                f"arn:{p}:ec2:{region}::image/{image_id}",
                f"{ec2}:placement-group/*",
                *([f"{ec2}:key-pair/{key_name}"] if key_name else []),
                f"{ec2}:capacity-reservation/*",
                f"{ec2}:spot-instances-request/*",
            ],
            "Condition": from_templates,
        },
        {
            "Sid": "TagAtLaunch",
            "Effect": "Allow",
            "Action": "ec2:CreateTags",
            "Resource": [f"{ec2}:instance/*", *created, f"{ec2}:spot-instances-request/*"],
            "Condition": {"StringEquals": {"ec2:CreateAction": "RunInstances"}},
        },
        {
            # The cluster's compute nodes only: never the head, nothing of another cluster.
            "Sid": "TerminateClusterNodes",
            "Effect": "Allow",
            "Action": "ec2:TerminateInstances",
            "Resource": f"{ec2}:instance/*",
            "Condition": {
                "StringEquals": {f"ec2:ResourceTag/{tags.CLUSTER}": cluster, f"ec2:ResourceTag/{tags.ROLE}": "compute"}
            },
        },
        {
            "Sid": "SeeInstances",
            "Effect": "Allow",
            "Action": ["ec2:DescribeInstances", "ec2:DescribeInstanceStatus", "ec2:DescribeInstanceTopology"],
            "Resource": "*",
        },
        {
            "Sid": "PassNodeRole",
            "Effect": "Allow",
            "Action": "iam:PassRole",
            "Resource": role_arn(node_role_name(cluster), region, account),
        },
    ]
    if launches.volume_keys:
        # EC2 uses a customer managed key for the caller: without these, an instance goes from pending to
        # terminated (Client.InternalError) while RunInstances said yes (realcloud review A8). Only
        # through EC2, and grants only for AWS resources (the EBS volumes).
        via_ec2 = {"kms:ViaService": f"ec2.{region}.amazonaws.com"}
        keys = sorted(set(launches.volume_keys))
        statements += [
            {
                "Sid": "EncryptedVolumes",
                "Effect": "Allow",
                "Action": ["kms:Decrypt", "kms:GenerateDataKeyWithoutPlaintext", "kms:ReEncrypt*", "kms:DescribeKey"],
                "Resource": keys,
                "Condition": {"StringEquals": via_ec2},
            },
            {
                "Sid": "EncryptedVolumeGrants",
                "Effect": "Allow",
                "Action": "kms:CreateGrant",
                "Resource": keys,
                "Condition": {"StringEquals": via_ec2, "Bool": {"kms:GrantIsForAWSResource": "true"}},
            },
        ]
    # No secret reads: the head is configured by Ansible, never from a join bundle.
    return {"Version": "2012-10-17", "Statement": statements}


def _document(value: Any) -> dict:
    # boto3 decodes IAM policy documents into dicts; a plain botocore client leaves the
    # URL-encoded JSON string.
    if isinstance(value, str):
        from urllib.parse import unquote

        return json.loads(unquote(value))
    return value


def _get(operation: Callable, key: str, **params: Any) -> dict | None:
    try:
        return call(operation, **params)[key]
    except ClientError as exc:
        if error_code(exc) == "NoSuchEntity":
            return None
        raise


def _owned(resource: dict | None, what: str, name: str, cluster: str) -> dict | None:
    if resource is not None and tags.as_dict(resource.get("Tags")).get(tags.CLUSTER) != cluster:
        raise ClusterbakeError(
            f"IAM {what} {name} exists but is not tagged {tags.CLUSTER}={cluster}; "
            f"rename the cluster or delete that {what}"
        )
    return resource


def ensure_node_role(
    iam,
    sts,
    cluster: str,
    region: str,
    kms_key_arn: str | None = None,
    s3_buckets: tuple[str, ...] | list[str] = (),
    jobs_role: bool = False,
) -> tuple[str, str, bool]:
    """(instance profile name, its ARN, created): the node role and profile, made to match.

    `created` is True when the role, the profile or the role's membership in it is new:
    EC2 may then reject the profile for ~10 s ("Invalid IAM Instance Profile name"); launch
    through `call_while_profile_not_ready`. A role or profile of that name not tagged for
    this cluster is refused. `kms_key_arn` must be a key ARN (`resolve_kms_key`).
    """
    account = call(sts.get_caller_identity)["Account"]
    document = node_policy(cluster, region, account, kms_key_arn, s3_buckets, jobs_role)
    return _ensure_role(iam, node_role_name(cluster), POLICY_NAME, document, cluster, "nodes read their join bundle")


def ensure_jobs_role(iam, sts, cluster: str, region: str, bucket: str, prefix: str) -> tuple[str, bool]:
    """(role ARN, created): the role whose sessions carry jobs' checkpoint copies (no instance
    profile: only the node role assumes it, each session narrowed to one user's prefix)."""
    account = call(sts.get_caller_identity)["Account"]
    name = jobs_role_name(cluster)
    _, _, created = _ensure_role(
        iam,
        name,
        JOBS_POLICY_NAME,
        jobs_policy(region, bucket, prefix),
        cluster,
        "jobs copy their checkpoints, each user under its own prefix",
        trust=jobs_trust_policy(cluster, region, account),
        with_profile=False,
    )
    return role_arn(name, region, account), created


def ensure_head_role(iam, sts, cluster: str, region: str, launches: HeadLaunches) -> tuple[str, str, bool]:
    """(instance profile name, its ARN, created): the head role and profile (`head_policy`), made to
    match; as ensure_node_role."""
    document = head_policy(cluster, region, call(sts.get_caller_identity)["Account"], launches)
    return _ensure_role(
        iam, head_role_name(cluster), HEAD_POLICY_NAME, document, cluster, "the head powers elastic nodes up and down"
    )


def _ensure_role(
    iam,
    name: str,
    policy_name: str,
    document: dict,
    cluster: str,
    purpose: str,
    trust: dict = TRUST_POLICY,
    with_profile: bool = True,
) -> tuple[str, str, bool]:
    cluster_tags = tags.as_list({tags.CLUSTER: cluster})
    created = False

    # Both names checked before anything is created: a refusal leaves nothing behind.
    profile = _owned(
        _get(iam.get_instance_profile, "InstanceProfile", InstanceProfileName=name), "instance profile", name, cluster
    )
    role = _owned(_get(iam.get_role, "Role", RoleName=name), "role", name, cluster)
    if role is None:
        try:
            call(
                iam.create_role,
                RoleName=name,
                Path=PATH,
                AssumeRolePolicyDocument=json.dumps(trust),
                Description=f"clusterbake cluster {cluster}: {purpose}",
                Tags=cluster_tags,
            )
            created = True
        except ClientError as exc:
            if error_code(exc) != "EntityAlreadyExists":
                raise
            _owned(_get(iam.get_role, "Role", RoleName=name), "role", name, cluster)
    elif _document(role.get("AssumeRolePolicyDocument")) != trust:
        call(iam.update_assume_role_policy, RoleName=name, PolicyDocument=json.dumps(trust))

    current = _get(iam.get_role_policy, "PolicyDocument", RoleName=name, PolicyName=policy_name)
    if current is None or _document(current) != document:
        call(
            iam.put_role_policy,
            retry_codes=JUST_CREATED,
            RoleName=name,
            PolicyName=policy_name,
            PolicyDocument=json.dumps(document),
        )

    if not with_profile:
        return name, "", created
    if profile is None:
        try:
            profile = call(iam.create_instance_profile, InstanceProfileName=name, Path=PATH, Tags=cluster_tags)[
                "InstanceProfile"
            ]
            created = True
        except ClientError as exc:
            if error_code(exc) != "EntityAlreadyExists":
                raise
            profile = _owned(
                _get(iam.get_instance_profile, "InstanceProfile", InstanceProfileName=name),
                "instance profile",
                name,
                cluster,
            )
    roles = [r["RoleName"] for r in profile.get("Roles", [])]
    for other in roles:
        if other != name:  # a profile holds one role at most
            call(iam.remove_role_from_instance_profile, InstanceProfileName=name, RoleName=other)
    if name not in roles:
        call(iam.add_role_to_instance_profile, retry_codes=JUST_CREATED, InstanceProfileName=name, RoleName=name)
        created = True
    return name, profile["Arn"], created


def find(iam, cluster: str, name: str | None = None) -> dict[str, dict]:
    """{"role": ..., "instance_profile": ...}: those of the cluster's that exist (tagged for it);
    the node role's, or those named `name` (head_role_name)."""
    name = name or node_role_name(cluster)
    found = {
        "role": _get(iam.get_role, "Role", RoleName=name),
        "instance_profile": _get(iam.get_instance_profile, "InstanceProfile", InstanceProfileName=name),
    }
    return {
        kind: item
        for kind, item in found.items()
        if item is not None and tags.as_dict(item.get("Tags")).get(tags.CLUSTER) == cluster
    }


def _ignore_missing(operation: Callable, **params: Any) -> bool:
    try:
        call(operation, **params)
        return True
    except ClientError as exc:
        if error_code(exc) == "NoSuchEntity":
            return False
        raise


def delete_node_role(iam, cluster: str) -> list[str]:
    """Remove the cluster's instance profile and role (only if tagged for it); returns what went.

    Role out of the profile, the profile, the role's inline policies, its managed policies
    detached, the role. A second run finds nothing and returns [].
    """
    return _delete_role(iam, cluster, node_role_name(cluster))


# EC2's service-linked role for Spot: an account's first Spot launch needs it, and EC2 makes it
# then only for a caller allowed iam:CreateServiceLinkedRole, which the head's role is not (its
# elastic Spot launches would fail with AuthFailure.ServiceLinkedRoleCreationNotPermitted).
SPOT_SERVICE = "spot.amazonaws.com"
SPOT_ROLE = "AWSServiceRoleForEC2Spot"


def spot_role_exists(iam) -> bool:
    return _ignore_missing(iam.get_role, RoleName=SPOT_ROLE)


def ensure_spot_role(iam) -> bool:
    """The account's AWSServiceRoleForEC2Spot, made by the controller when missing (an account-wide
    role: `cluster down` leaves it); True when made here."""
    if spot_role_exists(iam):
        return False
    try:
        call(iam.create_service_linked_role, AWSServiceName=SPOT_SERVICE)
    except ClientError as exc:
        # Made meanwhile (another cluster's `up`): "Service role name ... has been taken in this account".
        if error_code(exc) != "InvalidInput" or "has been taken" not in str(exc):
            raise
        return False
    return True


def delete_head_role(iam, cluster: str) -> list[str]:
    """Remove the cluster's head role and profile, as delete_node_role."""
    return _delete_role(iam, cluster, head_role_name(cluster))


def revoke_head_policy(iam, cluster: str) -> bool:
    """Remove the head role's policy (the role stays until delete_head_role): True when it was there."""
    if "role" not in find(iam, cluster, head_role_name(cluster)):
        return False
    return _ignore_missing(iam.delete_role_policy, RoleName=head_role_name(cluster), PolicyName=HEAD_POLICY_NAME)


def delete_jobs_role(iam, cluster: str) -> list[str]:
    """Remove the cluster's jobs role, as delete_node_role."""
    return _delete_role(iam, cluster, jobs_role_name(cluster))


def _delete_role(iam, cluster: str, name: str) -> list[str]:
    found = find(iam, cluster, name)
    removed: list[str] = []
    profile = found.get("instance_profile")
    if profile is not None:
        for role in profile.get("Roles", []):
            _ignore_missing(iam.remove_role_from_instance_profile, InstanceProfileName=name, RoleName=role["RoleName"])
        if _ignore_missing(iam.delete_instance_profile, InstanceProfileName=name):
            removed.append(f"instance profile {name}")
    if "role" in found:
        # Other profiles holding the role (made by hand) would block DeleteRole.
        for other in paginate(
            iam, "list_instance_profiles_for_role", "InstanceProfiles", token_in="Marker", RoleName=name
        ):
            _ignore_missing(
                iam.remove_role_from_instance_profile, InstanceProfileName=other["InstanceProfileName"], RoleName=name
            )
        for policy in paginate(iam, "list_role_policies", "PolicyNames", token_in="Marker", RoleName=name):
            _ignore_missing(iam.delete_role_policy, RoleName=name, PolicyName=policy)
        for policy in paginate(
            iam, "list_attached_role_policies", "AttachedPolicies", token_in="Marker", RoleName=name
        ):
            _ignore_missing(iam.detach_role_policy, RoleName=name, PolicyArn=policy["PolicyArn"])
        if _ignore_missing(iam.delete_role, RoleName=name):
            removed.append(f"role {name}")
    return removed


# --- EC2 and a brand-new profile ----------------------------------------------------


def profile_not_ready(exc: BaseException) -> bool:
    """Is this EC2's answer to an instance profile IAM has created but EC2 does not know yet?"""
    if not isinstance(exc, ClientError) or error_code(exc) not in PROFILE_NOT_READY_CODES:
        return False
    return bool(PROFILE_NOT_READY.search(exc.response.get("Error", {}).get("Message", "")))


def call_while_profile_not_ready(
    operation: Callable[..., Any],
    /,
    *,
    sleep: Callable[[float], None] = time.sleep,
    timeout: float = PROFILE_READY_TIMEOUT,
    poll: float = PROFILE_POLL,
    **params: Any,
) -> Any:
    """`api.call(operation, **params)`, retried every `poll` s while the profile is not ready.

    Keep the same ClientToken in `params` (RunInstances): a retry then never launches twice."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call(operation, retry_codes=THROTTLING, sleep=sleep, **params)
        except ClientError as exc:
            if not profile_not_ready(exc) or time.monotonic() > deadline:
                raise
        sleep(poll)


# --- KMS ---------------------------------------------------------------------------


def volume_keys(ec2, kms, ami_id: str) -> list[str]:
    """The customer managed KMS keys (ARNs) an instance of `ami_id` gets volumes encrypted with: its
    snapshots' keys, and the account's default EBS key when encryption by default is on. AWS managed
    keys (aws/ebs) need no permission and are left out."""
    images = call(ec2.describe_images, ImageIds=[ami_id])["Images"]
    snapshots = [
        m["Ebs"]["SnapshotId"]
        for image in images
        for m in image.get("BlockDeviceMappings", [])
        if m.get("Ebs", {}).get("SnapshotId")
    ]
    keys = set()
    if snapshots:
        found = call(ec2.describe_snapshots, SnapshotIds=snapshots)["Snapshots"]
        keys |= {s["KmsKeyId"] for s in found if s.get("Encrypted") and s.get("KmsKeyId")}
    if call(ec2.get_ebs_encryption_by_default).get("EbsEncryptionByDefault"):
        keys.add(call(ec2.get_ebs_default_kms_key_id)["KmsKeyId"])
    customer = []
    for key in sorted(keys):
        if key.rsplit(":", 1)[-1] == "alias/aws/ebs":
            continue
        metadata = call(kms.describe_key, KeyId=key)["KeyMetadata"]
        if metadata.get("KeyManager") == "CUSTOMER":
            customer.append(metadata["Arn"])
    return customer


def resolve_kms_key(kms, key_id: str) -> str:
    """The key ARN of `key_id` (key id, key ARN, alias/NAME or alias ARN) via DescribeKey."""
    try:
        metadata = call(kms.describe_key, KeyId=key_id)["KeyMetadata"]
    except ClientError as exc:
        if error_code(exc) in ("NotFoundException", "InvalidArnException"):
            region = kms.meta.region_name
            raise ConfigError(
                f"aws.kms_key_id: KMS key {key_id!r} does not exist in {region} "
                "(use a key id, key ARN or alias/NAME of that region, or remove aws.kms_key_id)"
            ) from None
        raise
    state = metadata.get("KeyState", "Enabled")
    if state != "Enabled":
        raise ConfigError(f"aws.kms_key_id: KMS key {key_id!r} ({metadata['Arn']}) is {state}, not Enabled")
    return metadata["Arn"]
