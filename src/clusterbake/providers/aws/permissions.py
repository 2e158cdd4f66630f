"""The operator's AWS permissions as data: the IAM policy `clusterbake permissions` prints for a config.

One table (GRANTS): each grant's actions, the resources they are scoped to (the cluster's roles,
instance profiles and secrets by name; EC2, EFS, FSx, Service Quotas and the Price List on `*`,
most of whose calls take no resource-level permission or name resources not made yet), why the
product needs them, and the configs that need them (a Spot group, file systems, a checkpoint
bucket, a KMS key). `image build` adds what Packer's amazon-ebs builder calls, as HashiCorp's
documentation lists it ("IAM Task or Instance Role").

tests/aws/test_permissions.py holds it to the product: every call `cluster up`, `status`,
`node stop`/`start` and `down` make against the EC2 twin (recorded by the twin) is allowed by the
policy, and an operator restricted to it brings a cluster up and down there, where the twin
enforces IAM (moto's evaluation, with the twin's resource ARNs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from clusterbake.config import ClusterConfig
from clusterbake.providers.aws import iam
from clusterbake.providers.common import action_allowed

# The roles and profiles live under the path /clusterbake/ (iam.PATH); a call naming one that does not
# exist yet is authorized against its name without the path: both match.
ROLES = "arn:{partition}:iam::{account}:role/*clusterbake-{cluster}-*"
PROFILES = "arn:{partition}:iam::{account}:instance-profile/*clusterbake-{cluster}-*"
SECRETS = "arn:{partition}:secretsmanager:{region}:{account}:secret:clusterbake/{cluster}/*"
# aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot once made; by its bare name while missing.
SPOT_ROLE = "arn:{partition}:iam::{account}:role/*AWSServiceRoleForEC2Spot"


def _always(config: ClusterConfig) -> bool:
    return True


def _spot(config: ClusterConfig) -> bool:
    return any(group.spot for group in config.node_groups)


def _storage(kind: str) -> Callable[[ClusterConfig], bool]:
    return lambda config: any(getattr(entry, "type", None) == kind for entry in config.storage or [])


@dataclass(frozen=True)
class Grant:
    sid: str
    actions: tuple[str, ...]
    why: str
    resources: tuple[str, ...] = ("*",)
    needed: Callable[[ClusterConfig], bool] = _always
    commands: tuple[str, ...] = ("cluster",)  # "cluster": up, down, status, node, ops, job; "image"


GRANTS: tuple[Grant, ...] = (
    Grant(
        "ReadOnlyChecksStatusPrices",
        (
            "ec2:Describe*",
            "ec2:GetSubnetCidrReservations",
            "ec2:GetEbsEncryptionByDefault",
            "ec2:GetEbsDefaultKmsKeyId",
            "ec2:GetConsoleOutput",
            "elasticfilesystem:DescribeFileSystems",
            "fsx:DescribeFileSystems",
            "servicequotas:GetServiceQuota",
            "servicequotas:GetAWSDefaultServiceQuota",
            "pricing:GetProducts",
        ),
        "the checks before anything is made, --dry-run, status and its price, the nodes' host keys from "
        "their console output, what still bills after `cluster down` (file systems of any kind included)",
    ),
    Grant(
        "NetworkAndPlacement",
        (
            "ec2:CreateSecurityGroup",
            "ec2:AuthorizeSecurityGroupIngress",
            "ec2:AuthorizeSecurityGroupEgress",
            "ec2:RevokeSecurityGroupIngress",
            "ec2:RevokeSecurityGroupEgress",
            "ec2:DeleteSecurityGroup",
            "ec2:CreateSubnetCidrReservation",
            "ec2:DeleteSubnetCidrReservation",
            "ec2:CreatePlacementGroup",
            "ec2:DeletePlacementGroup",
            "ec2:CreateTags",
        ),
        "the cluster's security group, its planned addresses' CIDR reservations, placement groups, tags",
    ),
    Grant(
        "Instances",
        (
            "ec2:CreateLaunchTemplate",
            "ec2:CreateLaunchTemplateVersion",
            "ec2:ModifyLaunchTemplate",
            "ec2:DeleteLaunchTemplate",
            "ec2:RunInstances",
            "ec2:StartInstances",
            "ec2:StopInstances",
            "ec2:TerminateInstances",
            "ec2:AssociateIamInstanceProfile",
            "ec2:ReplaceIamInstanceProfileAssociation",
        ),
        "launch templates and the head's and static nodes' instances; node stop/start/replace; cluster down",
    ),
    Grant(
        "ClusterRolesAndProfiles",
        (
            "iam:CreateRole",
            "iam:GetRole",
            "iam:DeleteRole",
            "iam:TagRole",
            "iam:UpdateAssumeRolePolicy",
            "iam:PutRolePolicy",
            "iam:GetRolePolicy",
            "iam:DeleteRolePolicy",
            "iam:ListRolePolicies",
            "iam:ListAttachedRolePolicies",
            "iam:ListInstanceProfilesForRole",
            "iam:CreateInstanceProfile",
            "iam:GetInstanceProfile",
            "iam:DeleteInstanceProfile",
            "iam:TagInstanceProfile",
            "iam:AddRoleToInstanceProfile",
            "iam:RemoveRoleFromInstanceProfile",
            "iam:PassRole",
        ),
        "the node, head and jobs roles clusterbake-<cluster>-* and their instance profiles, passed to EC2",
        (ROLES, PROFILES),
    ),
    Grant(
        "SpotServiceLinkedRole",
        ("iam:GetRole", "iam:CreateServiceLinkedRole"),
        "the account's AWSServiceRoleForEC2Spot, made once when missing (EC2 needs it for the first Spot launch)",
        (SPOT_ROLE,),
        _spot,
    ),
    Grant(
        "JoinBundleSecrets",
        (
            "secretsmanager:CreateSecret",
            "secretsmanager:DescribeSecret",
            "secretsmanager:GetSecretValue",
            "secretsmanager:PutSecretValue",
            "secretsmanager:UpdateSecret",
            "secretsmanager:UpdateSecretVersionStage",
            "secretsmanager:RestoreSecret",
            "secretsmanager:DeleteSecret",
            "secretsmanager:TagResource",
        ),
        "one secret per node group holding its join bundle, clusterbake/<cluster>/join/<group>",
        (SECRETS,),
    ),
    Grant(
        "ListSecrets",
        ("secretsmanager:ListSecrets",),
        "finding the cluster's secrets (ListSecrets takes no resource)",
    ),
    Grant(
        "EfsFileSystems",
        (
            "elasticfilesystem:CreateFileSystem",
            "elasticfilesystem:DescribeFileSystems",
            "elasticfilesystem:CreateMountTarget",
            "elasticfilesystem:DescribeMountTargets",
            "elasticfilesystem:DescribeMountTargetSecurityGroups",
            "elasticfilesystem:DeleteMountTarget",
            "elasticfilesystem:DeleteFileSystem",
            "elasticfilesystem:TagResource",
        ),
        "EFS file systems of `type: efs` storage entries and their mount targets",
        needed=_storage("efs"),
    ),
    Grant(
        "FsxFileSystems",
        (
            "fsx:CreateFileSystem",
            "fsx:DescribeFileSystems",
            "fsx:DeleteFileSystem",
            "fsx:TagResource",
            "fsx:CreateDataRepositoryAssociation",
            "fsx:DescribeDataRepositoryAssociations",
        ),
        "FSx for Lustre file systems of `type: fsx_lustre` entries and their links to S3",
        needed=_storage("fsx_lustre"),
    ),
    Grant(
        "CheckpointBucket",
        ("s3:ListBucket",),
        "checkpoints.copy_to: the bucket must exist (HeadBucket)",
        ("arn:{partition}:s3:::{bucket}",),
        lambda config: (config.checkpoints.copy_to or "").startswith("s3://"),
    ),
    Grant(
        "EncryptionKeys",
        ("kms:DescribeKey", "kms:GenerateDataKey", "kms:Decrypt", "kms:CreateGrant"),
        "aws.kms_key_id: the join-bundle secrets encrypted under it, the AMI's snapshots' keys read",
        needed=lambda config: bool(config.aws and config.aws.kms_key_id),
    ),
    Grant(
        "PackerAmazonEbs",
        (
            "ec2:AttachVolume",
            "ec2:AuthorizeSecurityGroupIngress",
            "ec2:CopyImage",
            "ec2:CreateImage",
            "ec2:CreateKeyPair",
            "ec2:CreateSecurityGroup",
            "ec2:CreateSnapshot",
            "ec2:CreateTags",
            "ec2:CreateVolume",
            "ec2:DeleteKeyPair",
            "ec2:DeleteSecurityGroup",
            "ec2:DeleteSnapshot",
            "ec2:DeleteVolume",
            "ec2:DeregisterImage",
            "ec2:Describe*",
            "ec2:DetachVolume",
            "ec2:GetPasswordData",
            "ec2:ModifyImageAttribute",
            "ec2:ModifyInstanceAttribute",
            "ec2:ModifySnapshotAttribute",
            "ec2:RegisterImage",
            "ec2:RunInstances",
            "ec2:StopInstances",
            "ec2:TerminateInstances",
        ),
        "`image build`: Packer's amazon-ebs builder (its documentation's list) makes a builder instance and the AMI",
        commands=("image",),
    ),
)


def _bucket(config: ClusterConfig) -> str:
    copy_to = config.checkpoints.copy_to or ""
    return copy_to.removeprefix("s3://").split("/", 1)[0]


def policy(config: ClusterConfig, account: str = "*", commands: tuple[str, ...] = ("cluster", "image")) -> dict:
    """The IAM policy document the operator of `config` needs for `commands`."""
    region = config.aws.region
    values = {
        "partition": iam.partition(region),
        "account": account,
        "region": region,
        "cluster": config.cluster_name,
        "bucket": _bucket(config),
    }
    statements = []
    for grant in chosen(config, commands):
        statements.append(
            {
                "Sid": grant.sid,
                "Effect": "Allow",
                "Action": list(grant.actions),
                "Resource": [r.format(**values) for r in grant.resources] if grant.resources != ("*",) else "*",
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}


def allowed(document: dict, action: str) -> bool:
    """Whether some statement of `document` allows `action` (its name only: IAM's case-insensitive
    match with wildcards)."""
    return any(
        action_allowed(s["Action"] if isinstance(s["Action"], list) else [s["Action"]], action)
        for s in document["Statement"]
    )


def chosen(config: ClusterConfig, commands: tuple[str, ...]) -> list[Grant]:
    """The grants `commands` need for `config`."""
    return [g for g in GRANTS if set(g.commands) & set(commands) and g.needed(config)]
