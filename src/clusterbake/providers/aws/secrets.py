"""The join bundle of each node group, kept in Secrets Manager for nodes to fetch at boot.

Secret `clusterbake/<cluster>/join/<nodegroup>`, tagged `clusterbake:cluster=<cluster>`
and `clusterbake:nodegroup=<nodegroup>`; the node role (iam.py) may read
`clusterbake/<cluster>/*` and nothing else. The value holds the munge key: nothing here
prints or logs it, and no error message built here contains it.

Versions: `publish` writes a new version only when the value differs from the
AWSCURRENT one, with a ClientRequestToken derived from a digest of the value and of
the version it replaces. A call retried after a lost response (throttling, a dropped
connection) carries the same token and so creates no second version; publishing A,
then B, then A again gives three versions with AWSCURRENT on the last (a token of the
value alone would make the third call a no-op that leaves AWSCURRENT on B).

ListSecrets is eventually consistent (AWS documents that it may miss changes of the
last minutes), so `find` and `delete_all` also look up the node groups they are given
by name (DescribeSecret is consistent).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from botocore.exceptions import ClientError

from clusterbake.errors import ClusterbakeError
from clusterbake.progress import say
from clusterbake.providers import join_envelope
from clusterbake.providers.aws import tags
from clusterbake.providers.aws.api import call, error_code, paginate

MAX_VALUE_BYTES = 65536  # Secrets Manager's limit for SecretString
AWS_MANAGED_KEY = ""  # UpdateSecret KmsKeyId "": back to the AWS managed key aws/secretsmanager
NOT_FOUND = frozenset({"ResourceNotFoundException"})


def secret_name(cluster: str, nodegroup: str) -> str:
    return f"clusterbake/{cluster}/join/{nodegroup}"


def _describe(sm, name: str) -> dict | None:
    try:
        return call(sm.describe_secret, SecretId=name)
    except ClientError as exc:
        if error_code(exc) in NOT_FOUND:
            return None
        raise


def _check_owner(secret: dict, cluster: str) -> None:
    if tags.as_dict(secret.get("Tags")).get(tags.CLUSTER) != cluster:
        raise ClusterbakeError(
            f"secret {secret['Name']} exists but is not tagged {tags.CLUSTER}={cluster}; "
            "rename the cluster or delete that secret"
        )


# A name force-deleted moments ago is still held while Secrets Manager deletes it in the
# background (DeleteSecret: "use appropriate back off and retry logic"): `down` then `up`.
NAME_RELEASE_WAIT = 120.0
BEING_DELETED = "InvalidRequestException"


def ensure_secret(sm, cluster: str, nodegroup: str, kms_key_arn: str | None = None, kms=None) -> str:
    """The ARN of the node group's secret, created without a value when missing.

    `kms_key_arn` (iam.resolve_kms_key) encrypts it; None: the AWS managed key. An existing
    secret under another key is switched (UpdateSecret re-encrypts the AWSCURRENT/AWSPREVIOUS
    versions); DescribeSecret names its key by key ID or alias ARN, so that is resolved
    (DescribeKey, `kms`) before it is compared. A secret of this cluster scheduled for
    deletion is restored; one not tagged for this cluster is refused. A name still being
    deleted (a force delete moments ago) is waited for, up to NAME_RELEASE_WAIT.
    """
    name = secret_name(cluster, nodegroup)
    deadline = time.monotonic() + NAME_RELEASE_WAIT
    while True:
        try:
            secret = _existing_or_created(sm, cluster, nodegroup, kms_key_arn)
            break
        except ClientError as exc:
            if error_code(exc) != BEING_DELETED or time.monotonic() > deadline:
                raise
            say(f"    secret {name}: still being deleted, retrying")
            time.sleep(2)
    held = secret.get("KmsKeyId") or None
    if held and kms is not None and held != kms_key_arn:
        held = call(kms.describe_key, KeyId=held)["KeyMetadata"]["Arn"]  # a key ID or alias ARN, as its ARN
    if held != (kms_key_arn or None):
        call(sm.update_secret, SecretId=name, KmsKeyId=kms_key_arn or AWS_MANAGED_KEY)
    return secret["ARN"]


def _existing_or_created(sm, cluster: str, nodegroup: str, kms_key_arn: str | None) -> dict:
    """DescribeSecret's answer for the secret, made (CreateSecret) or restored first where needed."""
    name = secret_name(cluster, nodegroup)
    secret = _describe(sm, name)
    if secret is None:
        params: dict[str, Any] = {
            "Name": name,
            "Description": f"clusterbake cluster {cluster}: join bundle of node group {nodegroup} (munge key)",
            "Tags": tags.as_list({tags.CLUSTER: cluster, tags.NODEGROUP: nodegroup}),
        }
        if kms_key_arn:
            params["KmsKeyId"] = kms_key_arn
        try:
            return {**call(sm.create_secret, **params), "KmsKeyId": kms_key_arn}
        except ClientError as exc:
            if error_code(exc) != "ResourceExistsException":
                raise
            secret = _describe(sm, name)  # created meanwhile (a retried call)
            if secret is None:
                raise
    _check_owner(secret, cluster)
    if secret.get("DeletedDate"):
        call(sm.restore_secret, SecretId=name)
    return secret


