"""A botocore EC2 client for Stubber tests: requests are checked against botocore's EC2
model and answered from the queue; nothing leaves the process."""

from __future__ import annotations

import botocore.session


def ec2_client():
    session = botocore.session.get_session()
    return session.create_client(
        "ec2", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )
