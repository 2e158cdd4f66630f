"""The cost guard against the moto_server of conftest.py: `cluster status` counts and prices the
nodes, `cluster down` says what still bills.

What moto 5.2.5 gives here: InstanceLifecycle "spot" on instances launched from a spot
launch template (with moto_ext.py applying the template's market options), a fixed spot
price of 0.00001 from DescribeSpotPriceHistory (for every type and zone, dated 2006),
and no Price List API at all (`pricing` GetProducts: HTTP 500), so on-demand prices are
"unknown" here and that is what is checked; the parsing of real answers is in
test_prices.py (Stubber). moto deletes an instance's root volume when it terminates,
and does not put the launch template's volume tags on it: the leftover volume here is
one made with boto3 and the cluster's tag, as the templates tag theirs on EC2.
"""

from __future__ import annotations

import json

import pytest
from awstest import REGION, example_config, live_instances, run_cb, tag_map
from botocore.exceptions import ClientError

from clusterbake import cli
from clusterbake import cluster as cluster_module
from clusterbake.images.store import write_aws_record
from clusterbake.providers.aws import prices
from clusterbake.state import StateDir

CLUSTER = "costdemo"


@pytest.fixture(scope="module")
def costdemo(moto, network, tmp_path_factory):
    """head (m7i.2xlarge), two p5.48xlarge on-demand, one c7i.large spot and a retained EFS file system."""
    state_dir = tmp_path_factory.mktemp("state-cost")
    write_aws_record(StateDir(state_dir), network.ami_id, REGION)
    config = example_config(
        network,
        cluster_name=CLUSTER,
        node_groups=[
            {"name": "gpu", "count": 2, "instance_type": "p5.48xlarge", "efa": True},
            {"name": "cpu", "count": 1, "instance_type": "c7i.large", "spot": True},
        ],
        partitions=[],
        storage=[{"name": "data", "mount_point": "/data", "type": "efs", "retain": True}],
    )
    run_cb(moto, state_dir, config, "cluster", "up", "--provision-only")
    return {"state_dir": state_dir, "config": config, "path": state_dir / f"{CLUSTER}.yaml"}


@pytest.fixture
def in_process(moto, costdemo, monkeypatch):
    """The CLI in this process (so that Slurm's answer can be faked: the head's private IP
    does not exist), against the moto server."""
    for key, value in {**moto.env, "CLUSTERBAKE_STATE_DIR": str(costdemo["state_dir"])}.items():
        monkeypatch.setenv(key, value)
    prices.clear_cache()
    yield
    prices.clear_cache()


def _by_name(ec2) -> dict[str, dict]:
    return {tag_map(i)["clusterbake:name"]: i for i in live_instances(ec2, CLUSTER)}


