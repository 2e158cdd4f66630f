"""Host limits (clusterbake.nspawn.limits) against a /proc/sys of the test's own: what is short for
how many nodes, what a raise writes and says, and the exact sysctl when it cannot write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterbake.errors import ClusterbakeError
from clusterbake.nspawn import limits

DEBIAN_12 = {
    "fs/inotify/max_user_instances": 128,
    "fs/inotify/max_user_watches": 192530,
    "kernel/pid_max": 32768,
    "net/ipv4/neigh/default/gc_thresh3": 1024,
}


@pytest.fixture
def proc_sys(tmp_path, monkeypatch) -> Path:
    for name, value in DEBIAN_12.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"{value}\n")
    monkeypatch.setattr(limits, "PROC_SYS", tmp_path)
    return tmp_path


def test_a_small_cluster_fits_debian_12(proc_sys):
    assert limits.shortfalls(9) == []


def test_past_about_twenty_nodes_inotify_instances_run_short(proc_sys):
    assert limits.shortfalls(20) == []  # 20 nodes came up on 128 here; the 21st did not
    (short,) = limits.shortfalls(33)
    assert (short.limit.name, short.current, short.need) == ("fs.inotify.max_user_instances", 128, 206)
    assert short.command() == "sysctl -w fs.inotify.max_user_instances=1024"
    names = {s.limit.name for s in limits.shortfalls(200)}
    assert names == {limit.name for limit in limits.LIMITS}  # at 200 nodes, every one of them


@pytest.mark.skipif(os.geteuid() != 0, reason="raising needs root (it writes the test's copy of /proc/sys)")
def test_ensure_raises_for_the_running_system_and_says_why(proc_sys):
    said: list[str] = []
    changed = limits.ensure(65, said.append)
    assert changed == ["fs.inotify.max_user_instances 128 -> 1048"]
    assert (proc_sys / "fs/inotify/max_user_instances").read_text() == "1048\n"
    assert "65 nodes need about 398 (each node's systemd and services take about 5, all as root)" in said[0]
    assert (proc_sys / "kernel/pid_max").read_text() == "32768\n"  # not short: untouched
    assert limits.ensure(65, said.append) == []  # already enough: nothing written again


def test_ensure_refuses_with_the_command_when_it_cannot_write():
    # A real sysctl without write permission (even for root): the failure path of a read-only /proc/sys.
    unwritable = limits.Limit("kernel.cap_last_cap", "a test limit", 10**6, 0, 10**6, 0)
    assert unwritable.current() is not None
    said: list[str] = []
    with pytest.raises(ClusterbakeError) as error:
        limits.ensure(33, said.append, limits=(unwritable,))
    message = str(error.value)
    assert message.startswith("host limits too low for 33 nodes: kernel.cap_last_cap is ")
    assert message.endswith("As root, run: sysctl -w kernel.cap_last_cap=1000000")
    assert said == []
