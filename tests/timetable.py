"""The suite's time table: what each test, module and fixture cost, and the clusters each module boots.

A pytest plugin, loaded by `-p timetable --timetable PATH` (tests/suite.py passes both): it writes
PATH as JSON at the end of the run. Under pytest-xdist the workers time the fixtures and send them
with their setup reports; the controller writes the file.

A fixture that boots a cluster says so with `boots_cluster`, below its `@pytest.fixture`:

    @pytest.fixture(scope="module")
    @boots_cluster("local 1+2")
    def cluster(image): ...

Its setup time is then listed as that module's cluster boot (and a shared one, once, as the first
module's that used it). A fixture's time is its own: the fixtures it asked for are listed apart.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

CLUSTER_ATTRIBUTE = "_timetable_cluster"
FIXTURES_PROPERTY = "timetable_fixtures"


def boots_cluster(shape: str):
    """Mark a fixture function as the boot of a cluster of this shape (its setup time is a boot)."""

    def mark(function):
        setattr(function, CLUSTER_ATTRIBUTE, shape)
        return function

    return mark


def pytest_addoption(parser):
    parser.addoption("--timetable", metavar="PATH", help="write the run's time table (JSON) to PATH")
    parser.addoption("--timetable-name", default="tests", help="the name of this run in the time table")


def pytest_configure(config):
    path = config.getoption("--timetable")
    if path:
        config.pluginmanager.register(TimeTable(config, Path(path)), "timetable-recorder")


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class TimeTable:
    def __init__(self, config, path: Path):
        self.path = path
        self.name = config.getoption("--timetable-name")
        self.is_worker = hasattr(config, "workerinput")
        self.started = time.time()
        # The fixtures set up since the last setup report: [(record, children's seconds)].
        self.stack: list[list] = []
        self.pending: list[dict] = []
        self.tests: dict[str, dict] = {}
        self.fixtures: list[dict] = []

    # Worker (or the only process): time each fixture's setup, less the fixtures it asked for.
    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        frame = [time.perf_counter(), 0.0]
        self.stack.append(frame)
        try:
            return (yield)
        finally:
            self.stack.pop()
            inclusive = time.perf_counter() - frame[0]
            if self.stack:
                self.stack[-1][1] += inclusive
            record = {
                "fixture": fixturedef.argname,
                "scope": fixturedef.scope,
                "seconds": round(inclusive - frame[1], 3),
            }
            shape = getattr(fixturedef.func, CLUSTER_ATTRIBUTE, None)
            if shape:
                record["cluster"] = shape
            self.pending.append(record)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if call.when == "setup" and self.pending:
            # A new list: the report's own is the item's, shared with its later reports.
            report.user_properties = [*report.user_properties, (FIXTURES_PROPERTY, self.pending)]
            self.pending = []
        return report

    # Controller (or the only process): collect the reports, write the table.
    def pytest_runtest_logreport(self, report):
        if self.is_worker:
            return
        test = self.tests.setdefault(
            report.nodeid, {"nodeid": report.nodeid, "setup": 0.0, "call": 0.0, "teardown": 0.0, "outcome": "passed"}
        )
        test[report.when] = round(report.duration, 3)
        test.setdefault("start", report.start)
        test["stop"] = report.stop
        if report.failed:
            test["outcome"] = "error" if report.when != "call" else "failed"
        elif report.skipped and test["outcome"] == "passed":
            test["outcome"] = "skipped"
        for key, value in report.user_properties:
            if key == FIXTURES_PROPERTY:
                self.fixtures += [{**record, "module": module_of(report.nodeid)} for record in value]

    def pytest_sessionfinish(self, session, exitstatus):
        if self.is_worker:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.table(int(exitstatus)), indent=1) + "\n")

    def fixture_totals(self) -> list[dict]:
        """Each fixture's setups in each module: how many and their seconds, the costliest first."""
        totals: dict[tuple, dict] = {}
        for f in self.fixtures:
            key = (f["module"], f["fixture"], f["scope"])
            total = totals.setdefault(
                key, {"module": key[0], "fixture": key[1], "scope": key[2], "setups": 0, "seconds": 0.0}
            )
            total["setups"] += 1
            total["seconds"] = round(total["seconds"] + f["seconds"], 3)
        return sorted((t for t in totals.values() if t["seconds"] >= 0.01), key=lambda t: -t["seconds"])

    def table(self, exitstatus: int) -> dict:
        modules: dict[str, dict] = defaultdict(
            lambda: {"tests": 0, "passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0, "clusters": []}
        )
        for test in self.tests.values():
            module = modules[module_of(test["nodeid"])]
            module["tests"] += 1
            module["passed" if test["outcome"] == "passed" else test["outcome"].replace("error", "failed")] += 1
            module["seconds"] += test["setup"] + test["call"] + test["teardown"]
            module["start"] = min(module.get("start", test["start"]), test["start"])
            module["stop"] = max(module.get("stop", test["stop"]), test["stop"])
        for fixture in self.fixtures:
            if "cluster" in fixture:
                modules[fixture["module"]]["clusters"].append(
                    {"fixture": fixture["fixture"], "shape": fixture["cluster"], "seconds": fixture["seconds"]}
                )
        rows = []
        for name, module in sorted(modules.items(), key=lambda item: item[1].get("start", 0)):
            rows.append(
                {
                    "module": name,
                    **{k: v for k, v in module.items() if k not in ("start", "stop")},
                    "seconds": round(module["seconds"], 1),
                    # From its first setup to its last teardown: what it held the run for.
                    "span": round(module.get("stop", 0) - module.get("start", 0), 1),
                    "start": round(module.get("start", self.started) - self.started, 1),
                }
            )
        return {
            "name": self.name,
            "exitstatus": exitstatus,
            "started": round(self.started, 1),
            "wall_seconds": round(time.time() - self.started, 1),
            "modules": rows,
            "fixtures": self.fixture_totals(),
            "tests": sorted(
                ({k: v for k, v in t.items() if k not in ("start", "stop")} for t in self.tests.values()),
                key=lambda t: t["nodeid"],
            ),
        }
