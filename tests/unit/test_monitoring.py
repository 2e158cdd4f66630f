"""Monitoring without a cluster: the scrape targets from the plan (ansible/filter_plugins/monitoring.py),
the Slurm exporter (roles/slurm_exporter/files/clusterbake-slurm-exporter) on Slurm's recorded answers,
and `clusterbake report` on Prometheus's recorded answers.

The recordings in tests/unit/data/monitoring/ come from the montest cluster of
tests/integration/test_monitoring.py (Slurm 22.05.8, Prometheus 2.42): `scontrol show node
--oneliner` and `squeue` with the elastic node powered down, up and allocated, and the range
queries `clusterbake report` made there. The exporter and Prometheus themselves run in that test.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from clusterbake import report
from clusterbake.config import MONITORING_PORTS
from clusterbake.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data" / "monitoring"
sys.path.insert(0, str(REPO / "ansible" / "filter_plugins"))
from monitoring import monitoring_exporter_jobs, prometheus_config, slurm_exporter_targets  # noqa: E402


def load_program(path: Path, name: str):
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


exporter = load_program(REPO / "roles" / "slurm_exporter" / "files" / "clusterbake-slurm-exporter", "slurm_exporter")

# --- scrape targets from the plan --------------------------------------------------------------

HOSTVARS = {
    "head": {},
    "cpu-1": {"clusterbake_elastic": False},
    "burst-1": {"clusterbake_elastic": True},
    "burst-2": {"clusterbake_elastic": True},
    "gpu-1": {"clusterbake_elastic": False},
    "gpu-2": {"clusterbake_elastic": True},
    "fake-1": {"clusterbake_elastic": False},
}
GROUPS = {
    "slurm_head": ["head"],
    "slurm_compute": ["cpu-1", "burst-1", "burst-2", "gpu-1", "gpu-2", "fake-1"],
    "dcgm": ["gpu-1", "gpu-2", "fake-1"],
    "placeholder_gpus": ["fake-1"],
}


def test_static_nodes_are_scraped_and_elastic_ones_through_the_exporters_file():
    jobs = monitoring_exporter_jobs(HOSTVARS, GROUPS, MONITORING_PORTS, targets_dir="/var/lib/x")
    assert jobs == [
        {
            "job": "node",
            "port": 9100,
            "static": ["head", "cpu-1", "gpu-1", "fake-1"],
            "elastic": ["burst-1", "burst-2", "gpu-2"],
            "file": "/var/lib/x/node.json",
        },
        # GPU nodes with DCGM only: placeholder GPUs have no driver to ask.
        {"job": "dcgm", "port": 9400, "static": ["gpu-1"], "elastic": ["gpu-2"], "file": "/var/lib/x/dcgm.json"},
    ]
    assert slurm_exporter_targets(jobs) == [
        {"file": "/var/lib/x/node.json", "port": 9100, "nodes": ["burst-1", "burst-2", "gpu-2"]},
        {"file": "/var/lib/x/dcgm.json", "port": 9400, "nodes": ["gpu-2"]},
    ]


def test_without_elastic_or_gpu_nodes_there_is_no_file_and_no_dcgm_job():
    groups = {"slurm_head": ["head"], "slurm_compute": ["cpu-1", "cpu-2"]}
    jobs = monitoring_exporter_jobs({}, groups, MONITORING_PORTS, targets_dir="/t")
    assert [(j["job"], j["static"], j["file"]) for j in jobs] == [("node", ["head", "cpu-1", "cpu-2"], None)]
    assert monitoring_exporter_jobs({}, groups, MONITORING_PORTS, node_exporter=False) == []


def test_prometheus_yml_scrapes_itself_the_slurm_exporter_and_each_job():
    jobs = monitoring_exporter_jobs(HOSTVARS, GROUPS, MONITORING_PORTS, targets_dir="/t")
    config = prometheus_config(jobs, "demo", MONITORING_PORTS, 15, "head")
    assert config["global"] == {
        "scrape_interval": "15s",
        "evaluation_interval": "15s",
        "external_labels": {"cluster": "demo"},
    }
    by_job = {c["job_name"]: c for c in config["scrape_configs"]}
    assert list(by_job) == ["prometheus", "slurm", "node", "dcgm"]
    assert by_job["slurm"]["static_configs"] == [{"targets": ["127.0.0.1:9341"]}]  # its metrics name the nodes
    assert by_job["node"]["static_configs"] == [{"targets": ["head:9100", "cpu-1:9100", "gpu-1:9100", "fake-1:9100"]}]
    assert by_job["node"]["file_sd_configs"] == [{"files": ["/t/node.json"], "refresh_interval": "30s"}]
    assert by_job["dcgm"]["relabel_configs"] == [
        {"source_labels": ["__address__"], "regex": "([^:]+):\\d+", "target_label": "node"}
    ]


# --- the Slurm exporter --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("IDLE", "idle"),
        ("MIXED", "mixed"),
        ("ALLOCATED", "allocated"),
        ("IDLE+CLOUD+POWERED_DOWN", "powered_down"),
        ("IDLE+CLOUD+POWERING_UP", "powering_up"),
        ("ALLOCATED+CLOUD+POWERING_UP", "powering_up"),
        ("IDLE+POWERING_DOWN", "powering_down"),
        ("DOWN+NOT_RESPONDING", "down"),
        ("IDLE+NOT_RESPONDING", "down"),
        ("DOWN+CLOUD+POWERED_DOWN", "powered_down"),
        ("IDLE+DRAIN", "drained"),
        ("MIXED+DRAIN", "draining"),
        ("IDLE+COMPLETING", "completing"),
        ("FUTURE", "future"),
        ("SOMETHING_NEW", "unknown"),
    ],
)
def test_node_states_become_one_word(state, expected):
    assert exporter.node_state(state) == expected


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def test_nodes_of_scontrol_are_parsed_with_their_cpus_and_gpus():
    nodes = exporter.parse_nodes(recorded("scontrol-show-node-powered-down.txt"))
    assert [(n["name"], n["state"], n["cpus"], n["cpus_allocated"]) for n in nodes] == [
        ("burst-1", "powered_down", 1, 0),
        ("cpu-1", "idle", 1, 0),
    ]
    running = exporter.parse_nodes(recorded("scontrol-show-node-allocated.txt"))
    assert {n["name"]: (n["state"], n["cpus_allocated"]) for n in running} == {
        "burst-1": ("allocated", 1),
        "cpu-1": ("idle", 0),
    }


def test_gpus_come_from_the_nodes_tres():
    line = (
        "NodeName=gpu-1 Arch=x86_64 CoresPerSocket=2 CPUAlloc=2 CPUEfctv=2 CPUTot=2 CPULoad=0.05 "
        "Gres=gpu:placeholder:4 NodeAddr=gpu-1 OS=Linux 6.1.0-28-amd64 #1 SMP PREEMPT_DYNAMIC Debian "
        "RealMemory=4096 State=MIXED ThreadsPerCore=1 Partitions=gpu "
        "CfgTRES=cpu=2,mem=4G,billing=2,gres/gpu=4 AllocTRES=cpu=2,mem=100M,gres/gpu=2 Reason=None"
    )
    (node,) = exporter.parse_nodes(line)
    assert (node["state"], node["gpus"], node["gpus_allocated"]) == ("mixed", 4, 2)


def test_jobs_and_pending_reasons_are_counted_by_state_user_and_reason():
    jobs = exporter.parse_jobs(recorded("squeue.txt"))
    assert ("pending", "researcher", "JobHeldUser") in jobs
    text = metrics(exporter.parse_nodes(recorded("scontrol-show-node-allocated.txt")), jobs)
    assert 'slurm_jobs{state="pending",user="researcher"} 1.0' in text
    assert 'slurm_jobs{state="running",user="researcher"} 1.0' in text
    assert 'slurm_jobs_pending{reason="JobHeldUser"} 1.0' in text
    # A reason naming nodes is cut at its comma: no series per node list.
    assert exporter.parse_jobs("PENDING|a|ReqNodeNotAvail, UnavailableNodes:cpu-[3-4]") == [
        ("pending", "a", "ReqNodeNotAvail")
    ]


def metrics(nodes, jobs, up=True) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    class Once:
        def collect(self):
            return exporter.families(nodes, jobs, up)

    registry = CollectorRegistry()
    registry.register(Once())
    return generate_latest(registry).decode()


def test_every_node_state_is_reported_with_zeros():
    text = metrics(exporter.parse_nodes(recorded("scontrol-show-node-powered-down.txt")), [])
    for state in exporter.NODE_STATES:
        assert f'slurm_nodes{{state="{state}"}}' in text
    assert 'slurm_nodes{state="idle"} 1.0' in text and 'slurm_nodes{state="powered_down"} 1.0' in text
    assert 'slurm_node_state{node="burst-1",state="powered_down"} 1.0' in text
    assert "slurm_cpus_total 2.0" in text and "slurm_gpus_total 0.0" in text and "slurm_exporter_up 1.0" in text


def test_a_slurm_that_does_not_answer_is_reported_not_hidden():
    def broken(argv):
        raise exporter.subprocess.CalledProcessError(
            1, argv, "", "slurm_load_node error: Unable to contact slurm controller"
        )

    text = "".join(
        f"{family.name} {sample.value}\n"
        for family in exporter.SlurmCollector({}, runner=broken).collect()
        for sample in family.samples
    )
    assert text == "slurm_exporter_up 0\n"


def test_the_elastic_targets_file_lists_only_running_nodes_and_is_rewritten_only_on_change(tmp_path):
    entry = {"file": str(tmp_path / "node.json"), "port": 9100, "nodes": ["burst-1", "burst-2"]}
    down = [{"name": "burst-1", "state": "powered_down"}, {"name": "burst-2", "state": "powering_up"}]
    exporter.write_targets([entry], down)
    assert json.loads((tmp_path / "node.json").read_text()) == []
    up = [{"name": "burst-1", "state": "allocated"}, {"name": "burst-2", "state": "powered_down"}]
    exporter.write_targets([entry], up)
    assert json.loads((tmp_path / "node.json").read_text()) == [
        {"targets": ["burst-1:9100"], "labels": {"node": "burst-1"}}
    ]
    stamp = (tmp_path / "node.json").stat().st_mtime_ns
    exporter.write_targets([entry], up)
    assert (tmp_path / "node.json").stat().st_mtime_ns == stamp
    assert oct((tmp_path / "node.json").stat().st_mode & 0o777) == "0o644"


# --- clusterbake report --------------------------------------------------------------------------


class RecordedPrometheus:
    """Answers range queries with what the montest cluster's Prometheus answered (query -> matrix)."""

    def __init__(self, answers: dict[str, list[dict]]):
        self.answers = answers
        self.asked: list[tuple[str, float, float, float]] = []

    def query_range(self, expr, start, end, step):
        self.asked.append((expr, start, end, step))
        return self.answers.get(expr, [])


