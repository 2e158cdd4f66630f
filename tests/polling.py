"""Waiting for a cluster to reach a state, shared by the integration and twin tests."""

from __future__ import annotations

import time


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
