"""Findings 16 and 18 at the config: strings that become lines of files on the nodes (authorized_keys,
passwd, .mount units, exports) take no control character; user records cannot be an image's or a
daemon's account, the cloud's login user, or a uid of the image's own range."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from clusterbake.config import ClusterConfig


def config(**changes) -> dict:
    return {"cluster_name": "t", "node_groups": [{"name": "cpu", "count": 1}], **changes}


@pytest.mark.parametrize(
    ("user", "field"),
    [
        ({"name": "ada", "uid": 2001, "ssh_authorized_keys": ["ssh-ed25519 AAAA a\ncommand=\"sh\" ssh-rsa AAAA b"]},
         "ssh_authorized_keys"),
        ({"name": "ada", "uid": 2001, "shell": "/bin/bash\nroot2::0:0::/:/bin/sh"}, "shell"),
        ({"name": "ubuntu", "uid": 2001}, "name"),
        ({"name": "slurm", "uid": 2001}, "name"),
        ({"name": "root", "uid": 2001}, "name"),
        ({"name": "ada", "uid": 1000}, "uid"),
    ],
)  # fmt: skip
def test_a_user_record_that_would_add_lines_or_adopt_an_account_is_refused(user, field):
    with pytest.raises(ValidationError) as refused:
        ClusterConfig.model_validate(config(users=[user]))
    assert any(field in ".".join(map(str, error["loc"])) for error in refused.value.errors()), refused.value


@pytest.mark.parametrize("mount_point", ["/shared\nWhat=/etc", "/data /other", "/a/../etc", "/sh$(id)"])
def test_a_mount_point_that_is_not_a_plain_path_is_refused(mount_point):
    with pytest.raises(ValidationError, match="mount_point"):
        ClusterConfig.model_validate(config(storage=[{"name": "data", "mount_point": mount_point}]))


def test_the_clouds_login_user_is_not_a_cluster_user():
    aws = {"region": "us-east-1", "vpc_id": "vpc-0123456789abcdef0", "subnet_id": "subnet-0123456789abcdef0",
           "ssh_user": "cloudadmin"}  # fmt: skip
    with pytest.raises(ValidationError, match="the cloud's login user"):
        ClusterConfig.model_validate(config(provider="aws", aws=aws, users=[{"name": "cloudadmin", "uid": 2001}]))


def test_plain_users_and_mounts_pass():
    parsed = ClusterConfig.model_validate(
        config(users=[{"name": "ada", "uid": 2001, "ssh_authorized_keys": ["ssh-ed25519 AAAA ada@laptop"]}],
               storage=[{"name": "data", "mount_point": "/data/team-1"}])
    )  # fmt: skip
    assert parsed.users[0].name == "ada"
