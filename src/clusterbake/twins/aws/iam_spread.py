"""IAM's eventual consistency in the EC2 twin (realcloud review A11, D4).

IAM is "eventually consistent": a new instance profile is not known to EC2 at once
(RunInstances, AssociateIamInstanceProfile and ReplaceIamInstanceProfileAssociation answer
InvalidParameterValue "Invalid IAM Instance Profile name" for seconds), and an instance's
metadata service lists a new role before it can hand out its credentials. moto makes both
usable at once. Here, for $MOTO_IAM_SPREAD seconds (default 3) after it was made, a profile
is refused by those EC2 calls and a role's credentials are not served (404).
"""

from __future__ import annotations

import datetime
import os

from moto.ec2.exceptions import EC2ClientError
from moto.ec2.responses import EC2Response
from moto.iam.models import iam_backends

SPREAD = 3.0


def too_new(created: datetime.datetime) -> bool:
    """Made less than $MOTO_IAM_SPREAD seconds ago."""
    now = datetime.datetime.now(created.tzinfo) if created.tzinfo else datetime.datetime.utcnow()
    return (now - created).total_seconds() < float(os.environ.get("MOTO_IAM_SPREAD", SPREAD))


def named_profile(response: EC2Response, named: dict):
    """IAM's instance profile that {"Name"} or {"Arn"} names; None when IAM has none (EC2 answers that)."""
    iam = iam_backends[response.current_account][response.partition]
    try:
        return (
            iam.get_instance_profile_by_arn(named["Arn"])
            if named.get("Arn")
            else iam.get_instance_profile(named.get("Name", ""))
        )
    except Exception:
        return None


def check_profile(response: EC2Response) -> None:
    """The instance profile the request names, refused as EC2 refuses one IAM has not spread yet."""
    named = response._get_param("IamInstanceProfile", {}) or {}
    profile = named_profile(response, named) if named else None
    if profile is not None and too_new(profile.create_date):
        field, value = ("arn", named["Arn"]) if named.get("Arn") else ("name", named.get("Name"))
        raise EC2ClientError(
            "InvalidParameterValue",
            f"Value ({value}) for parameter iamInstanceProfile.{field} is invalid. Invalid IAM Instance Profile "
            f"{field if field == 'name' else 'ARN'}",
        )


_associate = EC2Response.associate_iam_instance_profile
_replace = EC2Response.replace_iam_instance_profile_association


def associate_iam_instance_profile(self: EC2Response):
    check_profile(self)
    return _associate(self)


def replace_iam_instance_profile_association(self: EC2Response):
    check_profile(self)
    return _replace(self)


ACTIONS = {
    "associate_iam_instance_profile": associate_iam_instance_profile,
    "replace_iam_instance_profile_association": replace_iam_instance_profile_association,
}
