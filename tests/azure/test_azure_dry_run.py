"""`cluster up --dry-run` and the cost limit on Azure, through the real CLI against the ARM twin (issue 31):
the read-only checks, the plan (resource groups, what goes in them, each node's VM) with its price from
the Retail Prices API (the twin's fixture prices Standard_D2s_v5 in eastus at $0.096 an hour and no other
size), and nothing made in the subscription."""

from __future__ import annotations

import pytest
from azuretest import example_config, needs_sdk, run_cb, storage_subnet

pytestmark = needs_sdk


def _subscription(twin) -> dict:
    state = twin.state()
    return {"resources": sorted(state["resources"]), "role_assignments": sorted(state["role_assignments"])}


def test_the_ndv5_examples_dry_run_shows_its_infiniband_placement_and_creates_nothing(twin, tmp_path):
    config = example_config(twin, cluster_name="azdry")
    config["azure"] |= {"resource_group": "azdry-rg", "subnet_id": storage_subnet(twin, "dry-nodes", "10.70.60.0/24")}
    before = _subscription(twin)
    out = run_cb(twin, tmp_path, config, "cluster", "up", "--dry-run").stdout
    assert _subscription(twin) == before
    assert "dry run of `cluster up` for azdry (azure): nothing was created" in out
    rows = [line.split(None, 1) for line in out.splitlines() if line.startswith(("  create", "  exists", "  elastic"))]
    planned = {" ".join(text.split()) for _, text in rows}
    for expected in (
        "resource group azdry-rg",
        "network security group clusterbake-azdry",
        "Key Vault",
        "proximity placement group clusterbake-azdry-gpu",
        "availability set (InfiniBand) clusterbake-azdry-gpu",
        "VM head",
        "VM gpu-1",
    ):
        assert any(p.startswith(expected) for p in planned), (expected, out)
    assert all(action == "create" for action, _ in rows), out
    assert "Standard_ND96isr_H100_v5" in out and "unknown" in out  # no price item for it on the twin


@pytest.mark.parametrize(
    ("limit", "status", "expected"),
    [
        ("1", 0, "per hour: 0.2880 with the static nodes running, 0.4800 with every elastic node up"),
        (
            "0.4",
            2,
            "--max-cost-per-hour: the plan costs 0.48 USD per hour with every elastic node up (0.29 for the static "
            "nodes), over the limit of 0.4; nothing was created",
        ),
    ],
)
def test_a_priced_plan_over_the_cost_limit_is_refused(twin, tmp_path, limit, status, expected):
    config = example_config(twin, cluster_name="azdryc")
    config["azure"] |= {"resource_group": "azdryc-rg", "subnet_id": storage_subnet(twin, "dry-nodes", "10.70.60.0/24")}
    config["head"] = {"instance_type": "Standard_D2s_v5"}
    config["node_groups"] = [
        {"name": "cpu", "count": 2, "instance_type": "Standard_D2s_v5"},
        {"name": "burst", "min_count": 0, "max_count": 2, "instance_type": "Standard_D2s_v5"},
    ]
    config["partitions"] = []
    before = _subscription(twin)
    args = ["cluster", "up", "--max-cost-per-hour", limit] + (["--dry-run"] if status == 0 else [])
    result = run_cb(twin, tmp_path, config, *args, check=False)
    assert result.returncode == status, result.stderr[-3000:]
    assert expected in (result.stdout if status == 0 else result.stderr)
    assert "Traceback" not in result.stderr
    assert _subscription(twin) == before


def test_a_quota_shortfall_is_refused_by_the_dry_run_as_by_cluster_up(twin, tmp_path):
    """The subscription's quota for the ND H100 v5 family set below the two GPU nodes' 192 vCPUs."""
    config = example_config(twin, cluster_name="azdryq")
    config["azure"] |= {"resource_group": "azdryq-rg", "subnet_id": storage_subnet(twin, "dry-nodes", "10.70.60.0/24")}
    before = _subscription(twin)
    twin.set_quota({config["azure"]["location"]: {"standardNDSH100v5Family": 100}})
    try:
        refused = run_cb(twin, tmp_path, config, "cluster", "up", "--dry-run", check=False)
    finally:
        twin.set_quota(None)
    assert refused.returncode == 2, refused.stderr[-2000:]
    need = "node_groups.0.instance_type: 2 x Standard_ND96isr_H100_v5 need 192 vCPUs of the standardNDSH100v5Family"
    assert need in refused.stderr
    assert "dry run of" not in refused.stdout
    assert _subscription(twin) == before
