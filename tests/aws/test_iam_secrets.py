"""The node role and instance profile (iam.py) and the join-bundle secrets (secrets.py).

Against the real moto_server of conftest.py (IAM, STS, KMS and Secrets Manager are
moto's own), except:

- EC2's answer to an instance profile that IAM has created but EC2 does not know yet
  (InvalidParameterValue "Invalid IAM Instance Profile name", ~10 s after creation):
  moto's IAM and EC2 are consistent at once, so `call_while_profile_not_ready` is
  tested with botocore's Stubber (RunInstances checked against the EC2 model).
- moto 5.2.5 does not implement IAM ListInstanceProfileTags (HTTP 500): iam.py does
  not use it; GetRole and GetInstanceProfile return the tags, in AWS and in moto.

What moto does as AWS does, and these tests rely on: ListSecrets' tag-key and
tag-value filters match independently (a secret of another cluster with some other
tag whose value is this cluster's name is listed too, and must be filtered out);
PutSecretValue with a ClientRequestToken already used for the same value is a no-op
(moto uses the token as the VersionId); GetRole/GetRolePolicy return policy
documents that boto3 decodes into dicts.
"""

from __future__ import annotations

import json
import time

import botocore.session
import pytest
from awstest import ACCOUNT, authorizing_server
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.providers.aws import api, iam, secrets

REGION = "us-east-1"


def _writes(client) -> list[str]:
    """The names of the calls `client` makes from now on that are not reads."""
    made: list[str] = []

    def record(model, **_):
        if not model.name.startswith(("Get", "List", "Describe")):
            made.append(model.name)

    client.meta.events.register("before-call.*.*", record)
    return made


# --- the node role -----------------------------------------------------------------


def test_node_role_is_created_once(moto):
    client, sts = moto.client("iam"), moto.client("sts")
    name, arn, created = iam.ensure_node_role(client, sts, "roleonce", REGION)
    assert (name, created) == ("clusterbake-roleonce-node", True)
    assert arn == f"arn:aws:iam::{ACCOUNT}:instance-profile/clusterbake/clusterbake-roleonce-node"
    role = client.get_role(RoleName=name)["Role"]
    assert role["Path"] == "/clusterbake/"
    assert {"Key": "clusterbake:cluster", "Value": "roleonce"} in role["Tags"]
    assert role["AssumeRolePolicyDocument"] == {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
    }
    profile = client.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == [name]
    assert {"Key": "clusterbake:cluster", "Value": "roleonce"} in profile["Tags"]
    assert client.list_role_policies(RoleName=name)["PolicyNames"] == ["clusterbake-node"]

    writes = _writes(client)
    assert iam.ensure_node_role(client, sts, "roleonce", REGION) == (name, arn, False)
    assert writes == []  # unchanged: not even the policy is put again

    iam.ensure_node_role(client, sts, "roleonce", REGION, s3_buckets=["roleonce-data"])
    assert writes == ["PutRolePolicy"]
    assert iam.delete_node_role(client, "roleonce")


def _statements(client, cluster: str) -> list[dict]:
    doc = client.get_role_policy(RoleName=iam.node_role_name(cluster), PolicyName="clusterbake-node")
    document = doc["PolicyDocument"]
    return (json.loads(document) if isinstance(document, str) else document)["Statement"]


