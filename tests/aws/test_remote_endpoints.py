"""The aws provider's SSH side against moto: endpoints, wait_ready for the head,
and known_hosts lines of replaced instances forgotten by `cluster up`."""

from __future__ import annotations

import dataclasses
import json

import pytest
from awstest import example_config, live_instances, run_cb, tag_map
from paramiko.hostkeys import HostKeys

from clusterbake import remote
from clusterbake.config import load_config
from clusterbake.errors import ClusterbakeError
from clusterbake.images.store import write_aws_record
from clusterbake.providers.aws.provider import AwsProvider
from clusterbake.state import StateDir

CLUSTER = "sshkeys"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKnLhc+bqT1CV7aEgmuyrkmzHfIzmN2ZRDo8ulTN2JGH"


@pytest.fixture(scope="module")
def cluster(moto, network, tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("state-sshkeys")
    write_aws_record(StateDir(state_dir), network.ami_id, "us-east-1")
    config = example_config(network, cluster_name=CLUSTER)
    config["aws"]["bastion"] = "jump@bastion.example.com:2222"
    run_cb(moto, state_dir, config, "cluster", "up", "--provision-only")
    yield {"state_dir": state_dir, "config": config, "path": state_dir / f"{CLUSTER}.yaml"}
    run_cb(moto, state_dir, config, "cluster", "down")


@pytest.fixture
def provider(moto, cluster, monkeypatch):
    for key, value in moto.env.items():
        monkeypatch.setenv(key, value)
    return AwsProvider(load_config(cluster["path"]), StateDir(cluster["state_dir"]))


def _addresses(moto) -> dict[str, tuple[str, str]]:
    return {
        tag_map(i)["clusterbake:name"]: (i["InstanceId"], i["PrivateIpAddress"])
        for i in live_instances(moto.ec2(), CLUSTER)
    }


def _console_with_keys(*keys: str) -> str:
    """A boot's console as cloud-init (EC2's `ec2:` prefix) and the boot program print the host keys."""
    block = ["ec2: -----BEGIN SSH HOST KEY KEYS-----", *(f"ec2: {k} root@ip-10-50-0-4" for k in keys),
             "ec2: -----END SSH HOST KEY KEYS-----"]  # fmt: skip
    return "\n".join(["[    0.000000] Linux version 6.8.0", *block, "Ubuntu 24.04 LTS ip-10-50-0-4 ttyS0"]) + "\n"


def test_endpoint_is_the_private_ip_as_ssh_user_with_sudo_through_the_bastion(moto, provider):
    head_id, address = _addresses(moto)["head"]
    moto.console(head_id, _console_with_keys(KEY))
    head = provider.endpoint("head")
    assert head.host == address
    assert (head.name, head.user, head.port, head.sudo) == ("head", "ubuntu", 22, True)
    assert head.host_key_policy == "accept-new" and head.gateway == "jump@bastion.example.com:2222"
    assert head.known_hosts == provider.cluster.known_hosts


def test_a_nodes_host_keys_are_pinned_from_its_console_before_anything_connects(moto, provider, monkeypatch):
    """Security review finding 8: host keys were trusted on first use, and the head's first connection
    carries the cluster's secrets. Now they come from EC2's console output (a trusted channel)."""
    cpu_id, address = _addresses(moto)["gpu-1"]
    other = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQDpinnedtoo"
    moto.console(cpu_id, _console_with_keys(KEY, other))
    provider.endpoint("gpu-1")
    pinned = HostKeys(str(provider.cluster.known_hosts))
    assert pinned.lookup(address)["ssh-ed25519"].get_base64() == KEY.split()[1]
    assert pinned.lookup("gpu-1") is not None and "ssh-rsa" in pinned.lookup(address)
    # A node whose console never shows its keys is not connected to at all.
    from clusterbake.providers import common

    monkeypatch.setattr(common, "HOST_KEYS_POLL", 0.1)
    monkeypatch.setattr(common, "HOST_KEYS_TIMEOUT", 0.3)
    gpu2_id, _ = _addresses(moto)["gpu-2"]
    moto.console(gpu2_id, "[    0.000000] Linux version 6.8.0\n")
    with pytest.raises(ClusterbakeError, match=f"has not shown its SSH host keys on its serial console.*{gpu2_id}"):
        provider._pin_host_keys("gpu-2", dataclasses.replace(provider.machines()["gpu-2"], address="10.50.9.9"))
    assert HostKeys(str(provider.cluster.known_hosts)).lookup("10.50.9.9") is None


def test_wait_ready_probes_only_the_head(moto, provider, monkeypatch):
    # Ansible configures only the head; compute nodes fetch their bundle themselves.
    calls = []
    monkeypatch.setattr(remote, "wait_ready", lambda endpoints, timeout: calls.append((endpoints, timeout)))
    provider.wait_ready(timeout=42)
    assert len(calls) == 1
    endpoints, timeout = calls[0]
    assert timeout == 42
    assert {name: e.host for name, e in endpoints.items()} == {"head": _addresses(moto)["head"][1]}

    def unreachable(endpoints, timeout):
        raise remote.RemoteError("1 of 1 nodes did not answer SSH within 42s:\n  head: cannot reach head")

    monkeypatch.setattr(remote, "wait_ready", unreachable)
    with pytest.raises(ClusterbakeError, match=r"(?s)head: cannot reach.*check aws.ssh_cidrs"):
        provider.wait_ready(timeout=42)


def test_up_forgets_the_host_keys_of_a_replaced_instance(moto, cluster):
    ec2 = moto.ec2()
    before = _addresses(moto)
    known_hosts = cluster["state_dir"] / "clusters" / CLUSTER / "ssh" / "known_hosts"
    old_id, old_address = before["gpu-2"]
    lines = [
        f"{before['head'][1]},head {KEY}\n",
        f"{old_address},gpu-2 {KEY}\n",
        f"{HostKeys.hash_host(old_address)} {KEY}\n",  # as OpenSSH (Ansible) writes it on Debian
        f"{before['gpu-1'][1]} {KEY}\n",
    ]
    known_hosts.write_text("".join(lines))
    ec2.terminate_instances(InstanceIds=[old_id])
    result = run_cb(moto, cluster["state_dir"], cluster["config"], "cluster", "up", "--provision-only")
    assert "forgot the host keys of replaced node(s) gpu-2" in result.stderr
    assert known_hosts.read_text() == lines[0] + lines[3]
    state = json.loads((known_hosts.parents[1] / "state.json").read_text())
    assert state["nodes"]["gpu-2"]["instance_id"] == _addresses(moto)["gpu-2"][0] != old_id
    again = run_cb(moto, cluster["state_dir"], cluster["config"], "cluster", "up", "--provision-only")
    assert "forgot" not in again.stderr and known_hosts.read_text() == lines[0] + lines[3]
