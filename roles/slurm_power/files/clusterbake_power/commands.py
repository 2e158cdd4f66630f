"""The programs Slurm calls (the name the program is called by says which: slurm.conf(5)), the
reconcile loop, and main. scontrol goes through `core` (tests put a recorder there)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from . import core, network
from .aws import AwsBackend
from .azure import AzureBackend
from .core import CONFIG, LOST, RESUME_FAILED, PowerError, log, read_state, update_state
from .local import LocalAgent

NOT_READY = re.compile(r"POWERED_DOWN|POWERING_UP|NOT_RESPONDING")


def backend(config: dict):
    if config.get("provider") == "local":
        return LocalAgent(config)
    if config.get("provider") == "aws":
        return AwsBackend(config)
    if config.get("provider") == "azure":
        return AzureBackend(config)
    raise PowerError(f"{CONFIG}: provider {config.get('provider')!r} has no power backend in this image")


def waiting_jobs() -> str:
    """The jobs a resume is for, from SLURM_RESUME_FILE (slurmctld writes it since 22.05), e.g.
    "job 12 (partition cpu, 4 nodes to power up: cpu-[1-4])"; "" when Slurm gave none."""
    path = os.environ.get("SLURM_RESUME_FILE")
    if not path:
        return ""
    try:
        jobs = json.loads(Path(path).read_text()).get("jobs", [])
    except (OSError, ValueError) as exc:
        return f"SLURM_RESUME_FILE unreadable: {exc}"
    return "; ".join(
        f"job {job.get('job_id')} (partition {job.get('partition')}, nodes to power up: {job.get('nodes_resume')})"
        for job in jobs
    )


def resume(config: dict, hostlist: str) -> int:
    nodes = core.expand(hostlist)
    log(config, f"resume {','.join(nodes)} for {waiting_jobs() or 'jobs waiting for them'}")
    try:
        results = backend(config).power("start", nodes)
    except PowerError as exc:
        results = {node: str(exc) for node in nodes}
    failed = {node: result for node, result in results.items() if result != "ok"}
    for node, reason in sorted(failed.items()):
        core.set_down(config, [node], f"{RESUME_FAILED}: {reason}")
    return 1 if failed else 0


def suspend(config: dict, hostlist: str) -> int:
    nodes = core.expand(hostlist)
    log(config, f"suspend {','.join(nodes)} (idle past their idle_time)")
    results = backend(config).power("stop", nodes)
    failed = {node: result for node, result in results.items() if result != "ok"}
    for node, reason in sorted(failed.items()):
        log(config, f"suspend {node} failed: {reason} (the reconcile loop will retry)")
    return 1 if failed else 0


def resume_fail(config: dict, hostlist: str) -> int:
    nodes = core.expand(hostlist)
    log(config, f"resume-fail {','.join(nodes)}: not registered within ResumeTimeout; powering them off")
    backend(config).power("stop", nodes)
    # Slurm left them DOWN ("ResumeTimeout reached"): our reason lets the reconcile loop
    # return them after failed_node_cooldown, as after a failed start.
    core.set_down(config, nodes, f"{RESUME_FAILED}: not registered within ResumeTimeout")
    return 0


def wait_nodes(config: dict) -> int:
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    # Without the program's settings (no power.json: no elastic node) there is nothing to wait for.
    deadline = time.monotonic() + float(config.get("resume_timeout", 0))
    while nodelist and time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "node", "-o", nodelist], capture_output=True, text=True)
        if shown.returncode == 0 and not NOT_READY.search(shown.stdout):
            return 0
        time.sleep(0.5)
    return 0


def node_states() -> dict[str, dict]:
    """Every node Slurm knows, powered down ones included: name -> {state, reason, since}."""
    out = subprocess.run(
        ["sinfo", "--all", "--noheader", "--Node", "--format=%N|%T|%E|%H"], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise PowerError(f"sinfo: {out.stderr.strip()}")
    states = {}
    for line in out.stdout.splitlines():
        name, state, reason, since = [*line.split("|"), "", "", ""][:4]
        states[name.strip()] = {"state": state.strip().lower(), "reason": reason.strip(), "since": since.strip()}
    return states


def _since_seconds(stamp: str) -> float | None:
    try:
        return time.time() - datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def reconcile(config: dict) -> int:
    """One pass: orphans stopped after orphan_grace, failed resumes back in service after the cool-down,
    lost static nodes replaced, topology.conf where the instances are (aws: module network). Only on
    the head whose slurmctld is in control (a backup controller's timer runs too)."""
    if not core.in_control():
        return 0
    states = node_states()
    power = backend(config)
    running = power.running()
    memory = read_state()
    orphans_seen: dict[str, float] = memory.get("orphans", {})
    now = time.time()
    elastic = set(config["elastic_nodes"])
    for name in sorted(elastic):
        info = states.get(name)
        if info is None:
            continue
        powered_down = "powered_down" in info["state"] or info["state"].endswith("~")
        if powered_down and name in running and "powering_down" not in info["state"]:
            first = orphans_seen.setdefault(name, now)
            if now - first >= config["orphan_grace"]:
                log(config, f"reconcile: {name} runs although Slurm powered it down: stopping it")
                power.power("stop", [name])
                orphans_seen.pop(name, None)
        else:
            orphans_seen.pop(name, None)
        age = _since_seconds(info["since"])
        if (
            info["state"].startswith("down")
            and info["reason"].startswith(RESUME_FAILED)
            and age is not None
            and age >= config["failed_node_cooldown"]
        ):
            log(config, f"reconcile: {name} down since {info['since']} ({info['reason']}): back to service")
            power.power("stop", [name])
            if "#" in info["state"] or "powering_up" in info["state"]:
                # Set DOWN while powering up (down#): RESUME would leave it idle# until ResumeTimeout,
                # with no ResumeProgram call (seen with Slurm 22.05). POWER_DOWN ends the power-up: the
                # node is idle~ after SuspendTimeout, and the next job powers it up again.
                core.scontrol("update", f"NodeName={name}", "State=POWER_DOWN")
            else:
                core.scontrol("update", f"NodeName={name}", "State=RESUME")
    lost = replace_lost_nodes(config, states, power, running, memory.get("lost", {}), now)
    update_state(lambda kept: kept.update(orphans=orphans_seen, lost=lost))
    network.refresh(config, power, now)
    return 0


def replace_lost_nodes(config: dict, states: dict, power, running: set[str], lost: dict, now: float) -> dict:
    """Static nodes whose machine is gone (killed, terminated, reclaimed): DOWN at once, so Slurm
    requeues their jobs instead of waiting SlurmdTimeout, then started again (clouds: a new
    instance at the node's address) and returned to service; a start that fails is retried after
    failed_node_cooldown. A node a person (or `clusterbake node stop`) took out of service is left
    alone; one that clusterbake drained (a spot notice, a health check) is replaced too: the new
    machine is checked again when it joins. Returns the nodes being brought back: name -> time
    of the last start."""
    if not config["replace_lost_nodes"]:
        return {}
    retry = float(config["failed_node_cooldown"])
    kept = {}
    for name in sorted(config["static_nodes"]):
        info = states.get(name)
        if info is None or name in running:
            continue  # running (it registers by itself), or unknown to Slurm
        reason = info["reason"]
        # Ours, or Slurm's own word for a node it lost (after SlurmdTimeout without us).
        ours = reason.startswith(("clusterbake: ", "clusterbake-health:")) or reason == "Not responding"
        if info["state"].startswith(("down", "drain", "fail")) and not ours:
            continue
        if not reason.startswith(LOST):
            core.set_down(
                config, [name], f"{LOST}: its machine is not running; its jobs are requeued, it is started again"
            )
        last = lost.get(name)
        if last is not None and now - last < retry:
            kept[name] = last
            continue
        kept[name] = now
        result = power.power("start", [name]).get(name, "no answer")
        if result != "ok":
            log(config, f"reconcile: {name} lost: start failed: {result} (retried in {retry:.0f} s)")
            continue
        # DOWN (and a DRAIN it had) ends now: Slurm pings it and it registers within seconds.
        core.scontrol("update", f"NodeName={name}", "State=RESUME")
        log(config, f"reconcile: {name} lost: started again and returned to service")
    return kept


def main(argv: list[str]) -> int:
    command = Path(argv[0]).name.removeprefix("clusterbake-")
    args = argv[1:]
    if command == "power":
        command, args = (args[0], args[1:]) if args else ("", [])
    config = json.loads(CONFIG.read_text()) if CONFIG.exists() else {}
    if config.get("state_file"):
        # With a backup controller the state is where both heads read it (role slurm_power).
        core.STATE = Path(config["state_file"])
    try:
        if command == "resume" and len(args) == 1:
            return resume(config, args[0])
        if command == "suspend" and len(args) == 1:
            return suspend(config, args[0])
        if command == "resume-fail" and len(args) == 1:
            return resume_fail(config, args[0])
        if command == "reconcile" and not args:
            return reconcile(config)
        if command == "wait-nodes":
            return wait_nodes(config)
    except KeyError as exc:
        # Role slurm_power writes every setting; a key missing means another power.json.
        log(config, f"{command}: {CONFIG} has no {exc} (written by role slurm_power: run `clusterbake cluster up`)")
        return 1
    except (PowerError, OSError, ValueError) as exc:
        log(config, f"{command}: {exc}")
        return 1
    print(
        "usage: clusterbake-resume|clusterbake-suspend|clusterbake-resume-fail HOSTLIST, "
        "or clusterbake-power reconcile",
        file=sys.stderr,
    )
    return 2
