"""EBS encryption keys in the EC2 twin (realcloud review A8).

- The account's default key: moto 5.2.5 has EBS encryption by default
  (Enable/Disable/GetEbsEncryptionByDefault) but not the key it uses: GetEbsDefaultKmsKeyId,
  ModifyEbsDefaultKmsKeyId and ResetEbsDefaultKmsKeyId answer "not implemented". Here the
  account's key is kept per region: the AWS managed `alias/aws/ebs` (as its alias ARN, as EC2
  answers) until a customer managed key is set.
- A snapshot's key: moto's snapshot of an encrypted volume says Encrypted but no KmsKeyId;
  EC2's has its volume's key.
- An AMI's snapshots: moto's RegisterImage ignores BlockDeviceMappings and gives every image a
  new unencrypted snapshot, so no AMI could be encrypted; here the root device's snapshot of
  the request is the image's.

- A launch whose volumes need a customer managed key the caller may not use through EC2
  (kms:CreateGrant for an AWS resource, kms:Decrypt, kms:GenerateDataKeyWithoutPlaintext,
  kms:DescribeKey): RunInstances says yes and the instance then goes from pending to terminated
  with StateReason Client.InternalError (the AWS knowledge-center article "kms-launch-ec2-instance").
  Here the instance is terminated at once with that reason (moto_ext runs the check).
"""

from __future__ import annotations

from moto.core.responses import ActionResult
from moto.ec2.models.elastic_block_store import EBSBackend
from moto.ec2.responses import EC2Response

_DEFAULT_KEYS: dict[tuple[str, str], str] = {}


def _aws_managed(response: EC2Response) -> str:
    return f"arn:{response.partition}:kms:{response.region}:{response.current_account}:alias/aws/ebs"


def get_ebs_default_kms_key_id(self: EC2Response) -> ActionResult:
    key = _DEFAULT_KEYS.get((self.current_account, self.region)) or _aws_managed(self)
    return ActionResult({"KmsKeyId": key})


def modify_ebs_default_kms_key_id(self: EC2Response) -> ActionResult:
    _DEFAULT_KEYS[(self.current_account, self.region)] = self._get_param("KmsKeyId")
    return get_ebs_default_kms_key_id(self)


def reset_ebs_default_kms_key_id(self: EC2Response) -> ActionResult:
    _DEFAULT_KEYS.pop((self.current_account, self.region), None)
    return get_ebs_default_kms_key_id(self)


_create_snapshot = EBSBackend.create_snapshot


def create_snapshot(self: EBSBackend, volume_id: str, *args, **kwargs):
    snapshot = _create_snapshot(self, volume_id, *args, **kwargs)
    snapshot.kms_key_id = snapshot.kms_key_id or getattr(self.get_volume(volume_id), "kms_key_id", None)
    return snapshot


def use_requested_root_snapshot(response: EC2Response, image_id: str) -> None:
    """The image's root device is the snapshot the RegisterImage request names for it."""
    root = response._get_param("RootDeviceName")
    for mapping in response._get_param("BlockDeviceMappings", []) or []:
        snapshot_id = (mapping.get("Ebs") or {}).get("SnapshotId")
        if snapshot_id and mapping.get("DeviceName") == root:
            response.ec2_backend.amis[image_id].ebs_snapshot = response.ec2_backend.get_snapshot(snapshot_id)


# What EC2 does with a customer managed key on the caller's behalf (the caller needs each).
KEY_ACTIONS = ("kms:CreateGrant", "kms:Decrypt", "kms:GenerateDataKeyWithoutPlaintext", "kms:DescribeKey")
LAUNCH_FAILED = ("Client.InternalError", "Client.InternalError: Client error on launch")


def customer_keys(response: EC2Response, image_id: str | None) -> list[str]:
    """The customer managed key ARNs the launch's volumes are encrypted with: the image's root snapshot's,
    the account's default key when encryption by default is on."""
    from moto.kms.models import kms_backends

    backend = response.ec2_backend
    keys = set()
    image = backend.amis.get(image_id) if image_id else None
    snapshot = getattr(image, "ebs_snapshot", None)
    if snapshot is not None and snapshot.kms_key_id:
        keys.add(snapshot.kms_key_id)
    if backend.ebs_encryption_by_default and (
        default := _DEFAULT_KEYS.get((response.current_account, response.region))
    ):
        keys.add(default)
    kms = kms_backends[response.current_account][response.region]
    found = []
    for key in sorted(keys):
        try:
            metadata = kms.describe_key(key)
        except Exception:
            continue  # an alias of an AWS managed key, or a key gone: nothing to grant
        if metadata.key_manager == "CUSTOMER":
            found.append(metadata.arn)
    return found


def fail_launch(instances) -> None:
    """EC2's answer to volumes it could not decrypt for the caller: the instances end terminated."""
    from moto.ec2.models.instances import StateReason

    for instance in instances:
        instance.terminate()
        code, message = LAUNCH_FAILED
        instance.state_reason = StateReason(message, code)
        instance._reason = "Server.InternalError"


PATCHES = {EBSBackend: {"create_snapshot": create_snapshot}}

ACTIONS = {
    "get_ebs_default_kms_key_id": get_ebs_default_kms_key_id,
    "modify_ebs_default_kms_key_id": modify_ebs_default_kms_key_id,
    "reset_ebs_default_kms_key_id": reset_ebs_default_kms_key_id,
}
