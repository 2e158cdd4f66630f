"""topology.conf kept where the compute instances are (aws).

EC2 places an instance in its network only while it runs (DescribeInstanceTopology answers for
running instances of the types it documents), so an elastic node the head launched, or a lost
node it replaced, hangs under `unplaced` in the topology.conf `cluster up` wrote. Each reconcile
pass (on the head in control) asks EC2 where the running compute instances hang when they, or
the file, changed since the last pass (or RECHECK seconds went by: EC2 may place a new instance
a moment after it runs), writes topology.conf as role slurm's template does (module `topology`,
shared with the controller) and has slurmctld read it again (`scontrol reconfigure`) when it
changed. Jobs started after that are placed by the network; a job is never moved.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from . import core
from .core import log, read_state, update_state
from .topology import TopologyError, render, switches

RECHECK = 600.0


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def refresh(config: dict, power, now: float) -> None:
    """Rewrite topology.conf (power.json's `topology_file`; none: the cluster has no topology) from
    where `power`'s running compute instances hang; slurmctld reconfigured when it changed."""
    if not config.get("topology_file") or not hasattr(power, "network_paths"):
        return
    path = Path(config["topology_file"])
    nodes = sorted(config["static_nodes"] + config["elastic_nodes"])
    running = power.running_instance_ids(nodes)
    current = path.read_text() if path.exists() else ""
    seen = {"instances": sorted(running.values()), "file": _digest(current)}
    last = read_state().get("topology", {})
    if {k: last.get(k) for k in seen} == seen and now - last.get("at", 0) < RECHECK:
        return
    try:
        paths = power.network_paths(running)
    except Exception as exc:
        words = power.cloud_error(exc)
        if words is None:
            raise
        # The loop's other work is done; the next pass asks again (no state kept).
        log(config, f"topology: EC2 DescribeInstanceTopology: {words}; {path} left as it is")
        return
    try:
        text = render(switches(paths, nodes, compress=core.compress, expected=True))
    except TopologyError as error:  # not a tree: Slurm would refuse it; jobs are placed without it
        log(config, f"topology: EC2's instance topology makes no tree ({error}): {path} left as it is")
        text = current
    if text != current:
        path.write_text(text)  # in place: the file is SlurmUser's, its directory root's
        core.scontrol("reconfigure")
        leaves = sum(1 for line in text.splitlines() if line.startswith("SwitchName=") and " Nodes=" in line)
        log(config, f"topology: {path} rewritten for {len(running)} running node(s), {leaves} leaf switch(es)")
    update_state(lambda memory: memory.update(topology={**seen, "file": _digest(text), "at": now}))
