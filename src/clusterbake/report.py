"""`clusterbake report`: the cluster's nodes, jobs and utilisation over a period, as plots.

Reads the head's Prometheus (clusterbake.prometheus): the Slurm exporter's nodes by state,
jobs by state, CPUs and GPUs allocated, and node exporter's CPU use per node. Writes
report.png (one panel each), report.json (every series, for other tools) and report.txt
(the summary it prints) to the output directory.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.prometheus import Prometheus

# At most this many points per series: a month is as quick to plot as an hour.
MAX_POINTS = 400
_DURATION = re.compile(r"^(\d+)([smhdw])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass
class Panel:
    title: str
    ylabel: str
    queries: dict[str, str]  # legend label (or a label name to split by, "{state}") -> PromQL
    stacked: bool = False
    percent: bool = False
    # Counts whose series Prometheus has only while the count is above 0 (no job pending: no series):
    # 0 wherever Slurm was observed (the nodes panel has a sample).
    zero_when_observed: bool = False
    series: dict[str, list[float | None]] = field(default_factory=dict)


def panels(rate_window: int) -> list[Panel]:
    window = f"{rate_window}s"
    return [
        Panel("nodes by state", "nodes", {"{state}": "slurm_nodes"}, stacked=True),
        Panel("jobs", "jobs", {"{state}": "sum by (state) (slurm_jobs)"}, zero_when_observed=True),
        Panel(
            "allocated by Slurm",
            "% of the cluster",
            {
                "CPUs": "100 * slurm_cpus_allocated / (slurm_cpus_total > 0)",
                "GPUs": "100 * slurm_gpus_allocated / (slurm_gpus_total > 0)",
            },
            percent=True,
        ),
        Panel(
            "CPU busy per node (node exporter)",
            "% busy",
            {"{node}": f'100 * (1 - avg by (node) (rate(node_cpu_seconds_total{{mode="idle"}}[{window}])))'},
            percent=True,
        ),
    ]


def parse_time(text: str, now: float) -> float:
    """`30m`, `2h`, `7d` (ago), `now`, or an ISO date/time (UTC unless it says otherwise)."""
    if text == "now":
        return now
    if match := _DURATION.match(text):
        return now - int(match.group(1)) * _SECONDS[match.group(2)]
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"{text!r}: give a duration ago (30m, 2h, 7d), `now` or a date/time (2026-12-01T09:00)"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def grid(start: float, end: float, scrape_interval: int) -> tuple[int, list[int]]:
    """The step and the times of the period's points, in whole seconds (Prometheus answers a range
    query at exactly start + i * step)."""
    first, last = math.floor(start), math.floor(end)
    step = max(scrape_interval, math.ceil((last - first) / MAX_POINTS))
    return step, list(range(first, last + 1, step))


def _label(key: str, metric: dict) -> str:
    if key.startswith("{") and key.endswith("}"):
        return metric.get(key[1:-1], "all")
    return key


def collect(prometheus: Prometheus, chosen: list[Panel], times: list[int], step: int) -> list[Panel]:
    """Each panel's series on the grid: None where Prometheus has no sample (a gap in the plot)."""
    index = {t: i for i, t in enumerate(times)}
    for panel in chosen:
        for key, expr in panel.queries.items():
            for result in prometheus.query_range(expr, times[0], times[-1], step):
                values: list[float | None] = [None] * len(times)
                for stamp, value in result["values"]:
                    i = index.get(round(float(stamp)))
                    if i is not None and value not in ("NaN", "+Inf", "-Inf"):
                        values[i] = float(value)
                panel.series[_label(key, result["metric"])] = values
    return tidy(chosen)


def tidy(chosen: list[Panel]) -> list[Panel]:
    """Node states no node was ever in are left out of the legend (the exporter reports each, at 0); counts
    with no series at a time Slurm was observed were 0 then."""
    nodes = chosen[0].series.values()
    observed = [any(values[i] is not None for values in nodes) for i in range(len(next(iter(nodes), [])))]
    for panel in chosen:
        if panel.stacked:
            panel.series = {k: v for k, v in panel.series.items() if any(x for x in v if x is not None)}
        if panel.zero_when_observed:
            for values in panel.series.values():
                values[:] = [0.0 if v is None and seen else v for v, seen in zip(values, observed, strict=True)]
    return chosen


