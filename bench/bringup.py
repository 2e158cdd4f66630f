#!/usr/bin/env python3
"""Bring-up benchmark: image (cold/warm), cluster up, idempotent re-run, destroy.

Runs the real `clusterbake` CLI (the same code `make` runs) for 2, 4 and 8
compute nodes and writes JSON with medians to bench/results/bringup-<time>.json.
Run as root after `make venv deps`:  .venv/bin/python bench/bringup.py [--repeat 3]
The cold image build (debootstrap + packer, a few minutes) is measured only with
--cold, since it deletes the cached base rootfs and image for the bench config.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CB = str(REPO / ".venv" / "bin" / "clusterbake")
BASE = (REPO / "tests" / "integration" / "cluster.yaml").read_text()


def config_for(compute: int, directory: Path) -> Path:
    path = directory / f"bench-{compute}.yaml"
    text = BASE.replace("cluster_name: citest", "cluster_name: bench").replace("count: 2", f"count: {compute}")
    path.write_text(text.replace("10.78.0.0/24", "10.76.0.0/24"))
    return path


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{result.stderr[-3000:]}")
    return elapsed


def summary(samples: list[float]) -> dict:
    return {"median_s": round(statistics.median(samples), 3), "samples_s": [round(s, 3) for s in samples]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="2,4,8")
    parser.add_argument("--cold", action="store_true", help="also time a cold image build (slow)")
    args = parser.parse_args()
    results: dict = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"cpus": subprocess.check_output(["nproc"], text=True).strip(), "kernel": platform.release()},
        "image": {},
        "clusters": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        first = config_for(2, Path(tmp))
        if args.cold:
            results["image"]["cold"] = summary([timed([CB, "--config", str(first), "image", "build", "--force"])])
        results["image"]["warm"] = summary(
            [timed([CB, "--config", str(first), "image", "build"]) for _ in range(args.repeat)]
        )
        for size in [int(s) for s in args.sizes.split(",")]:
            config = str(config_for(size, Path(tmp)))
            up, rerun, down = [], [], []
            for _ in range(args.repeat):
                timed([CB, "--config", config, "cluster", "down"])
                up.append(timed([CB, "--config", config, "cluster", "up"]))
                rerun.append(timed([CB, "--config", config, "cluster", "up"]))
                down.append(timed([CB, "--config", config, "cluster", "down"]))
            results["clusters"][f"{size}_compute"] = {
                "cluster_up_to_all_idle": summary(up),
                "idempotent_rerun": summary(rerun),
                "destroy": summary(down),
                "rerun_to_up_ratio": round(statistics.median(rerun) / statistics.median(up), 3),
            }
            print(json.dumps({size: results["clusters"][f"{size}_compute"]}), file=sys.stderr)
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"bringup-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(f"written: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
