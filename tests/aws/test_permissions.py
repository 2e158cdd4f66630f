"""The operator's IAM policy (`clusterbake permissions`, providers/aws/permissions.py) against the product
(issue 31): every call the CLI makes for a cluster's life on the EC2 twin is in it, and an operator held
to it, with IAM enforced by the twin (moto's evaluation, with the twin's resource ARNs for EC2, IAM and
Secrets Manager calls), brings a cluster up and down; one action fewer and `cluster up` is refused."""

from __future__ import annotations

import json
from pathlib import Path

from awstest import ACCOUNT, REGION, authorizing_server, example_config, make_network, moto_server, run_cb
from clitest import CLUSTER_LIFE, run_cli, write_config

from clusterbake.config import load_config
from clusterbake.images.store import write_aws_record
from clusterbake.providers.aws import permissions
from clusterbake.state import StateDir

# moto's service names where IAM's prefix differs; sts:GetCallerIdentity needs no permission (IAM User Guide).
PREFIXES = {"efs": "elasticfilesystem", "service-quotas": "servicequotas"}
NEEDS_NO_PERMISSION = {"sts:GetCallerIdentity"}
GROUPS = [
    {"name": "gpu", "count": 1, "instance_type": "p5.48xlarge", "efa": True},
    {"name": "cpu", "count": 1, "instance_type": "c7i.large", "spot": True},
    {"name": "burst", "min_count": 0, "max_count": 2, "instance_type": "c7i.large"},
]
STORAGE = [
    {"name": "home", "mount_point": "/home", "type": "efs"},
    {"name": "scratch", "mount_point": "/scratch", "type": "fsx_lustre"},
]


def _policy(state_dir: Path, config: dict) -> dict:
    return permissions.policy(load_config(write_config(state_dir, config)), account=ACCOUNT, commands=("cluster",))


def test_every_call_of_a_clusters_life_is_in_the_printed_policy(tmp_path):
    """The twin records each call it serves with the caller's key: the CLI's are checked against the policy."""
    calls = tmp_path / "calls.jsonl"
    (tmp_path / "moto").mkdir()
    with moto_server(tmp_path / "moto", MOTO_CALLS_FILE=str(calls)) as moto:
        network = make_network(moto.client("ec2"))
        state = tmp_path / "state"
        state.mkdir()
        write_aws_record(StateDir(state), network.ami_id, REGION)
        config = example_config(network, cluster_name="perms", node_groups=GROUPS, storage=STORAGE, partitions=[])
        calls.write_text("")  # the setup's calls are not the operator's
        for args in CLUSTER_LIFE:
            run_cb(moto, state, config, *args, timeout=300)
        made = {(c["service"], c["action"]) for c in map(json.loads, calls.read_text().splitlines())}
        printed = run_cb(moto, state, config, "permissions", "--account", ACCOUNT, "--commands", "cluster")
    policy = _policy(state, config)
    assert json.loads(printed.stdout) == policy
    assert "JoinBundleSecrets: one secret per node group" in printed.stderr
    actions = {f"{PREFIXES.get(service, service)}:{action}" for service, action in made} - NEEDS_NO_PERMISSION
    assert len(actions) > 40, sorted(actions)  # the recording saw the life, not nothing
    missing = sorted(a for a in actions if not permissions.allowed(policy, a))
    assert missing == [], f"calls the printed policy does not allow: {missing}"
    # Not needed for this config: no grant for what it does not use.
    sids = {s["Sid"] for s in _policy(state, {**config, "storage": [], "node_groups": GROUPS[:1]})["Statement"]}
    assert not sids & {"EfsFileSystems", "FsxFileSystems", "SpotServiceLinkedRole", "PackerAmazonEbs"}


def test_an_operator_held_to_the_printed_policy_brings_a_cluster_up_and_down(tmp_path):
    with authorizing_server(tmp_path / "moto") as twin:
        _held_operator(twin, tmp_path)


def _held_operator(twin, tmp_path: Path) -> None:
    network = make_network(twin.client("ec2"))
    state = tmp_path / "state"
    state.mkdir()
    write_aws_record(StateDir(state), network.ami_id, REGION)
    # With a login node: its security group, launch template and secret under the same policy.
    login = {"count": 1, "instance_type": "m7i.large", "ssh_cidrs": ["192.0.2.0/24"]}
    config = example_config(
        network, cluster_name="held", node_groups=GROUPS[:2], storage=STORAGE[:1], partitions=[], login_nodes=login
    )
    policy = _policy(state, config)
    operator = twin.user("operator", policy)
    for args in (("cluster", "up", "--provision-only"), ("cluster", "status"), ("cluster", "down")):
        result = run_cli(operator, state, config, *args, check=False, timeout=300)
        assert result.returncode == 0, (args, result.stderr[-3000:])

    # One action fewer: refused, said, and what was made removed by the first up's roll-back.
    trimmed = json.loads(json.dumps(policy))
    for statement in trimmed["Statement"]:
        statement["Action"] = [a for a in statement["Action"] if a != "ec2:CreateLaunchTemplate"]
    short = twin.user("short", trimmed)
    refused = run_cli(short, state, config, "cluster", "up", "--provision-only", check=False, timeout=300)
    assert refused.returncode != 0 and "CreateLaunchTemplate" in refused.stderr, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    run_cli(twin.admin_env, state, config, "cluster", "down", check=True, timeout=300)
