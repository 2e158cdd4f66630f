"""The plan's price and the cost limit (clusterbake/dry_run.py), on plans made here."""

from __future__ import annotations

import pytest

from clusterbake.dry_run import CREATE, DryRun, PlannedResource, check_cost_limit, format_plan
from clusterbake.errors import ConfigError
from clusterbake.providers.base import CostEstimate, MachineCost


def _plan(*machines: tuple[str, float | None], elastic=()) -> DryRun:
    cost = CostEstimate([MachineCost(n, "", "p5.48xlarge", "on-demand", p, "a price list") for n, p in machines])
    return DryRun([PlannedResource("instance", n, CREATE) for n, _ in machines], cost, set(elastic))


def test_the_limit_counts_every_elastic_node_up():
    plan = _plan(("head", 1.0), ("gpu-1", 98.32), ("gpu-2", 98.32), elastic={"gpu-2"})
    assert plan.per_hour(False) == pytest.approx(99.32) and plan.per_hour(True) == pytest.approx(197.64)
    check_cost_limit(plan, 200, "max_cost_per_hour")
    check_cost_limit(plan, None, "max_cost_per_hour")
    over = r"the plan costs 197.64 USD per hour with every elastic node up \(99.32 for the static nodes\), over"
    with pytest.raises(ConfigError, match=rf"max_cost_per_hour: {over} the limit of 150"):
        check_cost_limit(plan, 150, "max_cost_per_hour")


def test_a_plan_with_an_unpriced_machine_is_refused_under_a_limit_and_its_sum_is_a_floor():
    plan = _plan(("head", 1.0), ("gpu-1", None))
    with pytest.raises(ConfigError, match=r"cannot be priced in full \(gpu-1 \(p5.48xlarge: a price list\)\)"):
        check_cost_limit(plan, 1000, "--max-cost-per-hour")
    text = format_plan(plan, "demo", "aws")
    assert "per hour: at least 1.0000 (1 machines unpriced) with the static nodes running" in text
    assert "  create    instance gpu-1" in text