def _current(sm, name: str) -> tuple[str | None, str | None]:
    """(AWSCURRENT version id, its SecretString); (None, None) while the secret has no value."""
    try:
        found = call(sm.get_secret_value, SecretId=name, VersionStage="AWSCURRENT")
    except ClientError as exc:
        if error_code(exc) in NOT_FOUND:
            return None, None
        raise
    return found.get("VersionId"), found.get("SecretString")


def has_value(sm, cluster: str, nodegroup: str) -> bool:
    """Whether the node group's secret has a value (nodes booted before the first publish wait for it)."""
    return _current(sm, secret_name(cluster, nodegroup))[0] is not None


def version_token(value: str, replaces: str | None) -> str:
    """ClientRequestToken of a new version: the same for a retried call, new for every change."""
    digest = hashlib.sha256()
    digest.update(f"clusterbake-join-v1\n{replaces or '-'}\n".encode())
    digest.update(value.encode())
    return digest.hexdigest()  # 64 characters: Secrets Manager takes 32 to 64


def check_size(nodegroup: str, value: str) -> None:
    size = len(value.encode())
    if size > MAX_VALUE_BYTES:
        raise join_envelope.too_large(nodegroup, f"{size} bytes", f"a Secrets Manager secret ({MAX_VALUE_BYTES} bytes)")


def publish(sm, cluster: str, nodegroup: str, value: str) -> bool:
    """Make `value` the AWSCURRENT value of the node group's secret, and the version it
    replaces unlabelled (not AWSPREVIOUS); True when it changed.

    The secret must exist (ensure_secret). The same value again: no call that writes,
    no new version, False.
    """
    name = secret_name(cluster, nodegroup)
    check_size(nodegroup, value)
    version, current = _current(sm, name)
    if current == value:
        return False
    call(sm.put_secret_value, SecretId=name, SecretString=value, ClientRequestToken=version_token(value, version))
    if version is not None:
        # The replaced bundle (an old munge key) keeps no label: nodes may read only AWSCURRENT
        # (iam.node_policy), and Secrets Manager deletes unlabelled versions in time.
        call(sm.update_secret_version_stage, SecretId=name, VersionStage="AWSPREVIOUS", RemoveFromVersionId=version)
    return True


def _listed(sm, cluster: str) -> list[dict]:
    # tag-key and tag-value filters match independently (any key, any value): keep
    # only secrets whose clusterbake:cluster tag is this cluster.
    found = paginate(
        sm,
        "list_secrets",
        "SecretList",
        IncludePlannedDeletion=True,
        Filters=[{"Key": "tag-key", "Values": [tags.CLUSTER]}, {"Key": "tag-value", "Values": [cluster]}],
    )
    return [s for s in found if tags.as_dict(s.get("Tags")).get(tags.CLUSTER) == cluster]


def find(sm, cluster: str, nodegroups: tuple[str, ...] | list[str] = ()) -> list[dict]:
    """The cluster's secrets (metadata only, never values): ListSecrets by tag, plus the
    given node groups' secrets by name (ListSecrets may lag behind a fresh CreateSecret)."""
    by_name = {s["Name"]: s for s in _listed(sm, cluster)}
    for nodegroup in nodegroups:
        name = secret_name(cluster, nodegroup)
        if name not in by_name:
            secret = _describe(sm, name)
            if secret is not None and tags.as_dict(secret.get("Tags")).get(tags.CLUSTER) == cluster:
                by_name[name] = secret
    return [by_name[n] for n in sorted(by_name)]


def delete_all(sm, cluster: str, nodegroups: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Delete every secret of the cluster at once; returns their names.

    ForceDeleteWithoutRecovery: `cluster down` must leave no secret behind, and the next
    `cluster up` must be able to create the same names right away. A recovery window (7
    to 30 days) would keep each name taken until it ends: CreateSecret of that name
    fails meanwhile. Nothing would be recovered from it anyway: the next `up` writes a
    new bundle.
    """
    removed = []
    for secret in find(sm, cluster, nodegroups):
        try:
            call(sm.delete_secret, SecretId=secret["ARN"], ForceDeleteWithoutRecovery=True)
        except ClientError as exc:
            if error_code(exc) not in NOT_FOUND:
                raise
            continue
        removed.append(secret["Name"])
    return removed
