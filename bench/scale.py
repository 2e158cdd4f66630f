#!/usr/bin/env python3
"""Scale rehearsal on the EC2 twin: a 1 + N elastic cluster (every elastic node powered down), for
each N of --sizes (default 100 and 1,000), measured as a user meets it:

- plan: `cluster up --dry-run --json` (the plan and every read-only check against the API);
- cluster up from nothing, and the idempotent re-run;
- `cluster status --json` and the inventory's `--list` (what every ops playbook starts with);
- a job that powers 32 nodes up at once: sbatch to RUNNING, and to COMPLETED;
- slurmctld on the head: resident memory and CPU seconds after `cluster up`, its CPU over an idle
  minute, and both after the 32-node job.

Each CLI step runs with $CLUSTERBAKE_API_TIMINGS (providers/aws/api.py): every AWS API call's
seconds, so that the time spent in the twin's API (moto, one Python process serving every call)
is told apart from clusterbake's own: each step's JSON has `seconds`, `api_seconds`, `api_calls`
and `own_seconds` (seconds - api_seconds), and the slowest operations. The figures of the largest
size are divided by the smallest's (`growth`).

Needs root and the twin's image (the suite's config: `clusterbake -c tests/integration/cluster.yaml
twin image aws`); starts the twin (`twin up aws`) if it is not up and stops it after only if it
started it. Writes bench/results/scale-<time>.json; progress on stderr, each CLI step's output in
bench/results/scale-<time>.log.

    .venv/bin/python bench/scale.py --sizes 100,1000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "twin"), str(REPO / "src")]

from test_aws_scale import large_subnet, raised_vcpu_quota, scale_config  # noqa: E402
from twintest import CB, Twin, host_leftovers, twin_environment  # noqa: E402

RESULTS = REPO / "bench" / "results"
RESUMED = 32
SUBNET = "10.90.8.0/21"  # room for 2,000 nodes, apart from the test's /22
API_TIMINGS = "CLUSTERBAKE_API_TIMINGS"


def log(message: str) -> None:
    print(f"{datetime.now().strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, env: dict[str, str], workdir: Path, output_log: Path):
        self.env, self.workdir, self.output_log = env, workdir, output_log

    def timed(self, label: str, argv: list[str], timeout: float = 3600) -> dict:
        """Run argv with API timings on; its seconds, its API seconds and calls, and its stdout."""
        timings = self.workdir / f"api-{time.monotonic_ns()}.jsonl"
        started = time.perf_counter()
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env={**self.env, API_TIMINGS: str(timings)}
        )
        seconds = time.perf_counter() - started
        with self.output_log.open("a") as out:
            out.write(f"==> {label}: {' '.join(argv)} (exit {result.returncode}, {seconds:.1f}s)\n")
            out.write(result.stdout[-20000:] + result.stderr[-20000:] + "\n")
        if result.returncode != 0:
            sys.exit(f"{label} failed (exit {result.returncode}); see {self.output_log}")
        calls = [json.loads(line) for line in timings.read_text().splitlines()] if timings.exists() else []
        by_operation: dict[str, float] = defaultdict(float)
        for call in calls:
            by_operation[call["operation"]] += call["seconds"]
        api = sum(by_operation.values())
        slowest = sorted(by_operation.items(), key=lambda item: -item[1])[:5]
        return {
            "seconds": round(seconds, 2),
            "api_seconds": round(api, 2),
            "api_calls": len(calls),
            "own_seconds": round(seconds - api, 2),
            "slowest_operations": {op: round(s, 2) for op, s in slowest},
            "calls_by_operation": dict(Counter(c["operation"] for c in calls).most_common(8)),
            "stdout": result.stdout,
        }

    def median_of(self, label: str, argv: list[str], repeat: int) -> dict:
        runs = [self.timed(label, argv) for _ in range(repeat)]
        keys = ("seconds", "api_seconds", "api_calls", "own_seconds")
        return {
            **{key: round(statistics.median(r[key] for r in runs), 2) for key in keys},
            "runs": repeat,
            "slowest_operations": runs[-1]["slowest_operations"],
        }


def slurmctld_usage(twin: Twin) -> dict:
    """slurmctld's resident memory (MiB) and CPU seconds so far, from /proc on the head."""
    script = (
        "pid=$(pidof slurmctld | tr ' ' '\\n' | sort -n | head -1); "
        "echo $(awk '/VmRSS/ {print $2}' /proc/$pid/status) $(cut -d' ' -f14,15 /proc/$pid/stat) $(getconf CLK_TCK)"
    )
    rss_kib, utime, stime, ticks = twin.on("head", script).stdout.split()
    return {"rss_mib": round(int(rss_kib) / 1024, 1), "cpu_seconds": round((int(utime) + int(stime)) / int(ticks), 2)}


def resume_job(twin: Twin) -> dict:
    """sbatch -N32 on powered-down nodes: seconds to RUNNING and to COMPLETED."""
    submitted = time.perf_counter()
    job = twin.on(
        "head", f"sbatch --parsable -N{RESUMED} -o /shared/bench-%j.out --wrap 'srun hostname'"
    ).stdout.strip()
    running = completed = None
    deadline = submitted + 900
    while time.perf_counter() < deadline and completed is None:
        state = twin.on("head", f"scontrol show job -o {job}").stdout
        now = time.perf_counter() - submitted
        if running is None and ("JobState=RUNNING" in state or "JobState=COMPLETED" in state):
            running = now
        if "JobState=COMPLETED" in state:
            completed = now
        elif "JobState=FAILED" in state or "JobState=NODE_FAIL" in state:
            sys.exit(f"the {RESUMED}-node job failed: {state}")
        time.sleep(1)
    if completed is None:
        sys.exit(f"the {RESUMED}-node job did not complete in 900 s")
    return {"to_running_s": round(running, 1), "to_completed_s": round(completed, 1)}


