"""Cluster lifecycle shared by every provider: provision, configure, wait, report."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

from clusterbake import applied, remote
from clusterbake.ansible import ansible_env, run_playbook
from clusterbake.config import ClusterConfig, check_accounting_files, check_directory_files, extra_ca_files
from clusterbake.dry_run import check_cost_limit
from clusterbake.dry_run import plan as dry_run_plan
from clusterbake.errors import ClusterbakeError, ConfigError, NodesDidNotBoot
from clusterbake.paths import repo_root
from clusterbake.progress import phase, say
from clusterbake.providers import get_provider
from clusterbake.providers.base import BillingCheck, NodeStatus, Provider
from clusterbake.remote import Endpoint
from clusterbake.state import StateDir

IDLE_TIMEOUT = 90.0
INVENTORY_SCRIPTS = {"local": "local.py", "aws": "aws_ec2.py", "azure": "azure_rm.py"}


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


def up(
    config: ClusterConfig,
    config_path: Path,
    provision_only: bool = False,
    reconfigure: bool = False,
    dry_run: bool = False,
    max_cost_per_hour: float | None = None,
) -> dict:
    """Create or update the cluster. `dry_run`: the read-only checks and the plan with its price
    (summary["dry_run"]), nothing made; `max_cost_per_hour` (else the config's) refuses a plan over it."""
    state = StateDir.for_config(config)
    provider = get_provider(config, state)
    summary: dict = {"cluster": config.cluster_name}
    provider.validate()
    extra_ca_files(config)  # unresolvable globs are input errors, found before anything is created
    check_accounting_files(config)
    check_directory_files(config)
    image = provider.find_image()
    if max_cost_per_hour is not None and max_cost_per_hour <= 0:
        raise ConfigError(f"--max-cost-per-hour: {max_cost_per_hour:g}: a price per hour above 0")
    limit, source = max_cost_per_hour, "--max-cost-per-hour"
    if limit is None:
        limit, source = config.max_cost_per_hour, "max_cost_per_hour"
    if dry_run or limit is not None:
        if dry_run:  # a real `up` checks it in provision()
            provider.check_image(image)
        with phase("plan and price (read-only)"):
            plan = dry_run_plan(provider)
        if dry_run:  # the caller shows the plan, then applies the limit
            summary |= {"dry_run": plan, "cost_limit": (limit, source)}
            return summary
        check_cost_limit(plan, limit, source)
    created = not provider.cluster.exists()
    with phase(f"provision {len(provider.nodes)} nodes ({config.provider})"):
        try:
            provider.provision(image)
        except BaseException:
            _roll_back_if_created(provider, created)
            raise
    summary["nodes"] = len(provider.nodes)
    try:
        if provision_only:
            provider.finish_provision()
            return summary
        summary.update(_configure(config, config_path, provider, state, reconfigure))
    except NodesDidNotBoot:  # the local provider's compute nodes start and boot while the head is configured
        _roll_back_if_created(provider, created)
        raise
    with phase("wait for compute nodes to be idle in Slurm"):
        states = wait_idle(provider)
        say("    " + ", ".join(f"{n}={s}" for n, s in sorted(states.items())))
    summary["slurm"] = states
    return summary


def _roll_back_if_created(provider: Provider, created: bool) -> None:
    if created and provider.destroy_after_failed_first_provision:
        say("    provisioning failed: removing what this run created")
        provider.rollback()


def _configure(
    config: ClusterConfig, config_path: Path, provider: Provider, state: StateDir, reconfigure: bool
) -> dict:
    """ansible/cluster.yml on the head (skipped when nothing changed since it last ran), then the
    join bundles to the nodes; {"changed": tasks changed, "played": whether the play ran}."""
    provider.wait_ready()
    log_file = provider.cluster.logs / f"cluster-up-{_stamp()}.log"
    with phase("configure (ansible/cluster.yml)"):
        inputs = applied.inputs_digest(config, provider.inventory(), provider.cluster.root / "secrets")
        last = applied.read_record(provider.cluster.root)
        head = provider.endpoint("head")
        needed = True
        if reconfigure:
            say("    --reconfigure: running the play whatever changed")
        elif last.get("inputs") == inputs:
            drift = applied.head_state(head).drift(last.get("head", {}))
            if drift:
                shown = "; ".join(drift[:10]) + (f"; {len(drift) - 10} more" if len(drift) > 10 else "")
                say(f"    drift on the head since the last configure: {shown}; configuring again")
            else:
                needed = False
                say(f"    nothing changed since the last configure (inputs {inputs[:12]}, head as applied): skipped")
        changed = 0
        if needed:
            say(f"    log: {log_file}")
            with provider.configuring():
                result = run_playbook(
                    "cluster.yml",
                    repo_root() / "inventories" / INVENTORY_SCRIPTS[config.provider],
                    log_file,
                    ansible_env(config_path, state.root),
                )
            say(f"    {result.ok} ok, {result.changed} changed on {len(result.recap)} nodes")
            changed = result.changed
        finish_configure(provider, inputs if needed else None)
    return {"changed": changed, "played": needed}


def finish_configure(provider: Provider, inputs: str | None) -> list[str]:
    """After ansible/cluster.yml: the nodes get their group's new join bundle (local: running nodes
    whose bundle differs; clouds: the secret store, then the running nodes fetch it) and, when the
    play ran (`inputs`: the digest of what it applied), the record a next `cluster up` compares with."""
    changes = provider.after_configure()
    if inputs is not None:
        applied.write_record(provider.cluster.root, inputs, applied.head_state(provider.endpoint("head")))
    return changes


def publish(config: ClusterConfig) -> list[str]:
    """`cluster publish`: what `cluster up` does after its play, for the ops playbooks that import
    ansible/cluster.yml (the same play, so its inputs are the ones it applied)."""
    provider = get_provider(config)
    with phase("hand the join bundles to the nodes"):
        inputs = applied.inputs_digest(config, provider.inventory(), provider.cluster.root / "secrets")
        return finish_configure(provider, inputs)


def slurm_node_states(provider: Provider) -> dict[str, str]:
    return _sinfo_states(provider.controller_endpoint())


def _sinfo_states(head: Endpoint) -> dict[str, str]:
    result = remote.run(head, ["sinfo", "--noheader", "--Node", "--format=%N %t"], timeout=30)
    states = {}
    for line in result.text().splitlines():
        name, _, state = line.partition(" ")
        states[name] = state.strip()
    return states


# sinfo's short states of a node that takes jobs: idle, or busy with some.
SLURM_READY = ("idle", "mix", "alloc")


def wait_idle(provider: Provider, timeout: float = IDLE_TIMEOUT) -> dict[str, str]:
    """Static compute nodes idle (or busy); elastic ones known to Slurm (powered down until jobs come)."""
    static = {n.name for n in provider.nodes if n.role == "compute" and not n.elastic}
    planned = {n.name for n in provider.nodes if n.role == "compute"}
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    head = provider.controller_endpoint()  # one lookup (an API call on clouds), one connection for every poll
    while time.monotonic() < deadline:
        states = _sinfo_states(head)
        if planned <= set(states) and all(states[n] in SLURM_READY for n in static):
            return {n: states[n] for n in sorted(planned)}
        time.sleep(0.5)
    not_ready = sorted(n for n in static if states.get(n) not in SLURM_READY)
    raise ClusterbakeError(
        f"compute nodes not idle after {timeout:.0f}s: {json.dumps(states)}; "
        f"{_slurm_reasons(head, not_ready)}check `clusterbake ssh head -- sinfo -R` and /var/log/slurm on the nodes"
    )


def _slurm_reasons(head: Endpoint, nodes: list[str]) -> str:
    """'Slurm's reasons: NODE: REASON, ...; ' for the nodes Slurm gives a reason for (a drain's: a health
    check that failed, a slurmd that registered with less than planned), else ''."""
    if not nodes:
        return ""
    try:
        listed = remote.run(head, ["sinfo", "--noheader", "--list-reasons", "--Node", "--format=%N|%E"], timeout=30)
    except ClusterbakeError:
        return ""  # the error names the states and where to look; a reason that cannot be read adds nothing
    reasons = dict(line.split("|", 1) for line in listed.text().splitlines() if "|" in line)
    told = [f"{node}: {reasons[node].strip()}" for node in nodes if node in reasons]
    return f"Slurm's reasons: {', '.join(told)}; " if told else ""


def status(config: ClusterConfig) -> dict:
    provider = get_provider(config)
    nodes = provider.status()
    slurm: dict[str, str] = {}
    if any(n.role == "head" and n.state == "running" for n in nodes):
        try:
            slurm = slurm_node_states(provider)
        except ClusterbakeError as exc:  # remote.RemoteError included
            slurm = {"error": str(exc)}
    state = provider.cluster.read_state()
    try:
        newest = str(provider.find_image())
    except ClusterbakeError:  # none built yet: nothing newer to move to
        newest = None
    return {
        "cluster": config.cluster_name,
        "provider": config.provider,
        "image": image_name(state["image"]) if state.get("image") else None,
        # What `cluster up` boots a new cluster from, and `ops image_update` moves nodes to.
        "newest_image": image_name(newest) if newest else None,
        "nodes": [
            {
                "name": n.name,
                "role": n.role,
                "nodegroup": n.nodegroup,
                "address": n.address,
                "state": n.state,
                "image": n.image,
                "slurm_state": slurm.get(n.name),
                "detail": n.detail,
            }
            for n in nodes
        ],
        "slurm_error": slurm.get("error"),
        "summary": node_counts(nodes, slurm),
        "cost": cost.to_json() if (cost := provider.cost()) is not None else None,
    }


def image_name(image: str) -> str:
    """A local image's directory name; a cloud image id as it is."""
    return Path(image).name if image.startswith("/") and "/providers/" not in image else image


def node_counts(nodes: list[NodeStatus], slurm: dict[str, str]) -> dict[str, int]:
    """How many nodes are running, stopped (on clouds their disks still bill) and absent (not
    launched, or powered down: `powered_down` counts the nodes Slurm shows powered off, `~`)."""
    counts = {"running": 0, "stopped": 0, "absent": 0}
    for node in nodes:
        counts[node.state] = counts.get(node.state, 0) + 1
    counts["powered_down"] = sum(1 for n in nodes if (slurm.get(n.name) or "").endswith("~"))
    return counts


def down(config: ClusterConfig) -> tuple[list[str], BillingCheck | None]:
    """Destroy the cluster, then check (read-only) what of it still bills: (removed, check)."""
    provider = get_provider(config)
    with phase(f"destroy cluster {config.cluster_name}"):
        removed = provider.destroy()
        for item in removed:
            say(f"    removed {item}")
        if not removed:
            say("    nothing to remove")
    with phase("check what still bills"):
        check = provider.billing_leftovers()
    return removed, check
