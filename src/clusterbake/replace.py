"""`clusterbake node replace`: compute nodes get a new disk (instance) from the cluster's image or
the newest one, and boot; they join by themselves from their group's bundle.

Never under a job: a node is replaced only when Slurm shows it drained (or down, or powered
down) and running nothing; `ops replace` and `ops image_update` drain it and wait for that.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass

from clusterbake import remote
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.progress import say
from clusterbake.providers.base import Provider

# sinfo's compact states (%t) in which Slurm starts nothing on a node: drained, down, failed.
OUT_OF_SERVICE = ("drain", "down", "fail")
# A booted node's slurmd registers within seconds; its boot (SSH) is waited for before.
REGISTER_TIMEOUT = 120.0


@dataclass(frozen=True)
class SlurmNode:
    state: str  # sinfo's compact state (%t): drain, drng, idle~, down*, ...; "" when Slurm does not know it
    jobs: list[str]
    slurmd_started: str  # scontrol's SlurmdStartTime: changes when a new slurmd registers


def slurm_view(provider: Provider, names: list[str]) -> dict[str, SlurmNode]:
    """Each node's Slurm state, jobs and slurmd start time, in one command on the head."""
    quoted = " ".join(shlex.quote(n) for n in names)
    command = (
        f"for n in {quoted}; do "
        'printf "%s|%s|%s|%s\\n" "$n" "$(sinfo -h -N -n "$n" -o %t 2>/dev/null | head -1)" '
        '"$(squeue -h -w "$n" -o %A 2>/dev/null | paste -sd, -)" '
        '"$(scontrol show node -o "$n" 2>/dev/null | grep -o "SlurmdStartTime=[^ ]*" | cut -d= -f2)"; done'
    )
    text = remote.run(provider.controller_endpoint(), command, timeout=60).text()
    view = {}
    for line in text.splitlines():
        name, state, jobs, started = [*line.split("|"), "", "", ""][:4]
        view[name] = SlurmNode(state.strip(), [j for j in jobs.strip().split(",") if j], started.strip())
    return view


def wait_registered(provider: Provider, names: list[str], before: dict[str, SlurmNode], timeout: float) -> None:
    """Until each node's new slurmd registered with slurmctld (a new start time, responding)."""
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending:
        view = slurm_view(provider, pending)
        pending = [
            n
            for n in pending
            if n not in view
            or view[n].slurmd_started == before.get(n, SlurmNode("", [], "")).slurmd_started
            or view[n].state.endswith("*")
        ]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise ClusterbakeError(
                f"{', '.join(pending)} booted but their slurmd did not register within {timeout:.0f}s; see "
                "`clusterbake ssh NODE -- journalctl -u clusterbake-node-join -u slurmd` and `sinfo -R` on the head"
            )
        time.sleep(1)


def refusal(name: str, node: SlurmNode) -> str | None:
    """Why a node must not be replaced now (None: it may)."""
    if node.jobs:
        return f"{name} runs job(s) {', '.join(node.jobs)}"
    bare = node.state.rstrip("*")
    if not node.state or bare.endswith("~") or bare.startswith(OUT_OF_SERVICE):
        return None
    return f"{name} is {node.state} in Slurm, not drained: a job could start on it"


def replace(provider: Provider, names: list[str], newest: bool = False, force: bool = False) -> str:
    """Replace the nodes one after the other, each back in Slurm (still drained) before the next;
    the image they boot (its name or id)."""
    for name in names:
        if provider.node(name).role != "compute":
            raise ConfigError(f"node replace: {name} is the head; only compute nodes are replaced")
    try:
        before = slurm_view(provider, names)
    except ClusterbakeError as exc:
        if not force:
            raise ClusterbakeError(
                f"cannot ask Slurm whether {', '.join(names)} run jobs ({str(exc).splitlines()[0]}); "
                "--force replaces them anyway"
            ) from None
        before = {}
    refused = [r for n in names if (r := refusal(n, before.get(n, SlurmNode("", [], ""))))]
    if refused and not force:
        raise ClusterbakeError(
            "; ".join(refused) + ". Nothing was replaced: `clusterbake ops replace -e node=NAME` drains a node, "
            "waits until its jobs end and replaces it (--force replaces now and kills what runs there)"
        )
    image = provider.find_image() if newest else None
    for name in names:
        powered_down = before.get(name, SlurmNode("", [], "")).state.rstrip("*").endswith("~")
        provider.replace_node(name, image)
        if before and not powered_down:
            wait_registered(provider, [name], before, REGISTER_TIMEOUT)
        say(f"    {name}: replaced" + ("" if powered_down else ", its slurmd registered"))
    return str(image) if image is not None else str(provider.cluster.read_state().get("image"))