@pytest.fixture
def answers():
    return json.loads(recorded("query-range.json"))


def test_times_are_durations_ago_now_or_dates():
    assert report.parse_time("30m", 10_000) == 10_000 - 1800
    assert report.parse_time("2h", 10_000) == 10_000 - 7200
    assert report.parse_time("now", 10_000) == 10_000
    assert report.parse_time("2026-12-01T09:00", 0) == 1796115600
    with pytest.raises(ConfigError, match="give a duration ago"):
        report.parse_time("yesterday", 0)


def test_the_grid_has_whole_seconds_and_at_most_max_points():
    step, times = report.grid(1000.7, 1000.7 + 3600, 15)
    assert step == 15 and times[0] == 1000 and times[-1] <= 4600 and len(times) == 241
    step, times = report.grid(0, 30 * 86400, 15)
    assert len(times) <= report.MAX_POINTS + 1 and step == 6480


def test_the_report_plots_every_panel_from_prometheus(tmp_path, answers):
    start, end = answers["start"], answers["end"]
    prometheus = RecordedPrometheus(answers["results"])
    times = list(range(start, end + 1, answers["step"]))
    panels = report.collect(prometheus, report.panels(answers["rate_window"]), times, answers["step"])
    titles = {p.title: p for p in panels}
    # The elastic node powered down, powering up, allocated; the static one idle (and, while the cluster came
    # up, UNKNOWN: Slurm's state of a node whose slurmd has not registered yet). States no node was in are left out.
    assert {"idle", "powered_down", "allocated", "powering_up"} <= set(titles["nodes by state"].series)
    assert not {"fail", "drained", "down"} & set(titles["nodes by state"].series)
    assert {"head", "cpu-1"} <= set(titles["CPU busy per node (node exporter)"].series)
    assert "GPUs" not in titles["allocated by Slurm"].series  # no GPU in that cluster: no series, no line
    path = tmp_path / "report.png"
    report.plot(panels, times, path, "montest")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20000
    text = report.summary(panels, start, end, answers["step"], "montest", "local")
    assert text.splitlines()[0].startswith("montest: ")
    assert "nodes by state: " in text and "note: local nodes share this machine" in text
