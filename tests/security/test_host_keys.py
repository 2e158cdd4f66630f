"""Security review finding 8: trust on first use accepted, for a host already known, any key of a
type not recorded yet; and cloud nodes were trusted on first use at all. Here the known_hosts side
(the console side is tests/aws/test_remote_endpoints.py and the twins' cluster tests)."""

from __future__ import annotations

import paramiko
import pytest

from clusterbake import remote
from clusterbake.providers.common import host_keys_from_console


class _Client:
    def __init__(self):
        self.keys = paramiko.HostKeys()

    def get_host_keys(self):
        return self.keys


def test_a_known_host_offering_a_key_of_another_type_is_refused(tmp_path):
    known_hosts = tmp_path / "known_hosts"
    ecdsa = paramiko.ECDSAKey.generate()
    remote.pin_host_keys(known_hosts, ["10.0.0.5", "head"], [f"{ecdsa.get_name()} {ecdsa.get_base64()}"])
    policy = remote._HostKeyPolicy("head", known_hosts, "accept-new", 22)
    intruder = paramiko.RSAKey.generate(1024)
    with pytest.raises(remote.HostKeyError, match="changed"):
        policy.missing_host_key(_Client(), "10.0.0.5", intruder)
    assert intruder.get_base64() not in known_hosts.read_text()
    # An unknown host (a bastion) is still trusted on its first use, once.
    stranger = _Client()
    policy.missing_host_key(stranger, "10.0.0.9", intruder)
    assert intruder.get_base64() in known_hosts.read_text()


def test_the_host_keys_block_is_read_from_the_console_as_cloud_init_prints_it():
    text = (
        "ci-info: +++++ Authorized keys from /home/ubuntu/.ssh/authorized_keys +++++\n"
        "ec2: -----BEGIN SSH HOST KEY KEYS-----\n"
        "ec2: ecdsa-sha2-nistp256 AAAAE2Vj old root@ip-10-0-0-5\n"
        "ec2: -----END SSH HOST KEY KEYS-----\n"
        "-----BEGIN SSH HOST KEY KEYS-----\n"
        "ssh-ed25519 AAAAC3Nz new\n"
        "ssh-rsa AAAAB3Nz new\n"
        "-----END SSH HOST KEY KEYS-----\n"
        "-----BEGIN SSH HOST KEY KEYS-----\n"
        "ssh-ed25519 AAAAC3Nz cut-short\n"
    )
    assert host_keys_from_console(text) == ["ssh-ed25519 AAAAC3Nz", "ssh-rsa AAAAB3Nz"]  # the last whole block
    assert host_keys_from_console("no keys yet\n") == []
