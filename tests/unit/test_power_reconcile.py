"""The head's reconcile loop (roles/slurm_power/files/clusterbake_power/commands.py) with lost static nodes:
DOWN at once so Slurm requeues their jobs, started again, retried after the cool-down, and
nodes a person took out left alone. Slurm's answers are recorded sinfo lines; the power backend
is a recorder of the calls the program makes to the provider (local agent or EC2), whose own
tests are tests/aws/test_power_backend.py and tests/integration/test_faults.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import programs
import pytest


class Recorder:
    def __init__(self, running: set[str], fail: set[str] = frozenset()):
        self._running = running
        self.fail = fail
        self.calls: list[tuple[str, list[str]]] = []

    def running(self) -> set[str]:
        return set(self._running)

    def power(self, action: str, nodes: list[str]) -> dict[str, str]:
        self.calls.append((action, nodes))
        return {n: ("InsufficientInstanceCapacity: none left" if n in self.fail else "ok") for n in nodes}


@pytest.fixture
def program(tmp_path, monkeypatch):
    module = programs.power_program(monkeypatch, tmp_path / "state.json")
    updates: list[tuple[str, ...]] = []
    monkeypatch.setattr(module.core, "scontrol", lambda *args: updates.append(args) or "")
    config = programs.power_settings(
        static_nodes=["cpu-1", "cpu-2", "cpu-3"], failed_node_cooldown=300, log=str(tmp_path / "power.log")
    )
    # What the tests use: the function, the scontrol calls it made, the config it is given.
    return SimpleNamespace(replace_lost_nodes=module.commands.replace_lost_nodes, updates=updates, config=config)


def states(**by_node: tuple[str, str]) -> dict[str, dict]:
    return {name.replace("_", "-"): {"state": s, "reason": r, "since": ""} for name, (s, r) in by_node.items()}


def test_a_lost_node_is_set_down_and_started_again(program):
    power = Recorder(running={"cpu-1", "cpu-3"})
    slurm = states(cpu_1=("idle", "none"), cpu_2=("allocated", "none"), cpu_3=("mixed", "none"))
    lost = program.replace_lost_nodes(program.config, slurm, power, power.running(), {}, now=1000.0)
    assert program.updates == [
        (
            "update",
            "NodeName=cpu-2",
            "State=DOWN",
            "Reason=clusterbake: node lost: its machine is not running; its jobs are requeued, it is started again",
        ),
        ("update", "NodeName=cpu-2", "State=RESUME"),
    ]
    assert power.calls == [("start", ["cpu-2"])]
    assert lost == {"cpu-2": 1000.0}


def test_a_failed_start_is_retried_after_the_cooldown_only(program):
    power = Recorder(running=set(), fail={"cpu-2"})
    down = ("down*", "clusterbake: node lost: its machine is not running; ...")
    slurm = states(cpu_2=down)
    program.config["static_nodes"] = ["cpu-2"]
    first = program.replace_lost_nodes(program.config, slurm, power, set(), {}, now=1000.0)
    soon = program.replace_lost_nodes(program.config, slurm, power, set(), first, now=1100.0)
    later = program.replace_lost_nodes(program.config, slurm, power, set(), soon, now=1301.0)
    assert power.calls == [("start", ["cpu-2"]), ("start", ["cpu-2"])]
    assert (first, soon, later) == ({"cpu-2": 1000.0}, {"cpu-2": 1000.0}, {"cpu-2": 1301.0})
    assert program.updates == []  # DOWN with our reason already: not set again; not started: no RESUME
    assert (
        "reconcile: cpu-2 lost: start failed: InsufficientInstanceCapacity: none left (retried in 300 s)"
        in Path(program.config["log"]).read_text()
    )


@pytest.mark.parametrize(
    "taken_out",
    [("down", "stopped by clusterbake node stop"), ("drained", "disk swap on Monday"), ("down", "cable cut")],
)
def test_a_node_taken_out_by_someone_else_is_left_alone(program, taken_out):
    power = Recorder(running={"cpu-1", "cpu-3"})
    slurm = states(cpu_1=("idle", "none"), cpu_2=taken_out, cpu_3=("idle", "none"))
    assert program.replace_lost_nodes(program.config, slurm, power, power.running(), {}, now=1.0) == {}
    assert (power.calls, program.updates) == ([], [])


def test_a_node_back_up_is_forgotten_and_recovery_can_be_off(program):
    power = Recorder(running={"cpu-1", "cpu-2", "cpu-3"})
    slurm = states(cpu_1=("idle", "none"), cpu_2=("idle", "none"), cpu_3=("idle", "none"))
    assert program.replace_lost_nodes(program.config, slurm, power, power.running(), {"cpu-2": 5.0}, now=9.0) == {}
    off = {**program.config, "replace_lost_nodes": False}
    assert program.replace_lost_nodes(off, states(cpu_2=("allocated", "none")), power, set(), {}, now=9.0) == {}
    assert (power.calls, program.updates) == ([], [])


@pytest.mark.parametrize(
    "before", [("down*", "Not responding"), ("drained*", "clusterbake: spot reclaim at 2026-12-01T21:40:00Z (EC2)")]
)
def test_a_node_slurm_gave_up_on_or_clusterbake_drained_is_replaced(program, before):
    power = Recorder(running={"cpu-1", "cpu-3"})
    slurm = states(cpu_1=("idle", "none"), cpu_2=before, cpu_3=("idle", "none"))
    assert program.replace_lost_nodes(program.config, slurm, power, power.running(), {}, now=7.0) == {"cpu-2": 7.0}
    assert power.calls == [("start", ["cpu-2"])]
    assert program.updates[-1] == ("update", "NodeName=cpu-2", "State=RESUME")


# `scontrol ping` of Slurm 22.05 with a backup controller (the format tests/integration/test_controller_ha.py
# reads from a real cluster).
PING_BOTH_UP = "Slurmctld(primary) at head is UP\nSlurmctld(backup) at head-2 is UP\n"
PING_PRIMARY_DOWN = "Slurmctld(primary) at head is DOWN\nSlurmctld(backup) at head-2 is UP\n"


@pytest.mark.parametrize(
    ("ping", "host", "in_control"),
    [
        (PING_BOTH_UP, "head", True),
        (PING_BOTH_UP, "head-2", False),
        (PING_PRIMARY_DOWN, "head-2", True),
        (PING_PRIMARY_DOWN, "head", False),
        ("Slurmctld(primary) at head is DOWN\n", "head", True),  # one controller: the loop runs where it runs
        ("Slurmctld(primary) at head is DOWN\nSlurmctld(backup) at head-2 is DOWN\n", "head-2", False),
    ],
)
def test_the_loop_runs_on_the_controller_in_control_only(program, monkeypatch, ping, host, in_control):
    module = programs.power_program(monkeypatch, Path("/nonexistent/state.json"))
    monkeypatch.setattr(module.core.socket, "gethostname", lambda: host)
    monkeypatch.setattr(
        module.core.subprocess, "run", lambda argv, **kw: SimpleNamespace(stdout=ping, returncode=0, argv=argv)
    )
    assert module.core.in_control() is in_control


def test_a_backup_out_of_control_leaves_nodes_and_machines_alone(program, monkeypatch):
    module = programs.power_program(monkeypatch, Path("/nonexistent/state.json"))
    monkeypatch.setattr(module.core, "in_control", lambda: False)

    def no_backend(config):
        raise AssertionError("the backend was reached from a controller not in control")

    monkeypatch.setattr(module.commands, "backend", no_backend)
    monkeypatch.setattr(module.commands, "node_states", lambda: pytest.fail("Slurm's states read"))
    assert module.commands.reconcile(program.config) == 0
    assert program.updates == []