def summary(chosen: list[Panel], start: float, end: float, step: int, cluster: str, provider: str) -> str:
    def fmt(moment: float) -> str:
        return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%d %H:%M UTC")

    lines = [f"{cluster}: {fmt(start)} to {fmt(end)} ({_span(end - start)}, a point every {step} s)"]
    for panel in chosen:
        if not panel.series:
            lines.append(f"  {panel.title}: no samples in this period")
            continue
        parts = []
        for label, values in sorted(panel.series.items()):
            known = [v for v in values if v is not None]
            if not known:
                continue
            unit = "%" if panel.percent else ""
            now, mean, peak = known[-1], sum(known) / len(known), max(known)
            parts.append(f"{label} now {now:.0f}{unit}, mean {mean:.0f}{unit}, peak {peak:.0f}{unit}")
        lines.append(f"  {panel.title}: " + ("; ".join(parts) if parts else "no samples in this period"))
    if provider == "local":
        lines.append("note: local nodes share this machine: node exporter's CPU figures are the host's, for every node")
    return "\n".join(lines)


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.0f} s"


def plot(chosen: list[Panel], times: list[int], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    moments = [datetime.fromtimestamp(t, UTC) for t in times]
    fig, axes = plt.subplots(len(chosen), 1, figsize=(12, 3.2 * len(chosen)), sharex=True, squeeze=False)
    for axis, panel in zip(axes[:, 0], chosen, strict=True):
        labels = sorted(panel.series)
        if not labels:
            axis.text(0.5, 0.5, "no samples in this period", ha="center", va="center", transform=axis.transAxes)
        elif panel.stacked:
            stacks = [[v or 0.0 for v in panel.series[label]] for label in labels]
            axis.stackplot(moments, stacks, labels=labels, step="post")
        else:
            for label in labels:
                values = [math.nan if v is None else v for v in panel.series[label]]
                axis.plot(moments, values, label=label, drawstyle="steps-post")
        if panel.percent:
            axis.set_ylim(0, 105)
        else:
            axis.set_ylim(bottom=0)
            axis.yaxis.get_major_locator().set_params(integer=True)
        axis.set(title=panel.title, ylabel=panel.ylabel)
        if labels:
            axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize="small")
        axis.grid(alpha=0.3)
    locator = mdates.AutoDateLocator(tz=UTC)
    axes[-1, 0].xaxis.set_major_locator(locator)
    axes[-1, 0].xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))
    axes[-1, 0].set_xlabel("time (UTC)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(
    prometheus: Prometheus,
    out: Path,
    *,
    since: str,
    until: str,
    scrape_interval: int,
    cluster: str,
    provider: str,
) -> str:
    now = time.time()
    start, end = parse_time(since, now), parse_time(until, now)
    if end <= start:
        raise ConfigError(f"--since {since} --until {until}: the period ends before it begins")
    step, times = grid(start, end, scrape_interval)
    chosen = collect(prometheus, panels(max(4 * scrape_interval, int(2 * step))), times, step)
    if not any(panel.series for panel in chosen):
        raise ClusterbakeError(
            f"Prometheus on the head has no samples between {since} and {until}: it scrapes every "
            f"{scrape_interval} s from `cluster up` on; try a later --until or a longer --since"
        )
    out.mkdir(parents=True, exist_ok=True)
    text = summary(chosen, start, end, step, cluster, provider)
    (out / "report.txt").write_text(text + "\n")
    data = {
        "cluster": cluster,
        "start": start,
        "end": end,
        "step": step,
        "times": times,
        "panels": [{"title": p.title, "queries": p.queries, "series": p.series} for p in chosen],
    }
    (out / "report.json").write_text(json.dumps(data, indent=1) + "\n")
    plot(chosen, times, out / "report.png", f"{cluster}: nodes, jobs and utilisation")
    return text