def test_status_counts_the_nodes_and_prices_what_runs(moto, costdemo, in_process, monkeypatch, capsys):
    ec2 = moto.ec2()
    ec2.stop_instances(InstanceIds=[_by_name(ec2)["gpu-2"]["InstanceId"]])
    # gpu-2 is stopped; Slurm would show it powered down (`~`).
    monkeypatch.setattr(cluster_module, "slurm_node_states", lambda provider: {"gpu-1": "idle", "gpu-2": "idle~"})

    assert cli.main(["-c", str(costdemo["path"]), "cluster", "status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # The existing keys stay as they were.
    assert [(n["name"], n["state"], n["slurm_state"]) for n in report["nodes"]] == [
        ("head", "running", None),
        ("gpu-1", "running", "idle"),
        ("gpu-2", "stopped", "idle~"),
        ("cpu-1", "running", None),
    ]
    assert report["summary"] == {"running": 3, "stopped": 1, "absent": 0, "powered_down": 1}
    cost = report["cost"]
    machines = {m["node"]: m for m in cost["machines"]}
    assert sorted(machines) == ["cpu-1", "gpu-1", "head"]  # running ones only
    assert machines["cpu-1"]["market"] == "spot" and machines["cpu-1"]["per_hour"] == 0.00001
    assert machines["cpu-1"]["source"].startswith(f"EC2 spot price history, {REGION}a, since 2006-01-02")
    for name in ("gpu-1", "head"):
        assert machines[name]["market"] == "on-demand" and machines[name]["per_hour"] is None
        # moto_server has no Price List API: it answers HTTP 500.
        assert machines[name]["source"] == "unknown: Price List GetProducts: HTTP 500"
    assert machines["gpu-1"]["instance_type"] == "p5.48xlarge"
    assert cost["per_hour"] == 0.00001 and cost["complete"] is False and cost["currency"] == "USD"
    assert cost["not_included"] == ["EBS volumes", "EFS/FSx storage", "data transfer"]
    assert cost["note"] == "1 stopped instance(s): no instance hours, their EBS volumes still bill"

    assert cli.main(["-c", str(costdemo["path"]), "cluster", "status"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith(f"cluster {CLUSTER} (aws), image ami-")
    assert "nodes: 3 running, 1 stopped, 0 absent (1 powered down in Slurm)" in text
    assert (
        "cost per hour of what runs now (estimate): at least $0.00001 (2 of 3 running instance(s) not priced); "
        "1 stopped instance(s): no instance hours, their EBS volumes still bill"
    ) in text
    assert "  1 x p5.48xlarge on-demand: price unknown (Price List GetProducts: HTTP 500)" in text
    assert "  1 x m7i.2xlarge on-demand: price unknown (Price List GetProducts: HTTP 500)" in text
    assert any(line.startswith("  1 x c7i.large spot: $0.00001/h each (EC2 spot price history") for line in text)
    assert text[-1] == "  not included: EBS volumes, EFS/FSx storage, data transfer"
    ec2.start_instances(InstanceIds=[_by_name(ec2)["gpu-2"]["InstanceId"]])


def test_a_spot_node_is_not_stopped_as_ec2_would_refuse_it(moto, costdemo, in_process, capsys):
    """realcloud review A9: EC2 cannot stop a one-time Spot request's instance; neither can the twin."""
    ec2 = moto.ec2()
    spot = _by_name(ec2)["cpu-1"]
    assert spot["InstanceLifecycle"] == "spot"
    with pytest.raises(ClientError, match="UnsupportedOperation") as refused:
        ec2.stop_instances(InstanceIds=[spot["InstanceId"]])
    assert "You can only stop Spot Instances associated with persistent Spot Instance requests" in str(refused.value)
    # `node stop` says why before it tells Slurm anything (the head is not reachable here: it would fail).
    assert cli.main(["-c", str(costdemo["path"]), "node", "stop", "cpu-1"]) == 1
    err = capsys.readouterr().err
    assert f"node cpu-1: {spot['InstanceId']} is a Spot instance, which EC2 cannot stop" in err
    assert "`clusterbake node replace cpu-1` gives it a new instance" in err
    assert _by_name(ec2)["cpu-1"]["State"]["Name"] == "running"


def test_a_dry_run_of_the_running_cluster_finds_everything_made(moto, costdemo):
    """`cluster up --dry-run` of a provisioned cluster: nothing left to create."""
    out = run_cb(moto, costdemo["state_dir"], costdemo["path"], "cluster", "up", "--dry-run").stdout
    rows = [line.split() for line in out.splitlines() if line.startswith(("  create", "  exists", "  elastic"))]
    assert rows and all(row[0] == "exists" for row in rows), out
    assert ["exists", "instance", "gpu-1"] in rows and ["exists", "security", "group", f"clusterbake-{CLUSTER}"] in rows
    assert ["exists", "EFS", "file", "system", f"clusterbake-{CLUSTER}-data"] in rows


def test_down_lists_what_still_bills_and_then_nothing_is_left(moto, network, costdemo):
    ec2, efs = moto.ec2(), moto.client("efs")
    [data] = [
        fs
        for fs in efs.describe_file_systems()["FileSystems"]
        if {"Key": "clusterbake:cluster", "Value": CLUSTER} in fs.get("Tags", [])
    ]
    # A volume of the cluster that its instances' termination does not take away (detached, say).
    volume = ec2.create_volume(
        AvailabilityZone=f"{REGION}a",
        Size=8,
        VolumeType="gp3",
        TagSpecifications=[{"ResourceType": "volume", "Tags": [{"Key": "clusterbake:cluster", "Value": CLUSTER}]}],
    )["VolumeId"]

    down = run_cb(moto, costdemo["state_dir"], costdemo["config"], "cluster", "down", check=False)
    assert down.returncode == 1, down.stderr
    assert "removed instance head" in down.stderr and "kept efs" in down.stderr
    assert down.stdout.splitlines() == [
        f"still billing, kept on purpose: efs {data['FileSystemId']} (storage data: retain)",
        f"still billing: EBS volume {volume} (8 GiB gp3, available)",
    ]
    assert live_instances(ec2, CLUSTER) == []

    ec2.delete_volume(VolumeId=volume)
    again = run_cb(moto, costdemo["state_dir"], costdemo["config"], "cluster", "down")
    assert again.stdout.splitlines() == [
        f"still billing, kept on purpose: efs {data['FileSystemId']} (storage data: retain)",
        "nothing else left billing",
    ]

    for target in efs.describe_mount_targets(FileSystemId=data["FileSystemId"])["MountTargets"]:
        efs.delete_mount_target(MountTargetId=target["MountTargetId"])
    efs.delete_file_system(FileSystemId=data["FileSystemId"])
    last = run_cb(moto, costdemo["state_dir"], costdemo["config"], "cluster", "down")
    assert last.stdout.splitlines()[-1] == "nothing left billing"
    assert last.stdout.splitlines() == ["nothing left billing"]


def test_down_of_a_plain_cluster_ends_with_nothing_left_billing(moto, network, tmp_path):
    write_aws_record(StateDir(tmp_path), network.ami_id, REGION)
    config = example_config(
        network,
        cluster_name="costplain",
        node_groups=[{"name": "cpu", "count": 1, "instance_type": "c7i.large", "spot": True}],
        partitions=[],
    )
    run_cb(moto, tmp_path, config, "cluster", "up", "--provision-only")
    down = run_cb(moto, tmp_path, config, "cluster", "down")
    assert "==> check what still bills" in down.stderr
    assert down.stdout.splitlines()[-1] == "nothing left billing"
