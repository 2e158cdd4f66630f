"""Finding 6 of the security review: the EC2 twin's administrator key was drawn from moto's
random source right after a fixed seed, so anyone who ran the same (public) code got the
same key: the exploit is exactly a second run. Two set-ups here, each in its own process
with its own moto server, as `twin up aws` does it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import yaml

SETUP = """
import argparse, json, os, sys, tempfile
os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = "false"
os.environ["MOTO_IAM_SPREAD"] = "0"  # the new role's credentials at once: this test is about the keys, not IAM's spread
from clusterbake.twins.aws.daemon import Twin
args = argparse.Namespace(state=tempfile.mkdtemp(), address="127.0.0.1", port=int(sys.argv[1]), region="us-east-1",
                          zone="us-east-1a", vpc_cidr="10.90.0.0/16", subnet_cidr="10.90.0.0/24", image=[])
twin = Twin(args)
twin.start_moto()
account = twin.setup_account()
import boto3
session = boto3.session.Session(aws_access_key_id=account["access_key_id"],
                                aws_secret_access_key=account["secret_access_key"])
iam = session.client("iam", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{args.port}")
role = iam.create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]
print(json.dumps({**account, "session_key": twin.credentials("i-0", "r")["SecretAccessKey"]}))
twin.server.stop()
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _set_up_a_twin_account() -> dict:
    out = subprocess.run([sys.executable, "-c", SETUP, str(_free_port())], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_twin_set_up_does_not_recompute_the_administrator_key_or_instance_credentials():
    first, second = _set_up_a_twin_account(), _set_up_a_twin_account()
    # What a config file names stays the same from start to start (examples/aws-twin.yaml's ids)...
    example = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "aws-twin.yaml").read_text())["aws"]
    assert (first["vpc_id"], first["subnet_id"]) == (second["vpc_id"], second["subnet_id"])
    assert (first["vpc_id"], first["subnet_id"]) == (example["vpc_id"], example["subnet_id"])
    # ...what grants access does not.
    assert first["secret_access_key"] != second["secret_access_key"]
    assert first["access_key_id"] != second["access_key_id"]
    assert first["session_key"] != second["session_key"]
    assert len(first["secret_access_key"]) == 40


def test_twin_up_prints_no_secret_of_the_azure_twin_only_where_to_read_it(tmp_path):
    """The same finding's Azure half: `twin up azure` printed IDENTITY_HEADER (the managed
    identity endpoint's secret) on stdout, into terminals and CI logs."""
    from clusterbake.twins import host
    from clusterbake.twins.azure import control

    secret = "s3cr3t-header-value"
    env = {"IDENTITY_HEADER": secret, "IDENTITY_ENDPOINT": "https://10.91.0.1:8443/msi/token"}
    lines = host.shell_exports(env, control.SECRET_ENV, tmp_path)
    printed = "\n".join(lines)
    assert secret not in printed
    assert (tmp_path / "identity_header").stat().st_mode & 0o777 == 0o600
    shell = subprocess.run(
        ["bash", "-c", 'eval "$1"; echo "$IDENTITY_HEADER $IDENTITY_ENDPOINT"', "sh", printed],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert shell.stdout.split() == [secret, env["IDENTITY_ENDPOINT"]]
