"""Waiting for a cluster to reach a state, shared by the integration and twin tests."""

from __future__ import annotations

import itertools
import shlex
import time
from collections.abc import Callable


def wait_for(what, predicate, timeout, describe=None, interval=1.0):
    """predicate()'s first truthy answer within `timeout` seconds; else an AssertionError naming
    `what` and the last answer (or describe()'s account of the state)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what} not reached within {timeout}s (last: {describe() if describe else last})")


def poll(predicate, timeout=90.0, interval=0.5):
    """predicate()'s first truthy answer within `timeout` seconds, else its last (falsy) one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def submit_and_time_the_start(on_head: Callable[[str, float], str], options: str, command: str) -> tuple[str, float]:
    """sbatch on the head, then wait there until the job runs: (job id, seconds from sbatch to RUNNING).

    `on_head(script, timeout)` runs a shell script on the head and returns its stdout. Timed on the
    head (no SSH round trips in the figure). The job keeps running after that (`command` ends with
    a sleep), so its nodes' machines can be looked at while they run it."""
    script = (
        f"t0=$(date +%s%N); id=$(sbatch --parsable {options} --wrap {shlex.quote(command)}); "
        'while [ "$(squeue -h -j $id -o %T)" != RUNNING ]; do '
        '[ -z "$(squeue -h -j $id -o %T)" ] && break; sleep 0.2; done; '
        'echo $id $(( ($(date +%s%N) - t0) / 1000000 )) "$(squeue -h -j $id -o %T)"'
    )
    job, millis, state = on_head(script, 400).split()
    assert state == "RUNNING", f"job {job}: {state}"
    return job, int(millis) / 1000


def drained_by_the_poll_that_saw_the_notice(notice_log: str, node: str) -> bool:
    """The notice agent's log (/var/log/clusterbake/notice.log) shows a notice and, next, the drain of
    `node` that it did in the same poll, which succeeded: "within a poll" (docs/faults.md), read from
    what the agent did rather than timed from outside, which a loaded machine would skew."""
    lines = [line.split(" ", 1)[1] for line in notice_log.splitlines() if " " in line]
    return any(
        first.startswith("notice: ") and second == f"drain {node}: {first[len('notice: ') :]}"
        for first, second in itertools.pairwise(lines)
    )


def notice_log_after_the_drain(read_log: Callable[[], str], node: str, timeout: float = 15.0) -> str:
    """The notice agent's log once it shows the notice's drain of `node` (the agent writes that line
    after scontrol returns, so a reader that saw the drain in Slurm can be a moment early), or as it
    stands when `timeout` ends: the caller asserts on it."""
    text = read_log()
    deadline = time.monotonic() + timeout
    while not drained_by_the_poll_that_saw_the_notice(text, node) and time.monotonic() < deadline:
        time.sleep(0.25)
        text = read_log()
    return text
