"""`clusterbake sweep`: the same training at 1, 2, 4, ... nodes, to see whether more nodes pay.

Each size is one job of the deepspeed template (the example, or the user's script after
--), waited for, then read like `job report` does: tokens/s over all ranks from the
example's events. The per-rank batch stays the same at every size (weak scaling), so
ideal scaling is tokens/s growing with the node count, and

    efficiency(N) = tokens/s at N nodes / (N x tokens/s at the smallest size, per node)

A size under 70% efficiency is flagged: the field's rule before renting a bigger cluster.
Written to the output directory: sweep.json, sweep.txt (the table) and sweep.png (tokens/s
against the ideal line, and efficiency against the 70% line), plus each job's output.
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from clusterbake import jobs
from clusterbake.config import ClusterConfig
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.paths import repo_root
from clusterbake.progress import say

EFFICIENCY_FLOOR = 0.70
DEFAULT_STEPS = 20


@dataclass
class Point:
    nodes: int
    job: str
    state: str
    ranks: int | None
    tokens_per_s: float | None
    per_rank: float | None = None
    speedup: float | None = None
    efficiency: float | None = None


def parse_sizes(text: str, available: int) -> list[int]:
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise ConfigError(f"--nodes: {text!r} is not a list of node counts, e.g. 1,2,4,8") from None
    if not sizes or sizes[0] < 1:
        raise ConfigError(f"--nodes: {text!r}: give node counts of 1 or more, e.g. 1,2,4,8")
    if sizes[-1] > available:
        raise ConfigError(f"--nodes: {sizes[-1]} nodes asked, the partition has {available}")
    return sizes


def default_args(steps: int) -> list[str]:
    return [
        "deepspeed/train.py",  # relative to /shared/jobs/<user>, where the upload lands
        "--deepspeed_config",
        "deepspeed/ds_config.json",
        "--steps",
        str(steps),
    ]


def run(
    config: ClusterConfig,
    sizes: list[int],
    out: Path,
    *,
    script_args: list[str] | None = None,
    partition: str | None = None,
    steps: int = DEFAULT_STEPS,
) -> list[Point]:
    """One job per size, one after the other (they would compete for the nodes)."""
    out.mkdir(parents=True, exist_ok=True)
    upload = None if script_args else repo_root() / "examples" / "deepspeed"
    args = script_args or default_args(steps)
    points = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for size in sizes:
        name = f"sweep-{stamp}-{size}n"
        head, job_id, output = jobs.submit(
            config, "deepspeed", nodes=str(size), partition=partition, job_name=name, upload_dir=upload, args=args
        )
        upload = None  # once is enough
        say(f"    {size} node(s): job {job_id}")
        buffer = io.StringIO()
        final = jobs.follow(head, job_id, output, stream=buffer, raw=True)
        (out / f"{name}-{job_id}.out").write_text(buffer.getvalue())
        data, _, _ = jobs.report(head, job_id)
        training = data["training"]
        tps = training.get("tokens_per_s") if final.state == "COMPLETED" else None
        points.append(Point(size, job_id, final.state, training.get("world_size"), tps))
        say(f"    {size} node(s): {final.state}" + (f", {tps:,.0f} tokens/s" if tps else ""))
    return score(points)


def score(points: list[Point]) -> list[Point]:
    """Per-rank throughput, speedup and efficiency against the smallest size that completed."""
    done = [p for p in points if p.tokens_per_s]
    if not done:
        return points
    base = done[0]
    for p in done:
        p.per_rank = p.tokens_per_s / p.ranks if p.ranks else None
        p.speedup = p.tokens_per_s / base.tokens_per_s
        p.efficiency = p.speedup * base.nodes / p.nodes
    return points


def table(points: list[Point], provider: str) -> str:
    lines = [f"{'nodes':>5}  {'ranks':>5}  {'tokens/s':>10}  {'per rank':>9}  {'speedup':>7}  {'efficiency':>10}  job"]
    for p in points:
        if p.tokens_per_s is None:
            lines.append(f"{p.nodes:>5}  {'-':>5}  {'-':>10}  {'-':>9}  {'-':>7}  {'-':>10}  {p.job} {p.state}")
            continue
        flag = "  < 70%: more nodes do not pay here" if p.efficiency < EFFICIENCY_FLOOR else ""
        lines.append(
            f"{p.nodes:>5}  {p.ranks or '-':>5}  {p.tokens_per_s:>10,.0f}  {p.per_rank or 0:>9,.0f}  "
            f"{p.speedup:>6.2f}x  {p.efficiency:>9.0%}  {p.job}{flag}"
        )
    if provider == "local":
        lines.append(
            "note: local nodes share this one machine's CPUs; the efficiency here measures the software path, "
            "not how real nodes would scale"
        )
    return "\n".join(lines)


def plot(points: list[Point], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [p for p in points if p.tokens_per_s]
    if not done:
        raise ClusterbakeError("no size of the sweep completed: nothing to plot (see the jobs' output)")
    nodes = [p.nodes for p in done]
    base = done[0]
    fig, (speed, efficiency) = plt.subplots(1, 2, figsize=(10, 4))
    speed.plot(nodes, [p.tokens_per_s for p in done], "o-", label="measured")
    speed.plot(nodes, [base.tokens_per_s * n / base.nodes for n in nodes], "--", color="grey", label="ideal")
    speed.set(xlabel="nodes", ylabel="tokens/s", title="throughput")
    speed.legend()
    efficiency.plot(nodes, [100 * p.efficiency for p in done], "o-")
    efficiency.axhline(100 * EFFICIENCY_FLOOR, color="red", linestyle=":", label="70%")
    efficiency.set(xlabel="nodes", ylabel="efficiency (%)", ylim=(0, 110), title="scaling efficiency")
    efficiency.legend()
    for axis in (speed, efficiency):
        axis.set_xticks(nodes)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(points: list[Point], out: Path, provider: str, title: str) -> str:
    text = table(points, provider)
    (out / "sweep.txt").write_text(text + "\n")
    (out / "sweep.json").write_text(json.dumps([asdict(p) for p in points], indent=2) + "\n")
    plot(points, out / "sweep.png", title)
    return text