def measure(bench: Bench, twin_env: dict, subnet_id: str, nodes: int, repeat: int) -> dict:
    cluster = f"benchscale{nodes}"
    path = bench.workdir / f"{cluster}.yaml"
    import yaml

    path.write_text(yaml.safe_dump(scale_config(subnet_id, nodes, cluster), sort_keys=False))
    twin = Twin(twin_env, path, cluster=cluster)
    cli = [*CB, "-c", str(path)]
    figures: dict = {"nodes": nodes}
    log(f"1+{nodes}: plan (cluster up --dry-run)")
    figures["plan"] = bench.median_of("plan", [*cli, "cluster", "up", "--dry-run", "--json"], repeat)
    log(f"1+{nodes}: cluster up")
    up = bench.timed("cluster up", [*cli, "cluster", "up"])
    figures["cluster_up"] = {k: v for k, v in up.items() if k != "stdout"}
    try:
        figures["slurmctld_after_up"] = slurmctld_usage(twin)
        log(f"1+{nodes}: cluster up again (nothing to change)")
        figures["cluster_up_again"] = {
            k: v for k, v in bench.timed("re-run", [*cli, "cluster", "up"]).items() if k != "stdout"
        }
        log(f"1+{nodes}: status and inventory")
        figures["status_json"] = bench.median_of("status", [*cli, "cluster", "status", "--json"], repeat)
        inventory = [str(REPO / ".venv" / "bin" / "python"), str(REPO / "inventories" / "aws_ec2.py"), "--list"]
        bench.env["CLUSTERBAKE_CONFIG"] = str(path)
        figures["inventory_list"] = bench.median_of("inventory", inventory, repeat)
        idle_before = slurmctld_usage(twin)
        time.sleep(60)
        idle_after = slurmctld_usage(twin)
        figures["slurmctld_idle_cpu_percent"] = round(
            (idle_after["cpu_seconds"] - idle_before["cpu_seconds"]) / 60 * 100, 2
        )
        log(f"1+{nodes}: a job that powers {RESUMED} nodes up")
        figures[f"resume_{RESUMED}"] = resume_job(twin)
        figures[f"slurmctld_after_resume_{RESUMED}"] = slurmctld_usage(twin)
    finally:
        log(f"1+{nodes}: cluster down")
        figures["cluster_down"] = {
            k: v for k, v in bench.timed("cluster down", [*cli, "cluster", "down"]).items() if k != "stdout"
        }
    return figures


GROWTH_KEYS = {
    "plan_s": ("plan", "seconds"),
    "plan_own_s": ("plan", "own_seconds"),
    "cluster_up_s": ("cluster_up", "seconds"),
    "cluster_up_own_s": ("cluster_up", "own_seconds"),
    "cluster_up_again_s": ("cluster_up_again", "seconds"),
    "status_json_s": ("status_json", "seconds"),
    "status_json_own_s": ("status_json", "own_seconds"),
    "inventory_list_s": ("inventory_list", "seconds"),
    "inventory_list_own_s": ("inventory_list", "own_seconds"),
    "resume_32_to_running_s": (f"resume_{RESUMED}", "to_running_s"),
    "slurmctld_rss_mib": ("slurmctld_after_up", "rss_mib"),
    "slurmctld_rss_after_resume_mib": (f"slurmctld_after_resume_{RESUMED}", "rss_mib"),
}


def growth(small: dict, large: dict) -> dict:
    ratios = {}
    for name, (section, key) in GROWTH_KEYS.items():
        a, b = small[section][key], large[section][key]
        ratios[name] = {"small": a, "large": b, "ratio": round(b / a, 2) if a else None}
    a, b = small["slurmctld_idle_cpu_percent"], large["slurmctld_idle_cpu_percent"]
    ratios["slurmctld_idle_cpu_percent"] = {"small": a, "large": b, "ratio": round(b / a, 2) if a else None}
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000", help="compute node counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each read-only step (their median)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    output_log = RESULTS / f"scale-{stamp}.log"
    started_twin = not Path("/var/lib/clusterbake/twins/aws").exists()
    log(f"twin up aws (log of every step: {output_log})")
    twin_env = twin_environment()
    results: dict = {
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "kernel": platform.release()},
        "resumed_nodes": RESUMED,
        "sizes": {},
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as folder:
            bench = Bench(dict(twin_env), Path(folder), output_log)
            probe = Twin(twin_env, Path(folder) / "none.yaml")
            subnet_id = large_subnet(probe, SUBNET)
            with raised_vcpu_quota(2 * (max(sizes) + 1) + 64):
                for nodes in sizes:
                    results["sizes"][str(nodes)] = measure(bench, twin_env, subnet_id, nodes, args.repeat)
    finally:
        if started_twin:
            subprocess.run([*CB, "twin", "down", "aws"], env=twin_env, capture_output=True, timeout=600)
            left = host_leftovers()
            if left:
                log(f"left on the host after twin down: {left}")
    if len(sizes) >= 2:
        results["growth"] = growth(results["sizes"][str(min(sizes))], results["sizes"][str(max(sizes))])
    out = RESULTS / f"scale-{stamp}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    log(f"wrote {out}")
    print(json.dumps(results.get("growth", results), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
