"""Monitoring on a real cluster (tests/integration/monitoring.yaml: a static and an elastic compute
node): Prometheus on the head answering over HTTP, node exporter on every running node, the Slurm
exporter's nodes, jobs and pending reasons, scrape targets from the plan with the powered-down node
left out until it powers up, and `clusterbake report`'s PNG."""

import json
import re
import shlex
import urllib.parse
import urllib.request

import pytest
from localtest import REPO, cb, on, up_for_the_module
from polling import wait_for
from timetable import boots_cluster

from clusterbake.config import MONITORING_PORTS, load_config
from clusterbake.providers import get_provider

pytestmark = pytest.mark.integration
CONFIG = REPO / "tests" / "integration" / "monitoring.yaml"


def mcb(*args, **kwargs):
    return cb(*args, config=CONFIG, **kwargs)


def head(command, **kwargs):
    return on("head", command, config=CONFIG, **kwargs)


@pytest.fixture(scope="module")
@boots_cluster("local 1+1+0..1 monitoring (monitoring.yaml)")
def monitored(image):
    yield from up_for_the_module(CONFIG)


def api(path: str, **params) -> dict:
    """Prometheus's HTTP API on the head, where it listens (127.0.0.1 only, as `clusterbake report`
    reads it)."""
    url = f"http://127.0.0.1:{MONITORING_PORTS['prometheus']}{path}?{urllib.parse.urlencode(params)}"
    fetch = f"import sys, urllib.request as u; sys.stdout.write(u.urlopen({url!r}, timeout=30).read().decode())"
    answer = json.loads(head(f"python3 -c {shlex.quote(fetch)}").stdout)
    assert answer["status"] == "success", answer
    return answer["data"]


def test_prometheus_and_the_slurm_exporter_answer_only_on_the_head_itself(monitored):
    """Security review finding 13: they listened on every interface: any cluster user (or, on the
    local provider, any host user through the bridge) read every user's jobs from them."""
    address = get_provider(load_config(CONFIG)).addresses()["head"]
    for port in (MONITORING_PORTS["prometheus"], MONITORING_PORTS["slurm_exporter"]):
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=5)
        probe = f"import urllib.request as u; u.urlopen('http://{address}:{port}/metrics', timeout=5)"
        assert on("cpu-1", f"python3 -c {shlex.quote(probe)}", config=CONFIG, check=False).returncode != 0, port


def value(expr: str) -> float | None:
    result = api("/api/v1/query", query=expr)["result"]
    return float(result[0]["value"][1]) if result else None


def node_targets() -> dict[str, str]:
    targets = api("/api/v1/targets", state="active")["activeTargets"]
    return {t["labels"]["node"]: t["health"] for t in targets if t["labels"]["job"] == "node"}


def test_prometheus_answers_a_query_for_idle_nodes(monitored):
    # The static node is idle; the elastic one is powered down, a state of its own.
    def counts():
        return {r["metric"]["state"]: float(r["value"][1]) for r in api("/api/v1/query", query="slurm_nodes")["result"]}

    wait_for("one idle and one powered-down node", lambda: value('slurm_nodes{state="idle"}') == 1, 120, counts)
    wait_for("one idle and one powered-down node", lambda: counts().get("powered_down") == 1, 120, counts)
    assert counts()["idle"] == 1
    assert value('slurm_node_state{node="cpu-1",state="idle"}') == 1
    assert value("slurm_cpus_total") == 2 and value("slurm_exporter_up") == 1


def service_targets() -> dict[str, str]:
    targets = api("/api/v1/targets", state="active")["activeTargets"]
    return {t["labels"]["job"]: t["health"] for t in targets if t["labels"]["job"] in ("prometheus", "slurm")}


def first_scrapes_done() -> bool:
    return "unknown" not in service_targets().values()


def test_every_running_node_exports_and_the_powered_down_one_is_no_target(monitored):
    wait_for("head and cpu-1 scraped", lambda: node_targets() == {"head": "up", "cpu-1": "up"}, 90, node_targets)
    # A target is "unknown" until its first scrape, which may come up to a scrape interval after
    # the nodes' own: wait for each one's first answer, then it must be up.
    wait_for("Prometheus and the Slurm exporter scraped", first_scrapes_done, 90, service_targets)
    assert service_targets() == {"prometheus": "up", "slurm": "up"}
    for node in ("head", "cpu-1"):
        assert on(node, "systemctl is-active prometheus-node-exporter", config=CONFIG).stdout.strip() == "active"
    assert head("systemctl is-active prometheus clusterbake-slurm-exporter").stdout.split() == ["active", "active"]


def test_jobs_by_state_and_user_and_pending_reasons(monitored):
    job = head("cd /tmp && runuser -u researcher -- sbatch --parsable --hold -p cpu --wrap true").stdout.strip()
    try:
        wait_for("the held job in Prometheus", lambda: value('slurm_jobs{state="pending",user="researcher"}') == 1, 60)
        assert value('slurm_jobs_pending{reason="JobHeldUser"}') == 1
    finally:
        head(f"scancel {job}")
    wait_for("no pending job left", lambda: value('slurm_jobs{state="pending"}') is None, 60)


def test_an_elastic_node_is_scraped_while_it_runs(monitored):
    job = head("cd /tmp && runuser -u researcher -- sbatch --parsable -p burst --wrap 'sleep 300'").stdout.strip()
    try:
        wait_for("burst-1 scraped while it runs", lambda: node_targets().get("burst-1") == "up", 150, node_targets)
        assert value('slurm_node_state{node="burst-1",state="allocated"}') == 1
        assert value('up{job="node",node="burst-1"}') == 1
    finally:
        head(f"scancel {job}", check=False)


def test_report_plots_nodes_jobs_and_utilisation(monitored, tmp_path):
    out = tmp_path / "report"
    result = mcb("report", "--since", "10m", "--out", str(out))
    assert "nodes by state:" in result.stdout and re.search(r"\bidle now [12]\b", result.stdout), result.stdout
    png = (out / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20000
    data = json.loads((out / "report.json").read_text())
    panels = {p["title"]: p["series"] for p in data["panels"]}
    assert "idle" in panels["nodes by state"] and "powered_down" in panels["nodes by state"]
    assert {"head", "cpu-1"} <= set(panels["CPU busy per node (node exporter)"])
    assert (out / "report.txt").read_text().strip() == result.stdout.strip().split("\nwritten:")[0]


def test_a_second_cluster_up_changes_nothing_and_restarts_no_exporter(monitored):
    daemons = (
        "pidof prometheus; pidof prometheus-node-exporter; systemctl show -p MainPID --value clusterbake-slurm-exporter"
    )
    before = head(daemons).stdout.split()
    forced = mcb("cluster", "up", "--reconfigure", timeout=600)
    assert ", 0 changed tasks" in forced.stdout, forced.stdout + forced.stderr
    assert head(daemons).stdout.split() == before
