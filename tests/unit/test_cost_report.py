"""The cost guard's provider-independent parts: the estimate's JSON, the CLI's lines, `cluster down`'s
last lines and exit status, and the local provider's answers (nothing bills)."""

from __future__ import annotations

import textwrap

import pytest

from clusterbake import cli
from clusterbake import cluster as cluster_module
from clusterbake.config import load_config
from clusterbake.providers.base import BillingCheck, CostEstimate, Leftover, MachineCost
from clusterbake.providers.local.provider import LocalProvider
from clusterbake.state import StateDir


def machine(node, instance_type, market, price, source="test"):
    return MachineCost(node, f"i-{node}", instance_type, market, price, source)


@pytest.mark.parametrize(
    ("amount", "text"),
    [(0, "$0.00"), (55.04, "$55.04"), (1234.5, "$1,234.50"), (0.4032, "$0.4032"), (0.00001, "$0.00001")],
)
def test_usd(amount, text):
    assert cli.usd(amount) == text


def test_cost_lines_group_machines_and_say_what_is_not_priced():
    estimate = CostEstimate(
        machines=[
            machine("gpu-1", "p5.48xlarge", "on-demand", 55.04, "AWS Price List API, published 2025-06-01"),
            machine("gpu-2", "p5.48xlarge", "on-demand", 55.04, "AWS Price List API, published 2025-06-01"),
            machine("head", "m7i.2xlarge", "on-demand", None, "unknown: Price List GetProducts: AccessDeniedException"),
        ],
        not_included=["EBS volumes", "EFS/FSx storage", "data transfer"],
    )
    assert cli.cost_lines(estimate.to_json()) == [
        "cost per hour of what runs now (estimate): at least $110.08 (1 of 3 running instance(s) not priced)",
        "  2 x p5.48xlarge on-demand: $55.04/h each (AWS Price List API, published 2025-06-01)",
        "  1 x m7i.2xlarge on-demand: price unknown (Price List GetProducts: AccessDeniedException)",
        "  not included: EBS volumes, EFS/FSx storage, data transfer",
    ]
    nothing_priced = CostEstimate(machines=[machine("head", "m7i.2xlarge", "on-demand", None, "unknown: x")])
    assert cli.cost_lines(nothing_priced.to_json())[0] == (
        "cost per hour of what runs now (estimate): unknown (1 running instance(s), none priced)"
    )


def _local(tmp_path) -> LocalProvider:
    path = tmp_path / "cluster.yaml"
    path.write_text(textwrap.dedent("cluster_name: demo\nnode_groups:\n  - name: cpu\n    count: 2\n"))
    return LocalProvider(load_config(path), StateDir(tmp_path / "state"))


def test_local_provider_costs_nothing_and_leaves_nothing_billing(tmp_path):
    provider = _local(tmp_path)
    cost = provider.cost().to_json()
    assert cost["per_hour"] == 0.0 and cost["complete"] is True and cost["machines"] == []
    assert cost["note"].startswith("local: ")
    assert cli.cost_lines(cost) == [
        "cost per hour of what runs now (estimate): $0.00; local: the nodes run on this machine; "
        "nothing bills by the hour"
    ]
    check = provider.billing_leftovers()
    assert check.leftovers == [] and check.unchecked == []


@pytest.mark.parametrize(
    ("check", "lines", "status"),
    [
        (BillingCheck(), ["nothing left billing"], 0),
        (BillingCheck(note="local: nothing bills"), ["nothing left billing (local: nothing bills)"], 0),
        (
            BillingCheck(
                leftovers=[
                    Leftover("EBS volume vol-1 (8 GiB gp3, available)"),
                    Leftover("efs fs-1 (storage home: retain)", kept=True),
                ]
            ),
            [
                "still billing, kept on purpose: efs fs-1 (storage home: retain)",
                "still billing: EBS volume vol-1 (8 GiB gp3, available)",
            ],
            1,
        ),
        (
            BillingCheck(leftovers=[Leftover("efs fs-1 (storage home: retain)", kept=True)]),
            ["still billing, kept on purpose: efs fs-1 (storage home: retain)", "nothing else left billing"],
            0,
        ),
        (
            BillingCheck(unchecked=["EBS volumes (DescribeVolumes: UnauthorizedOperation)"]),
            [
                "not checked: EBS volumes (DescribeVolumes: UnauthorizedOperation)",
                "nothing left billing among what could be checked",
            ],
            0,
        ),
    ],
)
def test_down_ends_with_what_still_bills(tmp_path, monkeypatch, capsys, check, lines, status):
    monkeypatch.setattr(cluster_module, "down", lambda config: (["instance head (i-1)"], check))
    path = tmp_path / "cluster.yaml"
    path.write_text("cluster_name: demo\nnode_groups:\n  - name: cpu\n    count: 2\n")
    assert cli.main(["-c", str(path), "cluster", "down"]) == status
    assert capsys.readouterr().out.splitlines() == lines


def test_node_counts_include_slurms_powered_down_nodes():
    from clusterbake.providers.base import NodeStatus

    nodes = [
        NodeStatus("head", "head", "head", "10.0.0.1", "running"),
        NodeStatus("cpu-1", "compute", "cpu", None, "absent"),
        NodeStatus("cpu-2", "compute", "cpu", None, "absent"),
        NodeStatus("cpu-3", "compute", "cpu", "10.0.0.4", "stopped"),
    ]
    counts = cluster_module.node_counts(nodes, {"cpu-1": "idle~", "cpu-2": "down~", "cpu-3": "down"})
    assert counts == {"running": 1, "stopped": 1, "absent": 2, "powered_down": 2}
