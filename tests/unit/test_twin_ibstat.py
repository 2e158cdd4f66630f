"""The Azure twin's ibstat stand-in (twins/ibstat_helper.py) against what ibstat prints on an ND H100 v5 VM
(the recorded tests/unit/data/health/ibstat-ndv5.txt) as role node_health's check reads both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from programs import load_program

from clusterbake.twins import ibstat_helper
from clusterbake.twins.azure import infiniband, skus

REPO = Path(__file__).resolve().parents[2]
health = load_program("clusterbake_health", REPO / "roles" / "node_health" / "files" / "clusterbake-health")
RECORDED = Path(__file__).resolve().parent / "data" / "health" / "ibstat-ndv5.txt"
FIELDS = ("ca", "port", "state", "physical_state", "rate", "link_layer")


def _fields(text: str) -> list[tuple]:
    return [tuple(p.get(k) for k in FIELDS) for p in health.ib_ports(text) if p.get("link_layer") == "InfiniBand"]


def test_the_ports_of_an_nd_h100_v5_read_as_the_recorded_ibstat_does():
    """The InfiniBand ports (the recording also has the accelerated networking's Ethernet function,
    which the twin does not show, and the health check leaves out)."""
    shown = ibstat_helper.render(infiniband.ports("Standard_ND96isr_H100_v5"))
    assert _fields(shown) == _fields(RECORDED.read_text())
    assert len(_fields(shown)) == 8


def test_a_link_taken_down_drains_as_a_link_down_on_azure_would():
    config = {"infiniband": {"min_rate": 400, "ports": 8}}
    down = ibstat_helper.render(infiniband.ports("standard_nd96isr_h100_v5", "Down"))
    original = health.run
    try:
        health.run = lambda argv, **_: (0, down)
        problems = health.check_infiniband(config)
        health.run = lambda argv, **_: (0, ibstat_helper.render(infiniband.ports("Standard_ND96isr_H100_v5")))
        assert health.check_infiniband(config) == []
    finally:
        health.run = original
    assert problems[0] == "mlx5_ib0 port 1 is Down/Polling" and len(problems) == 8


def test_a_size_without_rdma_has_no_port_and_ibstat_says_so(tmp_path, monkeypatch):
    assert infiniband.ports("Standard_D2s_v5") == []
    ports_file = tmp_path / "infiniband.json"
    monkeypatch.setattr(ibstat_helper, "PORTS", str(ports_file))
    infiniband.write(tmp_path, [])  # what the twin writes for such a VM
    (tmp_path / infiniband.PORTS_FILE).replace(ports_file)
    assert ibstat_helper.main(["ibstat"]) == 1


def test_the_stand_in_reads_where_the_twin_writes(tmp_path):
    """One path on both sides, and the program runs as a node runs it (python3, standard library only)."""
    assert ibstat_helper.PORTS == "/" + infiniband.PORTS_FILE
    assert infiniband.write(tmp_path, infiniband.ports(skus.TWIN_ND_SIZE)) is True
    assert infiniband.write(tmp_path, infiniband.ports(skus.TWIN_ND_SIZE)) is False  # unchanged: not rewritten
    written = json.loads((tmp_path / infiniband.PORTS_FILE).read_text())
    program = tmp_path / "ibstat"
    source = Path(ibstat_helper.__file__).read_text()
    program.write_text(source.replace(f'"{ibstat_helper.PORTS}"', repr(str(tmp_path / infiniband.PORTS_FILE))))
    result = subprocess.run([sys.executable, "-I", str(program)], capture_output=True, text=True, check=True)
    assert [(p["ca"], p["state"], p["rate"]) for p in health.ib_ports(result.stdout)] == [
        (w["ca"], w["state"], str(w["rate"])) for w in written
    ]


def test_the_twins_nd_class_size_has_this_hosts_cpus_and_infiniband():
    entry = skus.lookup(skus.TWIN_ND_SIZE, "eastus")
    assert skus.capability(entry, "vCPUs") == str(os.cpu_count())
    assert skus.capability(entry, "RdmaEnabled") == "True"
    assert skus.capability(entry, "GPUs") is None
    assert skus.lookup(skus.TWIN_ND_SIZE, "westeurope") is not None
