"""Host limits that many systemd containers need, checked (and raised as root) before nodes boot.

Every node is a full systemd, and all of them run as the host's root (no user namespace),
so per-user kernel limits are shared by every node of every cluster on the host. Met on
the way to 64 nodes on a stock Debian 12 host:

- `fs.inotify.max_user_instances` (Debian: 128): each node's systemd, journald, udev-less
  services and logind take about 5 inotify instances; past about 20 nodes new nodes fail
  to start their services and never answer SSH (measured here: 1+32 on 128 failed from
  the 21st node on). Counted as 6 per node plus a few for the host.
- `fs.inotify.max_user_watches`: the watches of those instances (dynamic on kernels >=
  5.11, usually large; checked anyway).
- `kernel.pid_max` (32768): about 40 processes per idle node, many more under jobs.
- `net.ipv4.neigh.default.gc_thresh3` (1024): the host's ARP entries, one per node on
  the bridges; above it the kernel drops neighbours and nodes become unreachable.

A raise is for the running system only (/proc/sys, not /etc/sysctl.d): clusterbake
changes nothing that survives a reboot. Where it cannot write (not root, a read-only
/proc/sys), it refuses with the exact `sysctl -w` to run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clusterbake.errors import ClusterbakeError

PROC_SYS = Path("/proc/sys")


@dataclass(frozen=True)
class Limit:
    name: str  # sysctl name
    why: str
    base: int  # what the host needs besides the nodes
    per_node: int  # what each node needs
    floor: int  # a raise sets at least this (headroom for everything else on the host) ...
    headroom_per_node: int  # ... or base + this per node, whichever is more

    def need(self, nodes: int) -> int:
        return self.base + self.per_node * nodes

    def raise_to(self, nodes: int) -> int:
        return max(self.floor, self.base + self.headroom_per_node * nodes)

    @property
    def path(self) -> Path:
        return PROC_SYS / self.name.replace(".", "/")

    def current(self) -> int | None:
        try:
            return int(self.path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None


LIMITS = tuple(
    Limit(*row)
    for row in (
        ("fs.inotify.max_user_instances", "each node's systemd and services take about 5, all as root", 8, 6, 1024, 16),
        ("fs.inotify.max_user_watches", "the watches of those instances", 16384, 1024, 524288, 4096),
        ("kernel.pid_max", "every node's processes share the host's PID space", 8192, 256, 4194304, 1024),
        ("net.ipv4.neigh.default.gc_thresh3", "one ARP entry per node on the host's bridges", 256, 4, 4096, 8),
    )
)  # fmt: skip


@dataclass(frozen=True)
class Shortfall:
    limit: Limit
    current: int
    need: int
    target: int

    def command(self) -> str:
        return f"sysctl -w {self.limit.name}={self.target}"


def shortfalls(nodes: int, limits: tuple[Limit, ...] = LIMITS) -> list[Shortfall]:
    """The limits below what `nodes` nodes on this host need (limits this kernel lacks are skipped)."""
    found = []
    for limit in limits:
        current = limit.current()
        if current is not None and current < limit.need(nodes):
            found.append(Shortfall(limit, current, limit.need(nodes), limit.raise_to(nodes)))
    return found


def describe(short: Shortfall, nodes: int) -> str:
    return f"{short.limit.name} is {short.current}, {nodes} nodes need about {short.need} ({short.limit.why})"


def ensure(nodes: int, say: Callable[[str], None], limits: tuple[Limit, ...] = LIMITS) -> list[str]:
    """Raise every short limit for the running system and say so; a limit that cannot be raised fails
    with the commands to run. Returns what was changed."""
    changed, refused = [], []
    for short in shortfalls(nodes, limits):
        try:
            if os.geteuid() != 0:
                raise PermissionError("not root")
            short.limit.path.write_text(f"{short.target}\n")
        except OSError as exc:
            refused.append((short, exc))
            continue
        line = f"{short.limit.name} {short.current} -> {short.target}"
        say(f"    raised {line} for the running system: {nodes} nodes need about {short.need} ({short.limit.why})")
        changed.append(line)
    if refused:
        reasons = "; ".join(f"{describe(s, nodes)}: {e.strerror or e}" for s, e in refused)
        commands = " && ".join(s.command() for s, _ in refused)
        raise ClusterbakeError(f"host limits too low for {nodes} nodes: {reasons}. As root, run: {commands}")
    return changed
