#!/usr/bin/env python3
"""Bring-up benchmark: `cluster up` from nothing, the memory and CPU time each node takes, the
idempotent re-run, destroy, and the time from `sbatch` to job start on powered-down elastic nodes.

Runs the real `clusterbake` CLI (what `make cluster` runs) on the local provider and
writes JSON with medians and ratios to bench/results/bringup-<time>.json.

    .venv/bin/python bench/bringup.py --baseline 734d907 --repeat 3

With --baseline REV the same measurements run alternately (A B, then B A, ...) against
the code of REV, checked out as a git worktree and run with the same venv, because this
machine's speed drifts by up to 40% within an hour: only ratios measured side by side
mean anything. Each code builds (or reuses) its own image first; image builds are not
timed here (--cold times one).

The peer (the galaxyproject Slurm role on the same nspawn nodes) cannot be installed
here (no Ansible Galaxy or GitHub). Its figures come from the side-by-side run of issue 9
(1+8: baseline 37.7 s vs peer 76.1 s; re-run 23.0 s vs 51.2 s); the ratio to the peer is
*derived*: today's baseline / today's current x that day's peer / baseline ratio, and only when the
baseline is that commit (734d907).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = str(REPO / ".venv" / "bin" / "python")
BASE = (REPO / "tests" / "integration" / "cluster.yaml").read_text()
SUBNET = "10.76.0.0/24"
# Issue 9's side-by-side run (3 alternating rounds, 1 head + 8 compute, this machine):
# the code of the commit before issue 9 against the galaxyproject Slurm role.
PEER = {"cluster_up_s": 76.1, "rerun_s": 51.2}
PEER_BASELINE = {"cluster_up_s": 37.7, "rerun_s": 23.0}
# The code those baseline figures are of (the commit before issue 9): a ratio to the peer is derived
# only from a baseline of this commit; against any other it would mean nothing.
PEER_BASELINE_REV = "734d907"


def log(message: str) -> None:
    print(f"{datetime.now().strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


class Code:
    """One version of clusterbake: the checkout's, or a git worktree of another revision."""

    def __init__(self, label: str, src: Path):
        self.label, self.src = label, src

    def argv(self, config: Path, *args: str) -> list[str]:
        return [
            PYTHON,
            "-c",
            "import sys; from clusterbake.cli import main; sys.exit(main())",
            "--config",
            str(config),
            *args,
        ]

    def run(self, config: Path, *args: str, timeout: float = 1800) -> tuple[float, str]:
        env = {**os.environ, "PYTHONPATH": str(self.src)}
        env.pop("CLUSTERBAKE_HOME", None)
        started = time.perf_counter()
        result = subprocess.run(self.argv(config, *args), capture_output=True, text=True, env=env, timeout=timeout)
        elapsed = time.perf_counter() - started
        if result.returncode != 0:
            sys.exit(f"[{self.label}] clusterbake {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        return elapsed, result.stdout


def baseline_worktree(rev: str) -> Path:
    path = Path(tempfile.gettempdir()) / f"clusterbake-baseline-{rev}"
    if not (path / "src" / "clusterbake").is_dir():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--force", "--detach", str(path), rev], check=True)
    return path


# --without: config sections that switch a part off, to measure what it costs side by side.
PARTS_OFF = {
    "accounting": "accounting:\n  enabled: false\n",
    "monitoring": "monitoring:\n  enabled: false\n",
}


def static_config(compute: int, directory: Path, without: tuple[str, ...] = ()) -> Path:
    path = directory / f"bench-{compute}{''.join('-no-' + part for part in without)}.yaml"
    text = BASE.replace("cluster_name: citest", "cluster_name: bench").replace("count: 2", f"count: {compute}")
    path.write_text(text.replace("10.78.0.0/24", SUBNET) + "".join(PARTS_OFF[part] for part in without))
    return path


def elastic_config(max_count: int, directory: Path) -> Path:
    """No static compute node, up to max_count elastic ones, powered down after 10 s idle."""
    path = directory / f"bench-elastic-{max_count}.yaml"
    text = BASE.replace("cluster_name: citest", "cluster_name: benchelastic").replace("10.78.0.0/24", SUBNET)
    text = text.replace("    count: 2\n", f"    min_count: 0\n    max_count: {max_count}\n    idle_time: 10\n")
    path.write_text(text + "power:\n  suspend_timeout: 10\n  resume_timeout: 120\n")
    return path


def summary(samples: list[float]) -> dict:
    return {"median_s": round(statistics.median(samples), 3), "samples_s": [round(s, 3) for s in samples]}


def node_memory_mib(machine_prefix: str) -> dict[str, float]:
    """Proportional set size (PSS, MiB) of each node: its processes found by their cgroup
    (`.../clusterbake/<machine>`, where each node is placed), summed from smaps_rollup."""
    by_machine: dict[str, float] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cgroups = (proc / "cgroup").read_text()
            match = re.search(rf"/clusterbake/({re.escape(machine_prefix)}[^/\n]*)", cgroups)
            if not match:
                continue
            rollup = (proc / "smaps_rollup").read_text()
        except OSError:
            continue
        pss = re.search(r"^Pss:\s+(\d+) kB", rollup, re.M)
        if pss:
            by_machine[match.group(1)] = by_machine.get(match.group(1), 0.0) + int(pss.group(1)) / 1024
    return by_machine


def host_busy_cpu_s() -> float:
    """CPU seconds the whole host has been busy (all cores, /proc/stat: user, nice, system,
    irq, softirq): over a bring-up, the work it took, whatever ran it (Ansible, the nodes)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return (sum(fields[:3]) + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


def _cpu_seconds(cgroup: Path) -> float:
    for line in (cgroup / "cpu.stat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == "usage_usec":
            return int(value) / 1e6
    return -1.0


def node_cpu_seconds(machine_prefix: str) -> dict[str, dict]:
    """CPU time each node has used since it booted, from its cgroup v2 `cpu.stat` (the unified
    hierarchy, where each node is placed; children count in their parent, exited ones included),
    and its five costliest units still present. Unlike wall time, this does not drift with the
    machine's speed: it is what a node's boot and join cost."""
    hierarchy = next(
        (h for h in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")) if (h / "cpu.stat").exists()), None
    )
    if hierarchy is None:
        return {}
    by_machine: dict[str, dict] = {}
    for machine in sorted((hierarchy / "clusterbake").glob(f"{machine_prefix}*")):
        units = {
            d.name: round(_cpu_seconds(d), 3)
            for d in machine.rglob("*")
            if d.is_dir() and d.name.endswith((".service", ".scope")) and (d / "cpu.stat").exists()
        }
        top = dict(sorted(units.items(), key=lambda item: -item[1])[:5])
        by_machine[machine.name] = {"cpu_s": round(_cpu_seconds(machine), 3), "top_units": top}
    return by_machine


def bring_up(code: Code, config: Path) -> dict[str, float]:
    """From nothing to every compute node idle (with each node's memory and CPU time then), the
    re-run, and destroy."""
    code.run(config, "cluster", "down")
    busy_before = host_busy_cpu_s()
    up, _ = code.run(config, "cluster", "up")
    busy = host_busy_cpu_s() - busy_before
    memory = node_memory_mib("cb-bench-")
    cpu = node_cpu_seconds("cb-bench-")
    rerun, out = code.run(config, "cluster", "up")
    changed = re.search(r"(\d+) changed tasks", out)
    down, _ = code.run(config, "cluster", "down")
    compute = [mib for machine, mib in memory.items() if not machine.endswith("-head")]
    compute_nodes = sorted((n for m, n in cpu.items() if not m.endswith("-head")), key=lambda n: n["cpu_s"])
    compute_cpu = [node["cpu_s"] for node in compute_nodes]
    head_cpu = next((node for machine, node in cpu.items() if machine.endswith("-head")), {"cpu_s": -1})
    log(f"  CPU to all idle: the host {busy:.1f}s busy, head {head_cpu['cpu_s']:.2f}s {head_cpu.get('top_units', {})}")
    if compute_nodes:
        log(
            f"  CPU to all idle: compute median {statistics.median(compute_cpu):.2f}s, sum {sum(compute_cpu):.1f}s;"
            f" a median node: {compute_nodes[len(compute_nodes) // 2].get('top_units', {})}"
        )
    return {
        "up": up,
        "rerun": rerun,
        "down": down,
        "rerun_changed": int(changed.group(1)) if changed else -1,
        "compute_node_pss_mib": statistics.median(compute) if compute else -1,
        "head_pss_mib": next((mib for machine, mib in memory.items() if machine.endswith("-head")), -1),
        "all_nodes_pss_mib": sum(memory.values()),
        "compute_node_cpu_s": statistics.median(compute_cpu) if compute_cpu else -1,
        "all_compute_cpu_s": sum(compute_cpu),
        "head_cpu_s": head_cpu["cpu_s"],
        "host_busy_cpu_s": busy,
    }


def on_head(code: Code, config: Path, command: str) -> str:
    return code.run(config, "ssh", "head", "--", command, timeout=600)[1]


def wait(what: str, predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    sys.exit(f"{what} not reached within {timeout:.0f}s")


def sbatch_to_start(code: Code, config: Path, nodes: int, repeat: int) -> list[float]:
    """Seconds from `sbatch` on the head to the batch script's first line, every node powered
    down before each sample (the nodes share the host's clock: one clock for both stamps)."""

    def all_powered_down() -> bool:
        states = on_head(code, config, "sinfo --noheader --Node --format=%t").split()
        return bool(states) and set(states) == {"idle~"}

    samples = []
    for i in range(repeat):
        wait("every node powered down", all_powered_down, timeout=300)
        out = f"/shared/bench-start-{nodes}-{i}.out"
        stamps = on_head(
            code,
            config,
            f"date +%s.%N; sbatch --wait -N{nodes} -o {out} --wrap 'date +%s.%N' >/dev/null; cat {out}",
        ).split()
        samples.append(float(stamps[-1]) - float(stamps[0]))
        log(f"  sbatch -N{nodes} to start on powered-down nodes: {samples[-1]:.2f}s")
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="alternating rounds (and samples)")
    parser.add_argument("--sizes", default="8,32", help="compute node counts, 1 head each (64: issue 13's scale)")
    parser.add_argument("--baseline", metavar="REV", help="git revision to measure alternately against")
    parser.add_argument("--baseline-sizes", default="8", help="sizes the baseline runs too")
    parser.add_argument("--elastic-nodes", default="1,4", help="sbatch -N of the powered-down samples ('' skips)")
    parser.add_argument("--cold", action="store_true", help="also time a cold image build (slow)")
    parser.add_argument(
        "--without",
        default="",
        help="also measure the current code with these parts off, alternately (e.g. accounting,monitoring)",
    )
    args = parser.parse_args()

    current = Code("current", REPO / "src")
    codes = [current]
    baseline_rev = ""
    if args.baseline:
        revision = ["git", "-C", str(REPO), "rev-parse", "--short=10", args.baseline]
        baseline_rev = subprocess.check_output(revision, text=True).strip()
        codes.append(Code(f"baseline {baseline_rev}", baseline_worktree(baseline_rev) / "src"))
    without = tuple(part for part in args.without.split(",") if part)
    unknown = set(without) - set(PARTS_OFF)
    if unknown:
        parser.error(f"--without: {', '.join(sorted(unknown))}: not one of {', '.join(PARTS_OFF)}")
    # (code, parts off, label): the current code as configured, then with `without` off.
    variants = [(code, (), code.label) for code in codes]
    if without:
        variants.append((current, without, f"{current.label} without {'+'.join(without)}"))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    baseline_sizes = {int(s) for s in args.baseline_sizes.split(",") if s}
    results: dict = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "git": subprocess.check_output(["git", "-C", str(REPO), "describe", "--always", "--dirty"], text=True).strip(),
        "codes": [label for _, _, label in variants],
        "image": {},
        "clusters": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for code in codes:
            log(f"[{code.label}] image build (reused when its inputs are unchanged)")
            took, _ = code.run(static_config(2, directory), "image", "build", *(["--force"] if args.cold else []))
            results["image"][code.label] = {"build_s": round(took, 3), "cold": args.cold}

        raw: dict[str, dict[str, dict[str, list]]] = {}
        for round_no in range(args.repeat):
            order = variants if round_no % 2 == 0 else variants[::-1]
            for size in sizes:
                for code, parts_off, label in order:
                    if code is not current and size not in baseline_sizes:
                        continue
                    figures = bring_up(code, static_config(size, directory, parts_off))
                    shown = json.dumps({k: round(v, 1) for k, v in figures.items()})
                    log(f"[{label}] 1+{size} round {round_no + 1}: {shown}")
                    for key, value in figures.items():
                        raw.setdefault(f"1+{size}", {}).setdefault(label, {}).setdefault(key, []).append(value)

        for shape, by_code in raw.items():
            entry = results["clusters"][shape] = {}
            for label, figures in by_code.items():
                entry[label] = {
                    "cluster_up_to_all_idle": summary(figures["up"]),
                    "idempotent_rerun": summary(figures["rerun"]),
                    "destroy": summary(figures["down"]),
                    "rerun_changed_tasks": figures["rerun_changed"],
                    "compute_node_pss_mib_median": round(statistics.median(figures["compute_node_pss_mib"]), 1),
                    "head_pss_mib_median": round(statistics.median(figures["head_pss_mib"]), 1),
                    "all_nodes_pss_mib_median": round(statistics.median(figures["all_nodes_pss_mib"]), 1),
                    # CPU time used from boot to all idle (cgroup cpu.stat): the cost of a bring-up
                    # that wall time on 2 shared cores only shows through the drift.
                    "compute_node_cpu_s_median": round(statistics.median(figures["compute_node_cpu_s"]), 3),
                    "all_compute_cpu_s_median": round(statistics.median(figures["all_compute_cpu_s"]), 2),
                    "head_cpu_s_median": round(statistics.median(figures["head_cpu_s"]), 2),
                    "host_busy_cpu_s_median": round(statistics.median(figures["host_busy_cpu_s"]), 2),
                }
        ratios = results["ratios"] = {}
        eight = results["clusters"].get("1+8", {})
        base = eight.get(codes[1].label) if len(codes) > 1 else None
        peer_derivable = bool(args.baseline) and baseline_rev.startswith(PEER_BASELINE_REV)
        if base and not peer_derivable:
            log(f"no ratio to the peer: its figures are against {PEER_BASELINE_REV}, not this baseline")
        # Each current variant (as configured, and with `without` parts off) against the baseline
        # (the peer's figure derived from that day's peer/baseline ratio), and 1+32 against 1+8.
        for _, parts_off, label in variants:
            here = eight.get(label)
            if here is None or label == (codes[1].label if len(codes) > 1 else None):
                continue
            suffix = "current" + (f" without {'+'.join(parts_off)}" if parts_off else "")
            if base:
                for key, name in (("cluster_up_s", "cluster_up_to_all_idle"), ("rerun_s", "idempotent_rerun")):
                    speedup = base[name]["median_s"] / here[name]["median_s"]
                    ratios[f"1+8 {key} baseline/{suffix}"] = round(speedup, 2)
                    if peer_derivable:
                        derived = speedup * PEER[key] / PEER_BASELINE[key]
                        ratios[f"1+8 {key} peer/{suffix} (derived)"] = round(derived, 2)
            big = results["clusters"].get("1+32", {}).get(label)
            if big:
                ratio = big["cluster_up_to_all_idle"]["median_s"] / here["cluster_up_to_all_idle"]["median_s"]
                ratios[f"1+32/1+8 cluster_up {suffix}"] = round(ratio, 2)

        elastic_nodes = [int(n) for n in args.elastic_nodes.split(",") if n]
        if elastic_nodes:
            config = elastic_config(max(elastic_nodes), directory)
            current.run(config, "cluster", "down")
            up, _ = current.run(config, "cluster", "up")
            log(f"elastic cluster up (0 running compute nodes): {up:.1f}s")
            results["elastic"] = {"cluster_up_s": round(up, 3)}
            try:
                for nodes in elastic_nodes:
                    samples = sbatch_to_start(current, config, nodes, args.repeat)
                    results["elastic"][f"sbatch_to_start_N{nodes}"] = summary(samples)
            finally:
                current.run(config, "cluster", "down")

    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"bringup-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    log(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
