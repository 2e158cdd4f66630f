"""Which AMI the nodes boot: aws.ami_id, else the last AWS image build's record.

The record is the contract between the image build and `cluster up` (docs/architecture.md):
`<state_dir>/images/aws-latest.json`, written by the Packer wrapper after a
successful amazon-ebs build:

    {"ami_id": "ami-0123456789abcdef0", "region": "us-east-1"}

Other keys (name, build time, source AMI, ...) may be present and are ignored.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from clusterbake.config import ClusterConfig
from clusterbake.errors import MissingImageError
from clusterbake.state import StateDir

RECORD_NAME = "aws-latest.json"
AMI_PATTERN = re.compile(r"^ami-[0-9a-f]{8,17}$")
BUILD_HINT = "run `make image PROVIDER=aws` (or set aws.ami_id)"


def record_path(state: StateDir) -> Path:
    return state.images / RECORD_NAME


def write_record(state: StateDir, ami_id: str, region: str, **extra: str) -> Path:
    """For the image build: record the AMI it made (atomically)."""
    if not AMI_PATTERN.match(ami_id):
        raise ValueError(f"not an AMI id: {ami_id!r}")
    path = record_path(state)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"ami_id": ami_id, "region": region, **extra}, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def find_ami(config: ClusterConfig, state: StateDir) -> str:
    assert config.aws is not None
    if config.aws.ami_id:
        return config.aws.ami_id
    path = record_path(state)
    if not path.is_file():
        raise MissingImageError(f"no AMI: aws.ami_id is not set and {path} does not exist; {BUILD_HINT}")
    try:
        record = json.loads(path.read_text())
        ami_id, region = record["ami_id"], record["region"]
    except (ValueError, KeyError, TypeError):
        raise MissingImageError(f"{path}: not an image record {{ami_id, region}}; {BUILD_HINT}") from None
    if not isinstance(ami_id, str) or not AMI_PATTERN.match(ami_id):
        raise MissingImageError(f"{path}: ami_id {ami_id!r} is not an AMI id; {BUILD_HINT}")
    if region != config.aws.region:
        raise MissingImageError(
            f"{path}: {ami_id} was built in {region}, the cluster runs in {config.aws.region}; {BUILD_HINT}"
        )
    return ami_id
