"""`make test`: the whole suite, its node tests in lanes side by side, and its time table.

1. The images the node tests boot build in the background: the suite's, then each twin's as a
   layer of its cloud on the suite's (build/test-images.log).
2. Meanwhile the node-less tests run on every core (pytest-xdist, two workers a core, a file each).
3. A module that changes the host under every cluster (EARLY) runs once every image is built and
   the node-less tests are done, before any other node boots. Then the node tests run in lanes,
   a pytest run each, side by side; a lane starts once the early modules are done and the images
   it boots are built. A module that loads the machine past the lanes' timed windows (SOLO) runs
   alone after them.
4. build/test-times.json: each phase, lane, module, fixture and cluster boot with its seconds
   (tests/timetable.py records them), and the table printed at the end.

The exit status is non-zero when a test failed or errored; the lanes' full output is in
build/test-<lane>.log, and their failures' summaries are printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "build"
TIMES = BUILD / "times"
TIME_TABLE = BUILD / "test-times.json"
VENV_BIN = REPO / ".venv" / "bin"
OFFLINE_TESTS = ["tests/unit", "tests/aws", "tests/azure", "tests/security"]
NODE_DIRS = ["tests/integration", "tests/twin"]
# Two workers per core: the node-less tests wait much of their time (their fakes' replication and
# operation delays, retries' back-off), so a worker per core left the machine idle. Measured on 2 cores,
# no image build beside: -n 2 took 690 s, -n 4 382 s (631 CPU-s, 1292 tests).
OFFLINE_WORKERS = 2 * (os.cpu_count() or 1)
# The node-less tests' slowest modules, slowest first (a time table's), which tests/conftest.py puts
# first: xdist (--dist loadfile) gives each worker the next file in collection order, and one of these
# taken last ran alone while the other workers idled (test_permissions, 62 s, ended the phase).
SLOW_FIRST = [
    f"tests/{name}.py"
    for name in (
        "unit/test_azure_roles",
        "unit/test_gpu_roles",
        "azure/test_azure_elastic",
        "aws/test_elastic_provision",
        "unit/test_join_bundles",
        "azure/test_azure_capacity_destroy",
        "aws/test_permissions",
        "unit/test_shared_storage",
        "aws/test_replace_node",
        "aws/test_cluster",
        "unit/test_node_health",
        "azure/test_azure_permissions",
        "aws/test_resilience",
        "aws/test_iam_secrets",
    )
]
CB = [str(VENV_BIN / "clusterbake")]
# The images the node tests boot, in the order they build. A twin's image takes the image settings
# of the config it is given: the suite's, so that it is a layer on the suite's image.
SUITE_CONFIG = "tests/integration/cluster.yaml"
IMAGES = {
    "suite": [*CB, "--config", SUITE_CONFIG, "image", "build"],
    "aws twin": [*CB, "--config", SUITE_CONFIG, "twin", "image", "aws"],
    "azure twin": [*CB, "--config", SUITE_CONFIG, "twin", "image", "azure"],
}
RESULT_WORDS = (" PASSED", " FAILED", " ERROR", " SKIPPED", " XFAIL", " XPASS")


@dataclass
class Lane:
    """Node test modules that run one after the other, beside the other lanes."""

    name: str
    modules: list[str]
    images: tuple[str, ...] = ("suite",)
    status: int | None = None
    started: float = 0.0
    seconds: float = 0.0
    log: Path = field(init=False)

    def __post_init__(self):
        self.log = BUILD / f"test-{self.name}.log"


# The node test modules of each lane, run in this order; the lanes run side by side (four: on
# 2 cores a fifth only adds contention). Balanced by the time table (build/test-times.json). The
# modules of one twin share it, those of the suite's shared cluster (cluster.yaml) too: one lane.
LANES: dict[str, list[str]] = {
    "shared": [
        "tests/integration/test_local_cluster.py",
        "tests/integration/test_users.py",
        "tests/integration/test_containers.py",
        "tests/integration/test_accounting.py",
        "tests/integration/test_training.py",
        "tests/integration/test_security.py",
        "tests/integration/test_image.py",
    ],
    # test_controller_ha last: its takeover is timed against SlurmctldTimeout, and the lanes' end is
    # the least loaded time. (test_monitoring moved to the EC2 twin's lane, the shortest: balance.)
    "faults": [
        "tests/integration/test_faults.py",
        "tests/integration/test_gpu.py",
        "tests/integration/test_bad_input.py",
        "tests/integration/test_controller_ha.py",
    ],
    "aws-twin": [
        "tests/twin/test_aws_twin.py",
        "tests/twin/test_aws_elastic.py",
        "tests/twin/test_imds_hop_limit.py",
        "tests/integration/test_elastic.py",
        "tests/integration/test_monitoring.py",
    ],
    "azure-twin": [
        "tests/twin/test_azure_elastic.py",
        "tests/twin/test_azure_twin_cluster.py",
        "tests/twin/test_azure_twin_ib.py",
        "tests/twin/test_azure_twin.py",
        "tests/integration/test_ops.py",
    ],
}
# The lane that starts first, alone, until its first test has run: the shared cluster's bring-up
# (whose tests look at how its nodes joined) on an otherwise idle machine, not among four boots.
LEADING_LANE = "shared"
# A module no lane names yet runs here (every test cluster has a bridge and subnet of its own).
DEFAULT_LANE = "faults"
# Before the lanes, alone, once every image is built (an image build boots its root file system in a
# container too): test_many_nodes sets the host's inotify limit to Debian's default, which every
# node's boot on the host uses. Beside the node-less tests on four workers its 33 boots took 220-292 s
# instead of about 85, and once a node drained before `cluster up` saw it idle (a rehearsal); after
# the lanes the machine idled partly while they ran (vmstat over a whole `make test`).
EARLY = ["tests/integration/test_many_nodes.py"]
# Alone, after the lanes: test_aws_scale boots 32 twin nodes at once, which beside the lanes starved
# their timed windows (a spot notice's 45 s; at the end of the EC2 twin's lane, test_ops' munge key
# rotation, whose job did not end within 180 s).
SOLO = ["tests/twin/test_aws_scale.py"]


def node_modules() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for d in NODE_DIRS for p in (REPO / d).glob("test_*.py"))


def lane_images(modules: list[str]) -> tuple[str, ...]:
    """The images a lane's modules boot: the suite's, and a twin's for that twin's modules."""
    clouds = sorted({c for m in modules for c in ("aws", "azure") if m.startswith(f"tests/twin/test_{c}")})
    return ("suite", *(f"{cloud} twin" for cloud in clouds))


def plan_lanes(modules: list[str]) -> tuple[list[Lane], list[Lane], list[Lane]]:
    """The side-by-side lanes, the early ones and the solo ones: every module in exactly one, none that
    is not there."""
    unknown = sorted(({m for ms in LANES.values() for m in ms} | set(EARLY) | set(SOLO)) - set(modules))
    if unknown:
        raise SystemExit(f"tests/suite.py names modules that do not exist: {', '.join(unknown)}")
    placed = {m: lane for lane, ms in LANES.items() for m in ms}
    lanes = {name: Lane(name, []) for name in LANES}
    for module in modules:
        if module not in EARLY and module not in SOLO and module not in placed:
            lanes[DEFAULT_LANE].modules.append(module)
    for name, listed in LANES.items():
        lanes[name].modules[:0] = listed
    for lane in lanes.values():
        lane.images = lane_images(lane.modules)
    early = [Lane(f"early-{Path(m).stem}", [m], images=tuple(IMAGES)) for m in EARLY]
    solo = [Lane(f"solo-{Path(m).stem}", [m], images=lane_images([m])) for m in SOLO]
    return [lane for lane in lanes.values() if lane.modules], early, solo


def say(line: str) -> None:
    print(line, flush=True)


class Images:
    """The node tests' images, built one after the other in a thread; an event per image."""

    def __init__(self, log: Path):
        self.log = log
        self.built = {name: threading.Event() for name in IMAGES}
        self.seconds: dict[str, float] = {}
        self.failed: list[str] = []
        self.thread = threading.Thread(target=self.build, daemon=True)

    def build(self) -> None:
        with self.log.open("w") as out:
            for name, argv in IMAGES.items():
                start = time.monotonic()
                result = subprocess.run(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
                self.seconds[name] = round(time.monotonic() - start, 1)
                if result.returncode != 0:
                    self.failed.append(name)
                self.built[name].set()

    def wait(self, names) -> None:
        for name in names:
            self.built[name].wait()


def pytest_argv(name: str, times: Path, *extra: str) -> list[str]:
    return [
        str(VENV_BIN / "pytest"),
        "-p",
        "timetable",
        f"--timetable={times}",
        f"--timetable-name={name}",
        *extra,
    ]


def environment() -> dict[str, str]:
    """PYTHONPATH: the time table plugin lives in tests/, which pytest adds to sys.path only later."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(REPO / "tests") + (os.pathsep + path if path else "")}


def run_lane(lane: Lane, images: Images, ready: threading.Event, started: threading.Event | None = None) -> None:
    """Run the lane's pytest once `ready` is set and its images are built; set `started` when its
    first test has a result (or it ended)."""
    ready.wait()
    images.wait(lane.images)
    lane.started = time.time()
    argv = pytest_argv(f"lane {lane.name}", TIMES / f"lane-{lane.name}.json", "-v", "-rfE", *lane.modules)
    say(f"==> lane {lane.name}: {' '.join(Path(m).stem for m in lane.modules)} (log: {lane.log})")
    with lane.log.open("w") as log:
        process = subprocess.Popen(
            argv, cwd=REPO, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            log.flush()
            if any(word in line for word in RESULT_WORDS) and "::" in line:
                say(f"[{lane.name}] {line.rstrip()}")
                if started:
                    started.set()
        lane.status = process.wait()
    if started:
        started.set()
    lane.seconds = round(time.time() - lane.started, 1)
    say(f"<== lane {lane.name}: exit {lane.status} after {lane.seconds:.0f}s")


def run_lanes(lanes: list[Lane], images: Images, ready: threading.Event) -> None:
    """The leading lane first; the others once its first test has run."""
    lead = threading.Event()
    threads = [
        threading.Thread(target=run_lane, args=(lane, images, ready, lead))
        if lane.name == LEADING_LANE
        else threading.Thread(target=run_lane, args=(lane, images, lead))
        for lane in lanes
    ]
    if not any(lane.name == LEADING_LANE for lane in lanes):
        lead.set()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def failure_summary(log: Path) -> str:
    """The 'short test summary info' section of a pytest log."""
    text = log.read_text(errors="replace")
    marker = text.rfind("short test summary info")
    return text[text.rfind("\n", 0, marker) + 1 :] if marker >= 0 else text[-3000:]


def merge(started: float, phases: list[dict]) -> dict:
    """One table of the run's phases and every pytest run's modules, fixtures and cluster boots."""
    table: dict = {"started": round(started, 1), "wall_seconds": round(time.time() - started, 1), "phases": phases}
    modules, fixtures, tests = [], [], 0
    for phase in phases:
        part = TIMES / phase["times"] if "times" in phase else None
        if not part or not part.exists():
            continue
        data = json.loads(part.read_text())
        tests += len(data["tests"])
        modules += [
            {**m, "run": phase["name"], "start": round(data["started"] + m["start"] - started, 1)}
            for m in data["modules"]
        ]
        fixtures += [{**f, "run": phase["name"]} for f in data["fixtures"]]
    table["tests"] = tests
    table["modules"] = sorted(modules, key=lambda m: -m["span"])
    table["clusters"] = [
        {"module": m["module"], **c} for m in sorted(modules, key=lambda m: m["start"]) for c in m["clusters"]
    ]
    table["fixtures"] = sorted(fixtures, key=lambda f: -f["seconds"])[:40]
    return table


def print_table(table: dict) -> None:
    say(f"\n==> time table ({TIME_TABLE}): {table['tests']} tests in {table['wall_seconds'] / 60:.1f} min")
    say(f"{'phase':32} {'start':>7} {'seconds':>8}")
    for phase in table["phases"]:
        say(f"{phase['name']:32} {phase['start']:7.0f} {phase['seconds']:8.0f}  {phase.get('note', '')}")
    say(f"\n{'module (slowest first)':52} {'tests':>5} {'start':>6} {'span':>6}  clusters booted (s)")
    for m in table["modules"]:
        if m["span"] < 20 and not m["clusters"]:
            continue
        boots = ", ".join(f"{c['shape']} {c['seconds']:.0f}" for c in m["clusters"])
        say(f"{m['module'][:52]:52} {m['tests']:5} {m['start']:6.0f} {m['span']:6.0f}  {boots}")
    shown = [m for m in table["modules"] if m["span"] >= 20 or m["clusters"]]
    rest = [m for m in table["modules"] if m not in shown]
    say(f"... and {len(rest)} modules of under 20 s each ({sum(m['span'] for m in rest):.0f} s in all)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-offline", action="store_true", help="only the node tests (and their images)")
    parser.add_argument("--no-node", action="store_true", help="only the node-less tests")
    args = parser.parse_args(argv)
    BUILD.mkdir(exist_ok=True)
    TIMES.mkdir(exist_ok=True)
    for old in TIMES.glob("*.json"):
        old.unlink()
    started = time.time()
    phases: list[dict] = []
    status = 0

    def phase(name: str, start: float, **extra) -> None:
        phases.append(
            {"name": name, "start": round(start - started, 1), "seconds": round(time.time() - start, 1), **extra}
        )

    lanes, early, solo = plan_lanes(node_modules())
    images = Images(BUILD / "test-images.log")
    if not args.no_node:
        say(f"==> the node tests' images build in the background; log: {images.log}")
        images.thread.start()
    at_once = threading.Event()
    at_once.set()
    lanes_ready = threading.Event()  # the node-less tests and the early modules done
    node = threading.Thread(target=run_lanes, args=(lanes, images, lanes_ready))
    if not args.no_node:
        node.start()
    if not args.no_offline:
        start = time.time()
        argv = pytest_argv("offline", TIMES / "offline.json", "-v", "-n", str(OFFLINE_WORKERS), "--dist", "loadfile")
        result = subprocess.run([*argv, "--durations=20", *OFFLINE_TESTS], cwd=REPO, env=environment())
        status |= result.returncode
        phase("node-less tests (xdist)", start, times="offline.json")
    if not args.no_node:
        for lane in early:
            run_lane(lane, images, at_once)
    lanes_ready.set()
    if not args.no_node:
        images.thread.join()
        note = ", ".join(f"{name} {seconds:.0f}s" for name, seconds in images.seconds.items())
        phases.append(
            {
                "name": "images (background)",
                "start": 0.0,
                "seconds": round(sum(images.seconds.values()), 1),
                "note": note,
            }
        )
        if images.failed:
            say(f"==> image builds failed: {', '.join(images.failed)}; end of {images.log}:")
            say("\n".join(images.log.read_text(errors="replace").splitlines()[-40:]))
        node.join()
        for lane in solo:
            run_lane(lane, images, at_once)
        for lane in early + lanes + solo:
            phases.append(
                {
                    "name": f"lane {lane.name}",
                    "start": round(lane.started - started, 1),
                    "seconds": lane.seconds,
                    "times": f"lane-{lane.name}.json",
                    "note": f"exit {lane.status}",
                }
            )
            if lane.status != 0:  # None: the lane never ran to its end
                status = 1
                say(f"\n==> lane {lane.name} failed; its summary (full output: {lane.log}):")
                say(failure_summary(lane.log))
    table = merge(started, phases)
    TIME_TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print_table(table)
    say(f"==> the suite took {table['wall_seconds'] / 60:.1f} min; exit status {1 if status else 0}")
    return 1 if status else 0


if __name__ == "__main__":
    sys.exit(main())
