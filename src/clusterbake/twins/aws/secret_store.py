"""Secrets Manager in the EC2 twin as AWS answers where moto is kinder (realcloud review A10, D4, D8).

- A name force-deleted moments ago: AWS deletes the secret in the background, and "if you
  delete a secret and then immediately create a secret with the same name", CreateSecret fails
  with InvalidRequestException until it is done (DeleteSecret API reference). moto frees the
  name at once. Here it stays held for $MOTO_SECRET_NAME_HOLD seconds (default 3).
- DescribeSecret's KmsKeyId is "the key ID or alias ARN of the KMS key": a key ARN given at
  CreateSecret or UpdateSecret comes back as its key ID, an alias name as its alias ARN. moto
  echoes what it was given, so a product comparing that with its own spelling of the key
  looked consistent here and re-encrypted on every run on AWS.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from moto.secretsmanager import models
from moto.secretsmanager.exceptions import InvalidRequestException

NAME_HOLD = 3.0
_DELETED: dict[tuple[str, str, str], float] = {}  # (account, region, name) -> when force-deleted
_LOCK = threading.Lock()

_delete_secret = models.SecretsManagerBackend.delete_secret
_create_secret = models.SecretsManagerBackend.create_secret
_to_dict = models.FakeSecret.to_dict


def delete_secret(self, secret_id: str, recovery_window_in_days, force_delete_without_recovery: bool):
    arn, name, deleted = _delete_secret(self, secret_id, recovery_window_in_days, force_delete_without_recovery)
    if force_delete_without_recovery:
        with _LOCK:
            _DELETED[(self.account_id, self.region_name, name)] = time.monotonic()
    return arn, name, deleted


def create_secret(self, name: str, *args, **kwargs):
    hold = float(os.environ.get("MOTO_SECRET_NAME_HOLD", NAME_HOLD))
    with _LOCK:
        since = _DELETED.get((self.account_id, self.region_name, name))
    if since is not None and time.monotonic() - since < hold:
        raise InvalidRequestException(
            "You can't create this secret because a secret with this name is already scheduled for deletion."
        )
    return _create_secret(self, name, *args, **kwargs)


def key_as_described(key_id: str, account: str, region: str) -> str:
    """How DescribeSecret names a key: its ID for a key ARN, the alias ARN for an alias name."""
    if key_id.startswith("arn:") and ":key/" in key_id:
        return key_id.rsplit("/", 1)[1]
    if key_id.startswith("alias/"):
        return f"arn:aws:kms:{region}:{account}:{key_id}"
    return key_id


def to_dict(self) -> dict[str, Any]:
    described = _to_dict(self)
    if described.get("KmsKeyId"):
        described["KmsKeyId"] = key_as_described(described["KmsKeyId"], self.account_id, self.region)
    return described


PATCHES = {
    models.SecretsManagerBackend: {"delete_secret": delete_secret, "create_secret": create_secret},
    models.FakeSecret: {"to_dict": to_dict},
}
