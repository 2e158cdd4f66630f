"""`cluster up --dry-run` and the cost limit: what `cluster up` would make, node by node, and what it
would cost per hour, found with read-only calls only.

The plan's price is each planned machine at its market's price now (the provider's price API:
AWS's Price List and Spot price history, Azure's Retail Prices), two sums: the static nodes
(what runs once `cluster up` is done) and every elastic node powered up as well (what runs at
max_count). A price that cannot be had stays unknown and is said so; storage, disks and data
transfer are not in it, and the text says so.

`max_cost_per_hour` (config, or `--max-cost-per-hour`) refuses a `cluster up` whose estimate
with every elastic node up is over it, or cannot be known in full, before anything is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clusterbake.errors import ConfigError
from clusterbake.providers.base import CostEstimate, MachineCost

CREATE, EXISTS, ELASTIC = "create", "exists", "elastic"


@dataclass(frozen=True)
class PlannedResource:
    kind: str  # "security group", "VM", ...
    name: str
    action: str  # CREATE, EXISTS, ELASTIC (made by the head's power program when jobs need it)


@dataclass
class DryRun:
    resources: list[PlannedResource]
    cost: CostEstimate  # every planned machine (instance_id: "" where none exists yet)
    elastic: set[str] = field(default_factory=set)  # the machines (node names) that are elastic
    unchecked: list[str] = field(default_factory=list)  # read-only checks that could not be made

    def machines(self, with_elastic: bool) -> list[MachineCost]:
        return [m for m in self.cost.machines if with_elastic or m.node not in self.elastic]

    def per_hour(self, with_elastic: bool) -> float | None:
        """The sum over the machines that could be priced (None: none could)."""
        chosen = self.machines(with_elastic)
        return CostEstimate(chosen).usd_per_hour if chosen else 0.0

    def to_json(self) -> dict:
        return {
            "resources": [{"kind": r.kind, "name": r.name, "action": r.action} for r in self.resources],
            "cost": self.cost.to_json(),
            "per_hour_static": self.per_hour(False),
            "per_hour_all_elastic_up": self.per_hour(True),
            "elastic": sorted(self.elastic),
            "unchecked": list(self.unchecked),
        }


def plan(provider) -> DryRun:
    """The provider's plan, read-only: its cluster resources, each node's machine (made already, to
    create, or elastic: made when jobs need it) and every machine at its market's price now."""
    states = {status.name: status.state for status in provider.status()}
    elastic = {node.name for node in provider.nodes if node.elastic}
    resources = list(provider.cluster_resources())
    for node in provider.nodes:
        made = states.get(node.name, "absent") != "absent"
        action = EXISTS if made else (ELASTIC if node.name in elastic else CREATE)
        resources.append(PlannedResource(provider.machine_kind, node.name, action))
    machines = []
    for name, instance_type, market, _ in provider.planned_machines():
        price = provider.machine_price(instance_type, market)  # the price modules ask once per process
        machines.append(MachineCost(name, "", instance_type, market, price.usd_per_hour, price.source))
    cost = CostEstimate(machines, not_included=list(provider.cost_not_included))
    return DryRun(resources, cost, elastic)


def check_cost_limit(plan: DryRun, limit: float | None, source: str) -> None:
    """Refuse a plan over `limit` USD per hour (every elastic node up), or one that cannot be priced in full."""
    if limit is None:
        return
    unknown = [m for m in plan.cost.machines if m.usd_per_hour is None]
    if unknown:
        names = ", ".join(f"{m.node} ({m.instance_type}: {m.source})" for m in unknown[:5])
        raise ConfigError(
            f"{source}: {limit:g} USD per hour, but the plan cannot be priced in full ({names}); nothing was "
            "created. Remove the limit to go on without a price, or give the operator the price API's "
            "permission (AWS: pricing:GetProducts)"
        )
    total = plan.per_hour(True) or 0.0
    if total > limit:
        static = plan.per_hour(False) or 0.0
        raise ConfigError(
            f"{source}: the plan costs {total:.2f} USD per hour with every elastic node up ({static:.2f} for the "
            f"static nodes), over the limit of {limit:g}; nothing was created. Plan fewer or smaller nodes, or raise "
            "the limit"
        )


def _money(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4f}"


def _sum(plan: DryRun, with_elastic: bool) -> str:
    unpriced = sum(1 for m in plan.machines(with_elastic) if m.usd_per_hour is None)
    total = _money(plan.per_hour(with_elastic))
    return f"at least {total} ({unpriced} machines unpriced)" if unpriced and total != "unknown" else total


def format_plan(plan: DryRun, cluster: str, provider: str) -> str:
    lines = [f"dry run of `cluster up` for {cluster} ({provider}): nothing was created"]
    width = max([4, *(len(r.kind) for r in plan.resources)])
    lines.append("resources:")
    for resource in plan.resources:
        lines.append(f"  {resource.action:<9} {resource.kind:<{width}} {resource.name}")
    lines.append("machines (USD per hour, prices now):")
    for machine in plan.cost.machines:
        elastic = " (elastic)" if machine.node in plan.elastic else ""
        lines.append(
            f"  {machine.node:<12} {machine.instance_type:<24} {machine.market:<10} {_money(machine.usd_per_hour)}"
            f"{elastic}  [{machine.source}]"
        )
    lines.append(f"per hour: {_sum(plan, False)} with the static nodes running, {_sum(plan, True)} with every "
                 "elastic node up")  # fmt: skip
    if plan.cost.not_included:
        lines.append(f"  not included: {', '.join(plan.cost.not_included)}")
    lines += [f"not checked: {what}" for what in plan.unchecked]
    return "\n".join(lines)
