"""The twin's instance metadata service, over real HTTP on 127.0.0.1, against EC2's documented behaviour.

The lookup here stands in for the twin's moto backend (the daemon builds the same
dict from its instances); what is tested is the HTTP contract an EC2 client (boto3,
cloud-init, clusterbake-node-boot) relies on.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import programs
import pytest

from clusterbake.twins.aws.imds import MetadataServer, listen

REPO = Path(__file__).resolve().parents[2]


def instance(**changes):
    data = {
        "instance_id": "i-0123456789abcdef0",
        "http_tokens": "required",
        "http_endpoint": "enabled",
        "hop_limit": 1,
        "user_data": b"#!/bin/sh\necho hi\n",
        "role": "clusterbake-demo-node",
        "public_keys": {"demo-key": "ssh-ed25519 AAAA demo"},
        "identity": {"instanceId": "i-0123456789abcdef0", "region": "us-east-1"},
        "meta": {
            "instance-id": "i-0123456789abcdef0",
            "local-ipv4": "127.0.0.1",
            "placement": {"availability-zone": "us-east-1a", "region": "us-east-1"},
            "iam": {"info": "{}", "security-credentials": {"clusterbake-demo-node": ""}},
        },
    }
    data.update(changes)
    return data


@pytest.fixture
def imds():
    state = {"instance": instance(), "credentials": []}

    def credentials(instance_id, role):
        state["credentials"].append((instance_id, role))
        return {"Code": "Success", "AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": "s", "Token": "t"}

    sock = listen("127.0.0.1", 0)
    server = MetadataServer(sock, lambda address: state["instance"], credentials, lambda message: None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{sock.getsockname()[1]}"
    yield state
    server.shutdown()
    server.server_close()


def request(url, method="GET", headers=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers or {}), timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def token(imds, ttl="60"):
    status, body = request(f"{imds['url']}/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": ttl})
    assert status == 200
    return body.decode()


def get(imds, path, tok):
    return request(f"{imds['url']}/latest/{path}", headers={"X-aws-ec2-metadata-token": tok})


def test_tokens_are_required_when_the_instance_requires_them(imds):
    assert request(f"{imds['url']}/latest/meta-data/instance-id")[0] == 401
    assert get(imds, "meta-data/instance-id", token(imds)) == (200, b"i-0123456789abcdef0")
    assert get(imds, "meta-data/instance-id", "forged")[0] == 401


def test_imdsv1_works_only_when_tokens_are_optional(imds):
    imds["instance"] = instance(http_tokens="optional")
    assert request(f"{imds['url']}/latest/meta-data/instance-id") == (200, b"i-0123456789abcdef0")


def test_token_requests_are_checked(imds):
    url = f"{imds['url']}/latest/api/token"
    assert request(url, "PUT")[0] == 400  # no TTL
    assert request(url, "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "21601"})[0] == 400
    assert request(url, "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "0"})[0] == 400
    forwarded = {"X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "10.0.0.9"}
    assert request(url, "PUT", forwarded)[0] == 403


def test_a_token_belongs_to_its_instance(imds):
    tok = token(imds)
    imds["instance"] = instance(instance_id="i-0fffffffffffffff0")
    assert get(imds, "meta-data/local-ipv4", tok)[0] == 401


def test_a_disabled_endpoint_refuses_everything(imds):
    imds["instance"] = instance(http_endpoint="disabled")
    assert request(f"{imds['url']}/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "60"})[0] == 403


def test_listings_follow_ec2s_format(imds):
    tok = token(imds)
    status, body = get(imds, "meta-data/", tok)
    assert status == 200
    assert body.decode().splitlines() == ["instance-id", "local-ipv4", "placement/", "iam/", "public-keys/"]
    assert get(imds, "meta-data/placement/availability-zone", tok) == (200, b"us-east-1a")
    assert get(imds, "meta-data/public-keys/", tok) == (200, b"0=demo-key")
    assert get(imds, "meta-data/public-keys/0/openssh-key", tok) == (200, b"ssh-ed25519 AAAA demo\n")
    assert get(imds, "meta-data/no-such-thing", tok)[0] == 404
    assert get(imds, "", tok) == (200, b"dynamic\nmeta-data\nuser-data")
    assert get(imds, "user-data", tok) == (200, b"#!/bin/sh\necho hi\n")
    document = json.loads(get(imds, "dynamic/instance-identity/document", tok)[1])
    assert document["region"] == "us-east-1"


def test_credentials_only_for_the_instances_role(imds):
    tok = token(imds)
    assert get(imds, "meta-data/iam/security-credentials/", tok) == (200, b"clusterbake-demo-node")
    status, body = get(imds, "meta-data/iam/security-credentials/clusterbake-demo-node", tok)
    assert status == 200 and json.loads(body)["AccessKeyId"] == "ASIAEXAMPLE"
    assert imds["credentials"] == [("i-0123456789abcdef0", "clusterbake-demo-node")]
    assert get(imds, "meta-data/iam/security-credentials/someone-else", tok)[0] == 404
    meta = instance()["meta"]
    del meta["iam"]
    imds["instance"] = instance(role=None, meta=meta)
    tok = token(imds)
    assert get(imds, "meta-data/iam/security-credentials/", tok)[0] == 404
    assert get(imds, "meta-data/iam/security-credentials/clusterbake-demo-node", tok)[0] == 404
    assert len(imds["credentials"]) == 1


def test_no_user_data_is_a_404(imds):
    imds["instance"] = instance(user_data=None)
    tok = token(imds)
    assert get(imds, "user-data", tok)[0] == 404
    assert get(imds, "", tok) == (200, b"dynamic\nmeta-data")


def test_the_boot_program_reads_user_data_through_imdsv2(imds):
    """clusterbake-node-boot (role cloud_boot) against this server: token first, then every request with it."""
    path = REPO / "roles" / "cloud_boot" / "files" / "clusterbake-node-boot"
    boot = programs.load_program("clusterbake_node_boot", path)
    metadata = boot.Metadata(imds["url"])
    assert metadata.get("meta-data/instance-id") == b"i-0123456789abcdef0"
    assert metadata.get("meta-data/nothing") is None
    assert boot.clusterbake_part(metadata.get("user-data")) is None  # a shell script: not ours
