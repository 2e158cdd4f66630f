"""`cluster up --dry-run` and the cost limit against the moto_server of conftest.py (issue 31): every
read-only check, the plan node by node with its price, and nothing created.

moto has no Price List API (GetProducts answers HTTP 500), so on-demand prices are unknown here and
the Spot price history is moto's fixed 0.00001: what is checked is that unknown prices are said, and
that a cost limit refuses a plan it cannot price; the sums over a limit are in tests/unit/test_dry_run.py
and, with priced sizes, on the Azure fake (tests/azure/test_azure_dry_run.py).
"""

from __future__ import annotations

import json

from awstest import REGION, example_config, run_cb

from clusterbake.images.store import write_aws_record
from clusterbake.state import StateDir

CLUSTER = "drydemo"
GROUPS = [
    {"name": "gpu", "count": 2, "instance_type": "p5.48xlarge", "efa": True},
    {"name": "cpu", "count": 1, "instance_type": "c7i.large", "spot": True},
    {"name": "burst", "min_count": 0, "max_count": 2, "instance_type": "c7i.large"},
]


def _account(moto) -> dict:
    """What the cluster could have made in the account (the twin's whole account, read back)."""
    ec2, iam, sm = moto.ec2(), moto.client("iam"), moto.client("secretsmanager")
    return {
        "instances": sorted(i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]),
        "security_groups": sorted(g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]),
        "templates": sorted(t["LaunchTemplateId"] for t in ec2.describe_launch_templates()["LaunchTemplates"]),
        "placement_groups": sorted(g["GroupName"] for g in ec2.describe_placement_groups()["PlacementGroups"]),
        "roles": sorted(r["RoleName"] for r in iam.list_roles()["Roles"]),
        "secrets": sorted(s["Name"] for s in sm.list_secrets()["SecretList"]),
    }


def test_a_dry_run_prints_the_plan_and_its_price_and_creates_nothing(moto, network, tmp_path):
    write_aws_record(StateDir(tmp_path), network.ami_id, REGION)
    config = example_config(network, cluster_name=CLUSTER, node_groups=GROUPS, partitions=[])
    before = _account(moto)
    result = run_cb(moto, tmp_path, config, "cluster", "up", "--dry-run")
    assert _account(moto) == before
    out = result.stdout
    assert f"dry run of `cluster up` for {CLUSTER} (aws): nothing was created" in out
    for line in (
        "create    security group",
        "create    IAM role and instance profile",
        "create    launch template",
        "create    placement group",
        "create    Secrets Manager secret",
        "create    instance",
        "elastic   instance",
    ):
        assert line.split()[0] in out and " ".join(line.split()[1:]) in out, (line, out)
    machines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and "[" in line}
    assert set(machines) == {"head", "gpu-1", "gpu-2", "cpu-1", "burst-1", "burst-2"}
    assert "p5.48xlarge" in machines["gpu-1"] and "on-demand" in machines["gpu-1"] and "unknown" in machines["gpu-1"]
    assert "spot" in machines["cpu-1"] and "0.0000" in machines["cpu-1"]  # moto's fixed Spot price
    assert "(elastic)" in machines["burst-1"] and "(elastic)" not in machines["cpu-1"]
    assert "not included: EBS volumes, EFS/FSx storage, data transfer" in out

    as_json = json.loads(run_cb(moto, tmp_path, config, "cluster", "up", "--dry-run", "--json").stdout)
    assert {m["node"] for m in as_json["cost"]["machines"]} == set(machines)
    assert as_json["elastic"] == ["burst-1", "burst-2"] and as_json["cost"]["complete"] is False


def test_a_cost_limit_refuses_a_plan_it_cannot_price_before_anything_is_made(moto, network, tmp_path):
    write_aws_record(StateDir(tmp_path), network.ami_id, REGION)
    config = example_config(network, cluster_name=CLUSTER + "lim", node_groups=GROUPS[1:2], partitions=[])
    before = _account(moto)
    refused = run_cb(moto, tmp_path, config, "cluster", "up", "--max-cost-per-hour", "50", check=False)
    assert refused.returncode == 2, refused.stderr
    assert "--max-cost-per-hour: 50 USD per hour, but the plan cannot be priced in full (head (m7i.2xlarge:" in (
        refused.stderr
    )
    assert "Traceback" not in refused.stderr
    assert _account(moto) == before
    config["max_cost_per_hour"] = 50
    refused = run_cb(moto, tmp_path, config, "cluster", "up", "--dry-run", check=False)
    assert refused.returncode == 2 and "max_cost_per_hour: 50 USD per hour" in refused.stderr
    assert "dry run of `cluster up`" in refused.stdout  # the plan is shown, then refused
    assert _account(moto) == before
