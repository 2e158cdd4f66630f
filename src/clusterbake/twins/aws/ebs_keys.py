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

Still kinder than EC2: a launch whose volumes need a customer managed key the caller may not
use (kms:CreateGrant and the others) is not terminated with Client.InternalError.
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


PATCHES = {EBSBackend: {"create_snapshot": create_snapshot}}

ACTIONS = {
    "get_ebs_default_kms_key_id": get_ebs_default_kms_key_id,
    "modify_ebs_default_kms_key_id": modify_ebs_default_kms_key_id,
    "reset_ebs_default_kms_key_id": reset_ebs_default_kms_key_id,
}
