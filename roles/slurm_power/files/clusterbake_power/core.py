"""What every part of the power program uses: its config and state files, the log, scontrol.

The state file is shared by separate processes (resume, suspend and reconcile may overlap):
it is changed only under its lock, through `update_state`."""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

CONFIG = Path(os.environ.get("CLUSTERBAKE_POWER_CONFIG", "/etc/clusterbake/power.json"))
STATE = Path(os.environ.get("CLUSTERBAKE_POWER_STATE", "/var/spool/clusterbake-power/state.json"))
# Reasons the program sets DOWN with, and reads back (the reconcile loop returns such nodes).
RESUME_FAILED = "clusterbake: resume failed"
LOST = "clusterbake: node lost"
# How many machines one program starts or deletes at once.
PARALLEL = 8

# Ubuntu 22.04's Python 3.10 has no datetime.UTC.
UTC = timezone.utc  # noqa: UP017


class PowerError(Exception):
    pass


def read_state() -> dict:
    try:
        return json.loads(STATE.read_text())
    except (OSError, ValueError):
        return {}


def update_state(change) -> object:
    """Read, change and write the state file under a lock (resume, suspend and reconcile may overlap)."""
    STATE.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(STATE.with_name(STATE.name + ".lock"), os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        memory = read_state()
        result = change(memory)
        tmp = STATE.with_name(f".{STATE.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(memory))
        os.replace(tmp, STATE)
        return result
    finally:
        os.close(fd)


def log(config: dict, message: str) -> None:
    line = f"{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')} {message}"
    print(line, file=sys.stderr, flush=True)
    try:
        path = Path(config.get("log", "/var/log/clusterbake/power.log"))
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            handle.write(line + "\n")
    except OSError:
        pass  # the journal has it


def scontrol(*args: str) -> str:
    result = subprocess.run(["scontrol", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise PowerError(f"scontrol {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


# `scontrol ping`: a line per SlurmctldHost, in slurm.conf's order ("Slurmctld(primary) at head is UP").
CONTROLLER_LINE = re.compile(r"^Slurmctld\((?:[^)]*)\) at (\S+) is (UP|DOWN)", re.MULTILINE)


def controller_in_control(ping: str) -> str | None:
    """The controller in control, from `scontrol ping`'s answer: the first of the SlurmctldHost list that
    answers (slurm.conf(5): a backup runs the cluster while every controller before it is down); None:
    none answers."""
    return next((host for host, status in CONTROLLER_LINE.findall(ping) if status == "UP"), None)


def in_control() -> bool:
    """Whether this host's slurmctld is the one in control. With one controller, always: the loop runs
    where slurmctld runs. (`scontrol ping` exits non-zero when one is down: its answer is read anyway.)"""
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True).stdout
    if len(CONTROLLER_LINE.findall(ping)) <= 1:
        return True
    return controller_in_control(ping) == socket.gethostname().split(".")[0]


def expand(hostlist: str) -> list[str]:
    return scontrol("show", "hostnames", hostlist).split()


def compress(names: list[str]) -> str:
    """`names` as one sorted hostlist, as python-hostlist's collect_hostlist writes it (module topology)."""
    return scontrol("show", "hostlistsorted", ",".join(names)).strip()


def set_down(config: dict, nodes: list[str], reason: str) -> None:
    if nodes:
        scontrol("update", f"NodeName={','.join(nodes)}", "State=DOWN", f"Reason={reason[:250]}")
        log(config, f"DOWN {','.join(nodes)}: {reason}")
