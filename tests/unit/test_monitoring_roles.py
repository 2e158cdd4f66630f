"""Roles prometheus, slurm_exporter and node_exporter: the parts they add to the join bundles, through
the real ansible/tasks/join.yml and node_join (tests/unit/join_run.py): Prometheus and the Slurm
exporter on the head only, with targets from the plan; the node exporter on every node; nothing
with monitoring off. The daemons themselves run in tests/integration/test_monitoring.py.
"""

from __future__ import annotations

import json

import pytest
import yaml
from join_run import files, host, play
from playbook_run import ANSIBLE_PLAYBOOK

from clusterbake.config import MONITORING_PORTS

MONITORING = {
    "enabled": True,
    "node_exporter": True,
    "dcgm_exporter": True,
    "scrape_interval": 15,
    "retention": "15d",
    "ports": MONITORING_PORTS,
}
HOSTS = {
    "head": host("10.0.1.10", "head"),
    "cpu-1": host("10.0.1.11", "cpu", clusterbake_elastic=False),
    "burst-1": host("10.0.1.12", "burst", clusterbake_elastic=True),
}
GROUPS = {"slurm_head": ["head"], "slurm_compute": ["cpu-1", "burst-1"]}
OFF = {"clusterbake_accounting": {"enabled": False}}


@pytest.fixture(scope="module")
def joined(tmp_path_factory):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip("ansible-playbook is not in the venv (make venv)")
    return play(tmp_path_factory.mktemp("monitoring"), HOSTS, GROUPS, {**OFF, "clusterbake_monitoring": MONITORING})


def test_the_head_runs_prometheus_with_targets_from_the_plan(joined):
    head = files(joined["bundles"]["head"])
    config = yaml.safe_load(head["/etc/prometheus/prometheus.yml"]["text"])
    jobs = {c["job_name"]: c for c in config["scrape_configs"]}
    assert jobs["node"]["static_configs"] == [{"targets": ["head:9100", "cpu-1:9100"]}]
    # The elastic node: only through the file the Slurm exporter keeps while it runs.
    assert jobs["node"]["file_sd_configs"][0]["files"] == ["/var/lib/clusterbake-slurm-exporter/node.json"]
    assert "dcgm" not in jobs  # no GPU node
    assert config["global"]["scrape_interval"] == "15s" and config["global"]["external_labels"] == {"cluster": "t"}
    args = head["/etc/default/prometheus"]["text"]
    assert "--storage.tsdb.retention.time=15d" in args and "--web.listen-address=127.0.0.1:9090" in args
    assert all(
        head[path]["restart"] == ["prometheus"]
        for path in ("/etc/prometheus/prometheus.yml", "/etc/default/prometheus")
    )


def test_the_head_runs_the_slurm_exporter_with_the_elastic_targets(joined):
    settings = json.loads(files(joined["bundles"]["head"])["/etc/clusterbake/slurm-exporter.json"]["text"])
    assert settings == {
        "address": "127.0.0.1",  # scraped there; nothing else may ask (security review finding 13)
        "port": 9341,
        "targets": [{"file": "/var/lib/clusterbake-slurm-exporter/node.json", "port": 9100, "nodes": ["burst-1"]}],
    }
    services = joined["bundles"]["head"]["services"]
    assert {"prometheus", "clusterbake-slurm-exporter", "prometheus-node-exporter"} <= set(services)


def test_every_node_runs_the_node_exporter_and_only_the_head_prometheus(joined):
    for node in ("cpu-1", "burst-1"):
        bundle = joined["bundles"][node]
        assert "prometheus-node-exporter" in bundle["services"]
        assert "prometheus" not in bundle["services"] and "clusterbake-slurm-exporter" not in bundle["services"]
        exporter = files(bundle)["/etc/default/prometheus-node-exporter"]
        assert 'ARGS="--web.listen-address=:9100"' in exporter["text"].splitlines()
        assert exporter["restart"] == ["prometheus-node-exporter"]


def test_monitoring_off_adds_nothing(tmp_path):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip("ansible-playbook is not in the venv (make venv)")
    off = play(tmp_path, HOSTS, GROUPS, {**OFF, "clusterbake_monitoring": {**MONITORING, "enabled": False}})
    for bundle in off["bundles"].values():
        assert not {"prometheus", "prometheus-node-exporter", "clusterbake-slurm-exporter"} & set(bundle["services"])
        assert not any("prometheus" in path for path in files(bundle))