def test_policy_allows_only_this_clusters_secrets(moto):
    client, sts, kms = moto.client("iam"), moto.client("sts"), moto.client("kms")
    key = iam.resolve_kms_key(kms, kms.create_key()["KeyMetadata"]["KeyId"])
    iam.ensure_node_role(client, sts, "pol", REGION, kms_key_arn=key, s3_buckets=["pol-data", "pol-ckpt"])
    statements = _statements(client, "pol")
    by_sid = {s["Sid"]: s for s in statements}
    assert set(by_sid) == {"JoinBundles", "JoinBundleMetadata", "JoinBundleKey", "DataBuckets", "DataObjects"}
    assert all(s["Effect"] == "Allow" and "NotAction" not in s and "NotResource" not in s for s in statements)

    secrets_statement = by_sid["JoinBundles"]
    assert secrets_statement["Action"] == "secretsmanager:GetSecretValue"
    assert secrets_statement["Resource"] == f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:clusterbake/pol/*"
    # The current version only (Secrets Manager's condition key for the stage a request names).
    assert secrets_statement["Condition"] == {"StringEquals": {"secretsmanager:VersionStage": "AWSCURRENT"}}
    assert by_sid["JoinBundleMetadata"]["Action"] == "secretsmanager:DescribeSecret"
    assert by_sid["JoinBundleMetadata"]["Resource"] == secrets_statement["Resource"]

    assert by_sid["JoinBundleKey"]["Action"] == "kms:Decrypt"
    assert by_sid["JoinBundleKey"]["Resource"] == key
    assert by_sid["JoinBundleKey"]["Condition"] == {
        "StringEquals": {"kms:ViaService": f"secretsmanager.{REGION}.amazonaws.com"}
    }

    assert by_sid["DataBuckets"]["Action"] == "s3:ListBucket"
    assert by_sid["DataBuckets"]["Resource"] == ["arn:aws:s3:::pol-ckpt", "arn:aws:s3:::pol-data"]
    assert sorted(by_sid["DataObjects"]["Action"]) == [
        "s3:AbortMultipartUpload",
        "s3:DeleteObject",
        "s3:GetObject",
        "s3:PutObject",
    ]
    assert by_sid["DataObjects"]["Resource"] == ["arn:aws:s3:::pol-ckpt/*", "arn:aws:s3:::pol-data/*"]

    # No wildcard action, no resource outside the above.
    for statement in statements:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        assert not any("*" in a for a in actions)
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        assert "*" not in resources

    # Without a key and buckets: the secrets statements alone.
    iam.ensure_node_role(client, sts, "pol", REGION)
    assert [s["Sid"] for s in _statements(client, "pol")] == ["JoinBundles", "JoinBundleMetadata"]
    iam.delete_node_role(client, "pol")


def test_policy_arns_follow_the_partition():
    key = "arn:aws-cn:kms:cn-north-1:123456789012:key/0c1a2b3c-1111-2222-3333-444455556666"
    policy = iam.node_policy("c", "cn-north-1", "123456789012", key, ["cn-data"])
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert (
        by_sid["JoinBundles"]["Resource"] == "arn:aws-cn:secretsmanager:cn-north-1:123456789012:secret:clusterbake/c/*"
    )
    assert by_sid["JoinBundleKey"]["Condition"]["StringEquals"]["kms:ViaService"] == (
        "secretsmanager.cn-north-1.amazonaws.com.cn"
    )
    assert by_sid["DataBuckets"]["Resource"] == ["arn:aws-cn:s3:::cn-data"]
    gov = iam.node_policy("c", "us-gov-west-1", "123456789012")
    assert gov["Statement"][0]["Resource"].startswith("arn:aws-us-gov:secretsmanager:us-gov-west-1:")
    with pytest.raises(ClusterbakeError, match="not a key ARN"):
        iam.node_policy("c", "us-east-1", "123456789012", "alias/mine")
    with pytest.raises(ClusterbakeError, match="not a bucket name"):
        iam.node_policy("c", "us-east-1", "123456789012", None, ["s3://bucket/prefix"])


def test_role_or_profile_of_another_owner_is_refused(moto):
    client, sts = moto.client("iam"), moto.client("sts")
    client.create_role(RoleName="clusterbake-taken-node", AssumeRolePolicyDocument=json.dumps(iam.TRUST_POLICY))
    with pytest.raises(
        ClusterbakeError, match="IAM role clusterbake-taken-node exists but is not tagged clusterbake:cluster=taken"
    ):
        iam.ensure_node_role(client, sts, "taken", REGION)
    assert client.list_role_policies(RoleName="clusterbake-taken-node")["PolicyNames"] == []
    assert iam.delete_node_role(client, "taken") == []  # not ours: left alone
    client.get_role(RoleName="clusterbake-taken-node")

    client.create_instance_profile(InstanceProfileName="clusterbake-taken2-node")
    with pytest.raises(ClusterbakeError, match="instance profile clusterbake-taken2-node exists but is not tagged"):
        iam.ensure_node_role(client, sts, "taken2", REGION)
    with pytest.raises(ClientError, match="NoSuchEntity"):  # refused before anything was created
        client.get_role(RoleName="clusterbake-taken2-node")
    assert iam.delete_node_role(client, "taken2") == []
    client.get_instance_profile(InstanceProfileName="clusterbake-taken2-node")


def test_delete_removes_everything_and_then_finds_nothing(moto):
    client, sts = moto.client("iam"), moto.client("sts")
    name, _, _ = iam.ensure_node_role(client, sts, "gone", REGION)
    managed = client.create_policy(
        PolicyName="gone-extra", PolicyDocument=json.dumps(iam.node_policy("x", REGION, ACCOUNT))
    )
    client.attach_role_policy(RoleName=name, PolicyArn=managed["Policy"]["Arn"])
    client.put_role_policy(
        RoleName=name, PolicyName="added-by-hand", PolicyDocument=json.dumps(iam.node_policy("x", REGION, ACCOUNT))
    )
    assert set(iam.find(client, "gone")) == {"role", "instance_profile"}

    assert iam.delete_node_role(client, "gone") == [f"instance profile {name}", f"role {name}"]
    assert iam.find(client, "gone") == {}
    for call in (lambda: client.get_role(RoleName=name), lambda: client.get_instance_profile(InstanceProfileName=name)):
        with pytest.raises(ClientError, match="NoSuchEntity"):
            call()
    assert iam.delete_node_role(client, "gone") == []
    client.get_policy(PolicyArn=managed["Policy"]["Arn"])  # detached, not deleted


def test_kms_key_is_resolved_to_its_arn(moto):
    kms = moto.client("kms")
    key = kms.create_key()["KeyMetadata"]
    kms.create_alias(AliasName="alias/clusterbake-test", TargetKeyId=key["KeyId"])
    for given in (
        key["KeyId"],
        key["Arn"],
        "alias/clusterbake-test",
        f"arn:aws:kms:{REGION}:{ACCOUNT}:alias/clusterbake-test",
    ):
        assert iam.resolve_kms_key(kms, given) == key["Arn"]
    with pytest.raises(ConfigError, match=r"aws\.kms_key_id: KMS key 'alias/nothing' does not exist in us-east-1"):
        iam.resolve_kms_key(kms, "alias/nothing")
    with pytest.raises(ConfigError, match=r"aws\.kms_key_id"):
        iam.resolve_kms_key(kms, "0c1a2b3c-1111-2222-3333-444455556666")
    kms.disable_key(KeyId=key["KeyId"])
    with pytest.raises(ConfigError, match="is Disabled, not Enabled"):
        iam.resolve_kms_key(kms, "alias/clusterbake-test")


def _ec2_stub_client():
    return botocore.session.get_session().create_client(
        "ec2", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )


NOT_READY = (
    "Value (clusterbake-c-node) for parameter iamInstanceProfile.name is invalid. Invalid IAM Instance Profile name"
)


def test_a_new_profile_is_waited_for():
    client = _ec2_stub_client()
    sleeps: list[float] = []
    params = {
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": "cb-run-gpu-1",
        "LaunchTemplate": {"LaunchTemplateId": "lt-0123456789abcdef0"},
    }
    with Stubber(client) as stub:
        stub.add_client_error("run_instances", "InvalidParameterValue", NOT_READY, expected_params=params)
        stub.add_client_error("run_instances", "RequestLimitExceeded", "slow down", expected_params=params)
        stub.add_client_error("run_instances", "InvalidParameterValue", NOT_READY, expected_params=params)
        stub.add_response("run_instances", {"Instances": [{"InstanceId": "i-0123456789abcdef0"}]}, params)
        answer = iam.call_while_profile_not_ready(client.run_instances, sleep=sleeps.append, poll=5.0, **params)
        stub.assert_no_pending_responses()
    assert answer["Instances"][0]["InstanceId"] == "i-0123456789abcdef0"
    assert sleeps.count(5.0) == 2 and len(sleeps) == 3  # two profile waits, one throttling backoff


def test_a_profile_iam_has_not_spread_yet_is_refused_by_the_twin_and_waited_for(moto, network):
    """The EC2 twin refuses a profile for its first seconds, with EC2's words (realcloud review D4):
    a plain association fails, the head's (call_while_profile_not_ready) goes through."""
    client, ec2 = moto.client("iam"), moto.ec2()
    instance = ec2.run_instances(ImageId=network.ami_id, InstanceType="t3.micro", MinCount=1, MaxCount=1,
                                 SubnetId=network.subnet_id)["Instances"][0]["InstanceId"]  # fmt: skip
    client.create_role(RoleName="spread-role", AssumeRolePolicyDocument=json.dumps(iam.TRUST_POLICY))
    client.create_instance_profile(InstanceProfileName="spread-profile")
    client.add_role_to_instance_profile(InstanceProfileName="spread-profile", RoleName="spread-role")
    with pytest.raises(ClientError) as refused:
        ec2.associate_iam_instance_profile(InstanceId=instance, IamInstanceProfile={"Name": "spread-profile"})
    assert iam.profile_not_ready(refused.value), refused.value.response["Error"]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(seconds)

    iam.call_while_profile_not_ready(ec2.associate_iam_instance_profile, sleep=sleep, poll=1.0,
                                     InstanceId=instance, IamInstanceProfile={"Name": "spread-profile"})  # fmt: skip
    assert sleeps, "the twin took a profile made a moment ago"
    ec2.terminate_instances(InstanceIds=[instance])
    client.remove_role_from_instance_profile(InstanceProfileName="spread-profile", RoleName="spread-role")
    client.delete_instance_profile(InstanceProfileName="spread-profile")
    client.delete_role(RoleName="spread-role")


def test_other_invalid_parameters_are_not_retried():
    client = _ec2_stub_client()
    with Stubber(client) as stub:
        stub.add_client_error("run_instances", "InvalidParameterValue", "Invalid value 'p9.huge' for InstanceType.")
        with pytest.raises(ClientError, match=r"p9\.huge"):
            iam.call_while_profile_not_ready(client.run_instances, sleep=pytest.fail, MinCount=1, MaxCount=1)
    arn_form = ClientError(
        {
            "Error": {
                "Code": "InvalidParameterValue",
                "Message": "Value (arn:aws:iam::1:instance-profile/x) for parameter iamInstanceProfile.arn "
                "is invalid. Invalid IAM Instance Profile ARN",
            }
        },
        "RunInstances",
    )
    assert iam.profile_not_ready(arn_form)
    assert not iam.profile_not_ready(
        ClientError({"Error": {"Code": "InvalidParameterCombination", "Message": NOT_READY}}, "RunInstances")
    )


# --- join-bundle secrets -----------------------------------------------------------


def _versions(sm, name: str) -> list[dict]:
    return sm.list_secret_version_ids(SecretId=name, IncludeDeprecated=True)["Versions"]


def test_secret_is_created_once_and_tagged(moto):
    sm = moto.client("secretsmanager")
    arn = secrets.ensure_secret(sm, "sec1", "gpu")
    assert arn.startswith(f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:clusterbake/sec1/join/gpu-")
    writes = _writes(sm)
    assert secrets.ensure_secret(sm, "sec1", "gpu") == arn
    assert writes == []
    described = sm.describe_secret(SecretId="clusterbake/sec1/join/gpu")
    assert {t["Key"]: t["Value"] for t in described["Tags"]} == {
        "clusterbake:cluster": "sec1",
        "clusterbake:nodegroup": "gpu",
    }
    assert "join bundle of node group gpu" in described["Description"]
    assert "KmsKeyId" not in described or not described["KmsKeyId"]
    assert [s["Name"] for s in secrets.find(sm, "sec1")] == ["clusterbake/sec1/join/gpu"]
    secrets.delete_all(sm, "sec1")


def test_publish_writes_a_version_only_when_the_value_changes(moto):
    sm = moto.client("secretsmanager")
    name = "clusterbake/pub/join/cpu"
    secrets.ensure_secret(sm, "pub", "cpu")
    assert secrets.publish(sm, "pub", "cpu", '{"munge": "A"}') is True
    [first] = _versions(sm, name)
    assert first["VersionId"] == secrets.version_token('{"munge": "A"}', None)

    writes = _writes(sm)
    assert secrets.publish(sm, "pub", "cpu", '{"munge": "A"}') is False
    assert writes == [] and len(_versions(sm, name)) == 1

    # A, B, then A again: each a change, AWSCURRENT on the last one.
    assert secrets.publish(sm, "pub", "cpu", '{"munge": "B"}') is True
    assert secrets.publish(sm, "pub", "cpu", '{"munge": "A"}') is True
    assert sm.get_secret_value(SecretId=name)["SecretString"] == '{"munge": "A"}'
    assert len(_versions(sm, name)) == 3

    # The retry of a PutSecretValue whose answer was lost carries the same token: no new version.
    current = sm.get_secret_value(SecretId=name)["VersionId"]
    token = secrets.version_token('{"munge": "C"}', current)
    for _ in range(2):
        sm.put_secret_value(SecretId=name, SecretString='{"munge": "C"}', ClientRequestToken=token)
    assert len(_versions(sm, name)) == 4
    assert secrets.publish(sm, "pub", "cpu", '{"munge": "C"}') is False
    secrets.delete_all(sm, "pub")


def test_a_bundle_over_secrets_managers_64_kib_is_refused_naming_what_to_change(moto):
    """The same error as the azure provider's (join_envelope.too_large), before anything is written."""
    sm = moto.client("secretsmanager")
    secrets.ensure_secret(sm, "big", "cpu")
    writes = _writes(sm)
    with pytest.raises(ClusterbakeError) as refused:
        secrets.publish(sm, "big", "cpu", "x" * 65537)
    assert str(refused.value).startswith("join bundle of node group cpu: 65537 bytes, more than a Secrets Manager")
    assert "nothing was published" in str(refused.value) and "node_groups[].count / max_count" in str(refused.value)
    assert writes == [] and not secrets.has_value(sm, "big", "cpu")
    assert secrets.publish(sm, "big", "cpu", "x" * 65536) is True
    secrets.delete_all(sm, "big")


def test_a_replaced_bundle_keeps_no_stage(moto):
    """After a publish only the new bundle has a stage: no AWSPREVIOUS holding the old munge key."""
    sm = moto.client("secretsmanager")
    name = "clusterbake/stage/join/cpu"
    secrets.ensure_secret(sm, "stage", "cpu")
    secrets.publish(sm, "stage", "cpu", '{"munge": "old"}')
    secrets.publish(sm, "stage", "cpu", '{"munge": "new"}')
    stages = {v["VersionId"]: v.get("VersionStages", []) for v in _versions(sm, name)}
    current = sm.get_secret_value(SecretId=name, VersionStage="AWSCURRENT")["VersionId"]
    assert {version: s for version, s in stages.items() if s} == {current: ["AWSCURRENT"]}
    with pytest.raises(ClientError) as raised:
        sm.get_secret_value(SecretId=name, VersionStage="AWSPREVIOUS")
    assert raised.value.response["Error"]["Code"] == "ResourceNotFoundException"
    secrets.delete_all(sm, "stage")


def test_the_node_policy_reads_only_the_current_bundle(tmp_path_factory):
    """The node policy as iam.node_policy writes it, evaluated by the EC2 twin's IAM (moto's, with
    the twin's conditions) with authorization on: the current version with its stage named, nothing
    else, not an old version by id nor the stage a request leaves out."""
    with authorizing_server(tmp_path_factory.mktemp("moto-auth")) as twin:
        client, session = twin.client, twin.session
        sm = client("secretsmanager")
        name = "clusterbake/reader/join/cpu"
        secrets.ensure_secret(sm, "reader", "cpu")
        secrets.publish(sm, "reader", "cpu", '{"munge": "old"}')
        old = sm.get_secret_value(SecretId=name, VersionStage="AWSCURRENT")["VersionId"]
        secrets.publish(sm, "reader", "cpu", '{"munge": "new"}')
        # A role with the node policy, assumable here by the administrator (the node role trusts EC2 only).
        node = client("secretsmanager", **session("node-policy", iam.node_policy("reader", REGION, ACCOUNT)))
        assert node.get_secret_value(SecretId=name, VersionStage="AWSCURRENT")["SecretString"] == '{"munge": "new"}'
        for refused in ({"VersionId": old}, {}, {"VersionStage": "AWSPREVIOUS"}):
            with pytest.raises(ClientError) as raised:
                node.get_secret_value(SecretId=name, **refused)
            # moto answers a JSON service's denial in IAM's XML (AWS: AccessDeniedException): 403 and AccessDenied.
            answer = raised.value.response
            assert answer["ResponseMetadata"]["HTTPStatusCode"] == 403, refused
            assert "<Code>AccessDenied</Code>" in answer["Error"]["Message"], refused
        node.describe_secret(SecretId=name)  # metadata: allowed


def test_values_are_never_printed(moto, capsys):
    sm = moto.client("secretsmanager")
    value = "munge-key-material-0123456789abcdef"
    secrets.ensure_secret(sm, "quiet", "gpu")
    secrets.publish(sm, "quiet", "gpu", value)
    secrets.publish(sm, "quiet", "gpu", value)
    with pytest.raises(ClusterbakeError) as info:
        secrets.publish(sm, "quiet", "gpu", value * 2000)
    assert "65536" in str(info.value) and value not in str(info.value)
    secrets.delete_all(sm, "quiet")
    out = capsys.readouterr()
    assert value not in out.out + out.err


def test_secret_of_another_owner_is_refused(moto):
    sm = moto.client("secretsmanager")
    sm.create_secret(Name="clusterbake/taken/join/gpu", Tags=[{"Key": "clusterbake:cluster", "Value": "someone"}])
    with pytest.raises(
        ClusterbakeError, match="secret clusterbake/taken/join/gpu exists but is not tagged clusterbake:cluster=taken"
    ):
        secrets.ensure_secret(sm, "taken", "gpu")
    assert secrets.delete_all(sm, "taken", ["gpu"]) == []
    sm.describe_secret(SecretId="clusterbake/taken/join/gpu")


def test_find_keeps_only_this_clusters_tag(moto):
    sm = moto.client("secretsmanager")
    secrets.ensure_secret(sm, "mine", "gpu")
    # Listed by ListSecrets' filters (tag-key and tag-value match independently), not ours.
    sm.create_secret(
        Name="clusterbake/other/join/gpu",
        Tags=[{"Key": "clusterbake:cluster", "Value": "other"}, {"Key": "owner", "Value": "mine"}],
    )
    listed = sm.list_secrets(
        Filters=[{"Key": "tag-key", "Values": ["clusterbake:cluster"]}, {"Key": "tag-value", "Values": ["mine"]}]
    )["SecretList"]
    assert "clusterbake/other/join/gpu" in [s["Name"] for s in listed]
    assert [s["Name"] for s in secrets.find(sm, "mine")] == ["clusterbake/mine/join/gpu"]
    assert secrets.delete_all(sm, "mine") == ["clusterbake/mine/join/gpu"]
    sm.describe_secret(SecretId="clusterbake/other/join/gpu")
    sm.delete_secret(SecretId="clusterbake/other/join/gpu", ForceDeleteWithoutRecovery=True)


def test_delete_all_leaves_nothing_and_the_next_up_makes_the_same_names_once_aws_lets_them_go(moto):
    sm = moto.client("secretsmanager")
    for group in ("head", "gpu", "cpu"):
        secrets.ensure_secret(sm, "del", group)
        secrets.publish(sm, "del", group, f"bundle of {group}")
    # One already scheduled for deletion (by hand, with a recovery window): removed for good too.
    sm.delete_secret(SecretId="clusterbake/del/join/cpu", RecoveryWindowInDays=7)
    assert secrets.delete_all(sm, "del") == [
        "clusterbake/del/join/cpu",
        "clusterbake/del/join/gpu",
        "clusterbake/del/join/head",
    ]
    assert secrets.find(sm, "del", ["head", "gpu", "cpu"]) == []
    assert (
        sm.list_secrets(IncludePlannedDeletion=True, Filters=[{"Key": "tag-value", "Values": ["del"]}])["SecretList"]
        == []
    )
    assert secrets.delete_all(sm, "del", ["head", "gpu", "cpu"]) == []
    # AWS deletes in the background: the name is still held for a moment (the twin: 3 s)...
    with pytest.raises(ClientError) as held:
        sm.create_secret(Name="clusterbake/del/join/gpu")
    assert held.value.response["Error"]["Code"] == "InvalidRequestException"
    assert "scheduled for deletion" in held.value.response["Error"]["Message"]
    # ... and the next `cluster up` waits for it (realcloud review A10) instead of failing.
    secrets.ensure_secret(sm, "del", "gpu")
    assert secrets.publish(sm, "del", "gpu", "new bundle") is True
    assert secrets.delete_all(sm, "del") == ["clusterbake/del/join/gpu"]


def test_a_secret_scheduled_for_deletion_is_restored(moto):
    sm = moto.client("secretsmanager")
    secrets.ensure_secret(sm, "restore", "gpu")
    secrets.publish(sm, "restore", "gpu", "bundle")
    sm.delete_secret(SecretId="clusterbake/restore/join/gpu", RecoveryWindowInDays=7)
    secrets.ensure_secret(sm, "restore", "gpu")
    assert "DeletedDate" not in sm.describe_secret(SecretId="clusterbake/restore/join/gpu")
    assert secrets.publish(sm, "restore", "gpu", "bundle") is False
    secrets.delete_all(sm, "restore")


def test_secret_follows_the_configured_key(moto):
    """DescribeSecret names the key by its ID (or an alias ARN), the config by its ARN: resolved before
    they are compared, so a second `up` re-encrypts nothing (realcloud review A10)."""
    sm, kms = moto.client("secretsmanager"), moto.client("kms")
    first = kms.create_key()["KeyMetadata"]
    second = kms.create_key()["KeyMetadata"]["Arn"]
    kms.create_alias(AliasName="alias/keyed-first", TargetKeyId=first["KeyId"])
    name = "clusterbake/keyed/join/gpu"
    secrets.ensure_secret(sm, "keyed", "gpu", first["Arn"], kms=kms)
    assert sm.describe_secret(SecretId=name)["KmsKeyId"] == first["KeyId"]  # as AWS answers: the key ID
    writes = _writes(sm)
    secrets.ensure_secret(sm, "keyed", "gpu", first["Arn"], kms=kms)
    assert writes == []
    sm.update_secret(SecretId=name, KmsKeyId="alias/keyed-first")  # by hand, the same key by its alias
    assert sm.describe_secret(SecretId=name)["KmsKeyId"] == f"arn:aws:kms:{REGION}:{ACCOUNT}:alias/keyed-first"
    writes.clear()
    secrets.ensure_secret(sm, "keyed", "gpu", first["Arn"], kms=kms)
    assert writes == []
    secrets.ensure_secret(sm, "keyed", "gpu", second, kms=kms)
    assert sm.describe_secret(SecretId=name)["KmsKeyId"] == second.rsplit("/", 1)[1]
    secrets.ensure_secret(sm, "keyed", "gpu", kms=kms)
    assert not sm.describe_secret(SecretId=name).get("KmsKeyId")
    assert writes == ["UpdateSecret", "UpdateSecret"]
    secrets.delete_all(sm, "keyed")


def test_iam_listings_follow_the_marker():
    client = botocore.session.get_session().create_client(
        "iam", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    with Stubber(client) as stub:
        stub.add_response(
            "list_role_policies", {"PolicyNames": ["a"], "IsTruncated": True, "Marker": "m1"}, {"RoleName": "r"}
        )
        stub.add_response(
            "list_role_policies", {"PolicyNames": ["b"], "IsTruncated": False}, {"RoleName": "r", "Marker": "m1"}
        )
        assert api.paginate(client, "list_role_policies", "PolicyNames", token_in="Marker", RoleName="r") == ["a", "b"]
        stub.assert_no_pending_responses()


def test_a_fresh_accounts_first_spot_launch_needs_the_spot_role_the_controller_makes(tmp_path_factory):
    """realcloud review A2, with authorization on: a role that may launch instances but not create
    service-linked roles (the head's) cannot launch the account's first Spot instance, as on EC2;
    once the controller made AWSServiceRoleForEC2Spot (`cluster up` with a Spot group) it can."""
    with authorizing_server(tmp_path_factory.mktemp("moto-spot")) as twin:
        client, session = twin.client, twin.session
        launches = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}]}
        ec2 = client("ec2", **session("launcher", launches))
        roles = client("iam")
        image = client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        spot = {"ImageId": image, "InstanceType": "c7a.large", "MinCount": 1, "MaxCount": 1,
                "InstanceMarketOptions": {"MarketType": "spot"}}  # fmt: skip
        with pytest.raises(ClientError) as refused:
            ec2.run_instances(**spot)
        assert refused.value.response["Error"]["Code"] == "AuthFailure.ServiceLinkedRoleCreationNotPermitted"
        # On-demand needs no such role.
        ec2.run_instances(**{k: v for k, v in spot.items() if k != "InstanceMarketOptions"})

        assert iam.ensure_spot_role(roles) is True
        made = roles.get_role(RoleName="AWSServiceRoleForEC2Spot")["Role"]
        assert made["Path"] == "/aws-service-role/spot.amazonaws.com/"
        assert iam.ensure_spot_role(roles) is False  # there: nothing to do
        with pytest.raises(ClientError, match="has been taken in this account"):
            roles.create_service_linked_role(AWSServiceName="spot.amazonaws.com")
        assert ec2.run_instances(**spot)["Instances"][0]["InstanceLifecycle"] == "spot"


def test_volumes_under_a_key_the_launcher_may_not_use_end_the_instance_and_the_power_program_says_why(
    tmp_path_factory, monkeypatch
):
    """realcloud review A8, with authorization on: EBS encryption by default under a customer managed key.
    A role that may launch but not use the key gets a yes from RunInstances and an instance that ends
    terminated with Client.InternalError (the twin, as EC2); the power program reports that as the node's
    failure instead of "ok". With the head policy's KMS statements (through EC2 only) it runs."""
    import programs

    with authorizing_server(tmp_path_factory.mktemp("moto-cmk")) as twin:
        client, session = twin.client, twin.session
        admin_ec2, kms = client("ec2"), client("kms")
        key = kms.create_key()["KeyMetadata"]["Arn"]
        admin_ec2.enable_ebs_encryption_by_default()
        admin_ec2.modify_ebs_default_kms_key_id(KmsKeyId=key)
        image = admin_ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        assert iam.volume_keys(admin_ec2, kms, image) == [key]
        launch = {"ImageId": image, "InstanceType": "c7a.large", "MinCount": 1, "MaxCount": 1}
        launches_only = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}],
        }
        ec2 = client("ec2", **session("launcher", launches_only))
        instance = ec2.run_instances(**launch)["Instances"][0]
        ended = ec2.describe_instances(InstanceIds=[instance["InstanceId"]])["Reservations"][0]["Instances"][0]
        assert ended["State"]["Name"] == "terminated"
        assert ended["StateReason"]["Code"] == "Client.InternalError"

        power = tmp_path_factory.mktemp("power")
        module = programs.power_program(monkeypatch, power / "state.json")
        settings = {"provider": "aws", "capacity_cooldown": 300, "log": str(power / "power.log"),
                    "aws": {"cluster": "cmk", "groups": {}, "capacity_errors": []}}  # fmt: skip
        backend = module.aws.AwsBackend(settings, client=ec2, sleep=lambda _: None)
        with pytest.raises(module.aws.LaunchEnded, match=r"ended while starting: Client.InternalError"):
            backend.settle(instance)
        assert "Client.InternalError" in backend.failure("gpu-1", module.aws.LaunchEnded("x Client.InternalError"))

        head = iam.head_policy("cmk", REGION, ACCOUNT, iam.HeadLaunches(
            subnet_id="subnet-0", security_group_id="sg-0", image_id=image, launch_template_ids=["lt-0"],
            instance_types=["c7a.large"], volume_keys=[key]))  # fmt: skip
        kms_statements = [s for s in head["Statement"] if s["Sid"].startswith("EncryptedVolume")]
        allowed = {"Version": "2012-10-17", "Statement": [*launches_only["Statement"], *kms_statements]}
        ec2 = client("ec2", **session("launcher-with-key", allowed))
        running = ec2.run_instances(**launch)["Instances"][0]
        backend._client = ec2
        backend.settle(running)  # no LaunchEnded
        admin_ec2.terminate_instances(InstanceIds=[running["InstanceId"]])


def test_a_launch_checks_every_resource_it_makes_or_names_and_the_tags_it_puts_on(tmp_path_factory):
    """realcloud review D3, with authorization on: RunInstances needs its volumes and interfaces, key
    pair and placement group, and ec2:CreateTags (ec2:CreateAction RunInstances) for what it tags."""
    with authorizing_server(tmp_path_factory.mktemp("moto-run")) as twin:
        client, session = twin.client, twin.session
        admin = client("ec2")
        image = admin.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        admin.create_key_pair(KeyName="team-key")
        admin.create_placement_group(GroupName="team-pg", Strategy="cluster")
        instance_tags = [{"ResourceType": "instance", "Tags": [{"Key": "k", "Value": "v"}]}]
        tagged = {"ImageId": image, "InstanceType": "c7a.large", "MinCount": 1, "MaxCount": 1, "KeyName": "team-key",
                  "Placement": {"GroupName": "team-pg"}, "TagSpecifications": instance_tags}  # fmt: skip
        arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}"

        def launcher(name: str, *statements: dict) -> object:
            return client("ec2", **session(name, {"Version": "2012-10-17", "Statement": list(statements)}))

        run = {"Effect": "Allow", "Action": "ec2:RunInstances", "Resource": [
            f"{arn}:instance/*", f"{arn}:volume/*", f"{arn}:network-interface/*", f"arn:aws:ec2:{REGION}::image/*",
            f"{arn}:subnet/*", f"{arn}:security-group/*"]}  # fmt: skip
        tags_at_launch = {"Effect": "Allow", "Action": "ec2:CreateTags", "Resource": f"{arn}:instance/*",
                          "Condition": {"StringEquals": {"ec2:CreateAction": "RunInstances"}}}  # fmt: skip
        named = {**run, "Resource": [f"{arn}:key-pair/team-key", f"{arn}:placement-group/team-pg"]}
        for name, statements in (("no-key-pair", [run, tags_at_launch]), ("no-tags", [run, named])):
            with pytest.raises(ClientError) as refused:
                launcher(name, *statements).run_instances(**tagged)
            assert refused.value.response["Error"]["Code"] in ("AccessDenied", "UnauthorizedOperation"), name
        tags_elsewhere = {**tags_at_launch, "Condition": {"StringEquals": {"ec2:CreateAction": "CreateVolume"}}}
        with pytest.raises(ClientError):
            launcher("tags-for-another-action", run, named, tags_elsewhere).run_instances(**tagged)
        made = launcher("everything", run, named, tags_at_launch).run_instances(**tagged)["Instances"][0]
        # From a launch template that carries its own tags (as clusterbake's do): those are the template's,
        # not the launch's, and need no permission of the launcher.
        template = admin.create_launch_template(
            LaunchTemplateName="team-lt",
            LaunchTemplateData={"ImageId": image, "InstanceType": "c7a.large", "TagSpecifications": [
                {"ResourceType": "volume", "Tags": [{"Key": "k", "Value": "v"}]}]},
            TagSpecifications=[{"ResourceType": "launch-template", "Tags": [{"Key": "k", "Value": "v"}]}],
        )["LaunchTemplate"]["LaunchTemplateId"]  # fmt: skip
        from_template = {"Effect": "Allow", "Action": "ec2:RunInstances", "Resource": f"{arn}:launch-template/*"}
        volume_tags = {**tags_at_launch, "Resource": [f"{arn}:instance/*", f"{arn}:volume/*"]}
        launched = launcher("from-template", run, from_template, volume_tags).run_instances(
            LaunchTemplate={"LaunchTemplateId": template}, MinCount=1, MaxCount=1, TagSpecifications=instance_tags
        )["Instances"][0]
        admin.terminate_instances(InstanceIds=[made["InstanceId"], launched["InstanceId"]])
