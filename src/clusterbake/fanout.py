"""`clusterbake exec`: one command on many nodes at once, over SSH (remote.run_many, Fabric).

Which nodes: a node group (`--group`, `head` included as a group of one), a hostlist
(`--nodes 'cpu-[1-4],head'`, python-hostlist's syntax, as Slurm writes it), or every
node. Nodes that do not run (stopped, powered down, not created) are listed as such and
not tried. The table has a row per node: its exit status and the first line of its
output; the full output of every node goes to the log file (clusters/<name>/logs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import hostlist

from clusterbake import remote
from clusterbake.errors import ConfigError
from clusterbake.providers.base import Provider
from clusterbake.state import open_private

NOT_RUN = "-"


@dataclass(frozen=True)
class Row:
    node: str
    status: str  # the exit status, `unreachable`, or the node's state when it was not tried
    first_line: str
    tried: bool = True


def select(provider: Provider, group: str | None = None, nodes: str | None = None) -> list[str]:
    """The planned nodes named by --group or --nodes (in plan order), or all of them."""
    planned = [n.name for n in provider.nodes]
    if group is not None:
        groups = {n.nodegroup for n in provider.nodes}
        if group not in groups:
            raise ConfigError(f"--group: {group!r} is not a node group of the cluster ({', '.join(sorted(groups))})")
        return [n.name for n in provider.nodes if n.nodegroup == group]
    if nodes is not None:
        try:
            wanted = hostlist.expand_hostlist(nodes)
        except hostlist.BadHostlist as exc:
            raise ConfigError(f"--nodes: {nodes!r} is not a hostlist ({exc})") from None
        unknown = [name for name in wanted if name not in planned]
        if unknown:
            raise ConfigError(f"--nodes: {', '.join(unknown)} not in the cluster's plan")
        return [name for name in planned if name in wanted]
    return planned


def run(
    provider: Provider, names: list[str], command: str, timeout: float, log: Path, stdin: bytes | None = None
) -> list[Row]:
    """The command on every running node of `names` at once (each given `stdin`, which is never
    logged: it may be a secret); a row per node, the full output in `log`."""
    states = {s.name: s.state for s in provider.status()}
    running = [name for name in names if states.get(name) == "running"]
    endpoints = {name: provider.endpoint(name) for name in running}
    started = time.monotonic()
    results = remote.run_many(endpoints, command, stdin=stdin, timeout=timeout)
    took = time.monotonic() - started
    rows = []
    with open_private(log) as out:  # every node's output, which may hold anything: 0600
        out.write(f"$ {command}\n# on {len(running)} nodes in {took:.1f}s\n")
        for name in names:
            result = results.get(name)
            if result is None:
                rows.append(Row(name, states.get(name, "absent"), NOT_RUN, tried=False))
                continue
            if isinstance(result, Exception):
                text = str(result)
                rows.append(Row(name, "unreachable", text.splitlines()[0] if text else type(result).__name__))
                out.write(f"\n=== {name}: unreachable\n{text}\n")
                continue
            output = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
            first = next((line for line in output.splitlines() if line.strip()), "")
            rows.append(Row(name, str(result.returncode), first))
            out.write(f"\n=== {name}: exit {result.returncode}\n{output}")
    return rows


def table(rows: list[Row], width: int = 100) -> str:
    node_width = max([4, *(len(r.node) for r in rows)])
    lines = [f"{'NODE':<{node_width}}  {'STATUS':<11}  OUTPUT (first line)"]
    for row in rows:
        shown = row.first_line if len(row.first_line) <= width else row.first_line[: width - 3] + "..."
        lines.append(f"{row.node:<{node_width}}  {row.status:<11}  {shown}")
    return "\n".join(lines)


def failed(rows: list[Row]) -> list[Row]:
    """Rows of nodes that were tried and did not exit 0."""
    return [r for r in rows if r.tried and r.status != "0"]
