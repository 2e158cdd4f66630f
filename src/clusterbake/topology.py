"""Slurm's network topology (topology/tree) from where each node hangs in the network.

Every provider says it the same way, as EC2's DescribeInstanceTopology does: for a node, the
switches above it from the top of the network down to its own (NetworkNodes). From those
paths come the switches of topology.conf, each with its nodes (a leaf) or the switches under
it, node names hostlist-compressed; `--switches=N` jobs then get nodes under N leaf switches.

The power program on an aws head ships this module as its own (role slurm_power) and rewrites
topology.conf with it when compute instances start or stop: it has no python-hostlist there (not in
Debian 12 nor Ubuntu), and compresses with `scontrol show hostlistsorted` instead (`compress`).
The file it writes is the one role slurm's template writes (`render`; tests/unit/test_slurm_conf.py
holds them equal), so that the next `cluster up` finds nothing to change.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise

# Nodes whose place is not known (an elastic node not launched yet): a leaf of their own, so
# that slurmctld sees every node in the tree (a node outside it is never allocated with others).
UNPLACED = "unplaced"
# The one switch above several tops: Slurm allocates across switches only below a common one.
ROOT = "root"
SWITCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class TopologyError(ValueError):
    pass


def check_paths(paths: Mapping[str, Sequence[str]], where: str, same_depth: bool = True) -> None:
    """Each path: 1 to 4 switch names, top first (all of one depth when `same_depth`: a declared layout;
    EC2 answers 4 for p6-b200 and 3 for p5 in one zone); a name on one level and under one parent only."""
    depths = {len(path) for path in paths.values()}
    if same_depth and len(depths) > 1:
        raise TopologyError(f"{where}: every node's path needs the same number of switches (got {sorted(depths)})")
    level_of: dict[str, int] = {}
    for node, path in paths.items():
        if not 1 <= len(path) <= 4:
            raise TopologyError(f"{where}: {node}: give 1 to 4 switches, top first (got {len(path)})")
        for level, name in enumerate(path):
            if not SWITCH_NAME.match(name) or name in (UNPLACED, ROOT):
                raise TopologyError(
                    f"{where}: {node}: switch name {name!r}: letters, digits, '.', '_' or '-', "
                    f"not {UNPLACED!r} or {ROOT!r}"
                )
            if level_of.setdefault(name, level) != level:
                raise TopologyError(f"{where}: switch {name!r} is on two levels of the tree")
    parents: dict[str, str] = {}
    for path in paths.values():
        for parent, child in pairwise(path):
            if parents.setdefault(child, parent) != parent:
                raise TopologyError(f"{where}: switch {child!r} hangs under both {parents[child]!r} and {parent!r}")


def collect_hostlist(names: Iterable[str]) -> str:
    import hostlist  # here: the power program on a head compresses otherwise (module docstring)

    return hostlist.collect_hostlist(list(names))


def expand_hostlist(names: str) -> list[str]:
    import hostlist

    return hostlist.expand_hostlist(names)


def switches(
    paths: Mapping[str, Sequence[str]],
    nodes: Iterable[str],
    compress: Callable[[list[str]], str] = collect_hostlist,
    expected: bool = False,
) -> list[dict]:
    """topology.conf's switches for `nodes` ([{name, nodes}] leaves, then [{name, switches}] upward), from
    each placed node's path; nodes without one go under UNPLACED. None placed: no topology (empty),
    unless places are `expected` (instance types EC2 places once they run): every node under UNPLACED."""
    nodes = list(nodes)
    placed = {node: list(paths[node]) for node in nodes if node in paths}
    if not placed:
        return [{"name": UNPLACED, "nodes": compress(sorted(nodes))}] if expected and nodes else []
    check_paths(placed, "topology", same_depth=False)
    leaves: dict[str, list[str]] = {}
    children: dict[str, set[str]] = {}
    tops: set[str] = set()
    for node, path in placed.items():
        leaves.setdefault(path[-1], []).append(node)
        tops.add(path[0])
        for parent, child in pairwise(path):
            children.setdefault(parent, set()).add(child)
    unplaced = [node for node in nodes if node not in placed]
    if unplaced:
        leaves[UNPLACED] = unplaced
        tops.add(UNPLACED)
    lines = [{"name": name, "nodes": compress(sorted(members))} for name, members in sorted(leaves.items())]
    lines += [{"name": name, "switches": ",".join(sorted(below))} for name, below in sorted(children.items())]
    if len(tops) > 1:
        lines.append({"name": ROOT, "switches": ",".join(sorted(tops))})
    return lines


HEADER = """\
# Managed by clusterbake (role slurm), do not edit: rewritten by ansible/cluster.yml, and on aws
# by the power program's reconcile loop when compute instances start or stop.
# The network's switches (topology/tree), from the provider: leaf switches with their nodes, then
# the switches above them. Configless: slurmd and the commands fetch it from slurmctld.
"""


def render(lines: Sequence[Mapping]) -> str:
    """topology.conf as role slurm's template (topology.conf.j2) writes it from switches()' lines."""
    body = "".join(
        f"SwitchName={line['name']} "
        + (f"Nodes={line['nodes']}" if "nodes" in line else f"Switches={line['switches']}")
        + "\n"
        for line in lines
    )
    return HEADER + body


def leaf_of(topology: Sequence[Mapping]) -> dict[str, str]:
    """Each node's leaf switch, from switches()' lines."""
    return {node: line["name"] for line in topology if "nodes" in line for node in expand_hostlist(line["nodes"])}
