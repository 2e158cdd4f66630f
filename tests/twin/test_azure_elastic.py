"""Elastic node groups on the Azure twin: the head's ResumeProgram creates VMs for jobs with the head's own
managed identity (through ARM, which the twin authorizes by that identity's role assignments), its
SuspendProgram deletes them when idle (issue 9, Azure half; like tests/twin/test_aws_elastic.py).

The cluster `ciazel` is examples/azure-twin.yaml with its NFS file shares only and one elastic group
(no static compute node, up to 2 elastic ones, Standard_D2s_v5 or else Standard_D2as_v5, idle after
20 s) and short power settings. Capacity is the ARM fake's (`PUT /_twin/capacity`). The tests run in
order on one cluster, as tests/integration/test_elastic.py does on the local provider.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from azuretwintest import AzureTwin
from polling import wait_for
from timetable import boots_cluster
from twintest import (
    POWER_LOG,
    REPO,
    Twin,
    elastic_cpu_group,
    growing_keeps_every_address,
    node_status,
    requeued_job_runs_when_capacity_is_back,
    slurm_states,
    submit_and_time_the_start,
    submit_where_no_capacity_is,
    wait_done,
)

pytestmark = pytest.mark.integration
CLUSTER = "ciazel"
NODES = ("cpu-1", "cpu-2")
SIZES = ["Standard_D2s_v5", "Standard_D2as_v5"]


def _config(max_count: int = 2) -> dict:
    config = yaml.safe_load((REPO / "examples" / "azure-twin.yaml").read_text())
    config["cluster_name"] = CLUSTER
    config["azure"]["resource_group"] = f"{CLUSTER}-rg"
    config["storage"] = [s for s in config["storage"] if s["type"] == "azure_files"]
    config["node_groups"], config["power"] = elastic_cpu_group(max_count, SIZES)
    return config


@pytest.fixture(scope="module")
@boots_cluster("Azure twin 1+0..2 elastic")
def elastic(azure, tmp_path_factory):
    path = tmp_path_factory.mktemp("azel") / f"{CLUSTER}.yaml"
    path.write_text(yaml.safe_dump(_config(), sort_keys=False))
    cluster = Twin(azure.env, path, cluster=CLUSTER)
    cluster.up = cluster.cb("cluster", "up", timeout=1200)
    yield cluster
    azure.set_capacity(None)
    cluster.cb("cluster", "down", timeout=600)


def vm(azure: AzureTwin, node: str) -> dict | None:
    """The node's VM as the ARM fake holds it (tag clusterbake-name), or None."""
    return next(
        (
            r
            for r in azure.arm_state()["resources"].values()
            if r["type"] == "Microsoft.Compute/virtualMachines"
            and (r.get("tags") or {}).get("clusterbake-cluster") == CLUSTER
            and r["tags"].get("clusterbake-name") == node
        ),
        None,
    )


def head(cluster: Twin, command: str, **kwargs):
    return cluster.on("head", command, **kwargs)


def power_log_with(cluster: Twin, pattern: str) -> str | None:
    """The head's power log once a line matches `pattern`, else None."""
    log = head(cluster, POWER_LOG).stdout
    return log if re.search(pattern, log) else None


def head_identity(azure: AzureTwin) -> dict:
    (identity,) = [
        r
        for r in azure.arm_state()["resources"].values()
        if r["type"] == "Microsoft.ManagedIdentity/userAssignedIdentities"
        and r["name"] == f"clusterbake-{CLUSTER}-head"
    ]
    return identity


def test_elastic_nodes_start_powered_down_without_vms(azure, elastic):
    assert slurm_states(elastic) == {"cpu-1": "idle~", "cpu-2": "idle~"}
    assert all(vm(azure, n) is None for n in NODES)
    nodes = node_status(elastic)
    assert {n: nodes[n]["state"] for n in NODES} == {"cpu-1": "absent", "cpu-2": "absent"}
    # Planned addresses from the top of the twin's subnet 10.91.0.0/24.
    assert all(nodes[n]["address"].startswith("10.91.0.") for n in ("head", *NODES))
    hosts = head(elastic, "getent hosts cpu-1 cpu-2").stdout.split()
    assert hosts == [nodes["cpu-1"]["address"], "cpu-1", nodes["cpu-2"]["address"], "cpu-2"]
    settings = json.loads(head(elastic, "cat /etc/clusterbake/power.json").stdout)
    assert settings["provider"] == "azure"
    assert settings["azure"]["identity_client_id"] == head_identity(azure)["properties"]["clientId"]


def test_a_job_powers_both_nodes_up_through_the_heads_resume_program(azure, elastic):
    planned = {n: node_status(elastic)[n]["address"] for n in NODES}
    job, took = submit_and_time_the_start(elastic, "-N2 -o /shared/up.out", "srun hostname; sleep 20")
    print(f"\nsbatch -N2 on powered-down Azure twin nodes to RUNNING: {took:.1f}s")
    identity = head_identity(azure)["properties"]["clientId"]
    for name in NODES:
        made = vm(azure, name)
        assert made["properties"]["hardwareProfile"]["vmSize"] == SIZES[0]
        # ARM's systemData: the head's own identity made it (the twin let it through its role assignments).
        assert (made["systemData"]["createdBy"], made["systemData"]["createdByType"]) == (identity, "ManagedIdentity")
        nic = next(r for r in azure.arm_state()["resources"].values() if r["name"] == f"{CLUSTER}-{name}-nic")
        assert nic["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"] == planned[name]
        fetch = azure.inside(made["properties"]["vmId"], "journalctl -u clusterbake-node-fetch --no-pager").stdout
        assert "joined from secret join-cpu in https://" in fetch, fetch[-2000:]
    wait_done(elastic, job)
    assert sorted(head(elastic, "cat /shared/up.out").stdout.split()) == list(NODES)
    # Logged once ARM's create operation reports done, which under load can come after the job ran.
    created = rf"resume cpu-1: {CLUSTER}-cpu-1 {SIZES[0]} at "
    wait_for(
        "the resume program's log of cpu-1's VM",
        lambda: power_log_with(elastic, created),
        timeout=90,
        describe=lambda: head(elastic, f"{POWER_LOG}; journalctl -u slurmctld --no-pager | tail -40").stdout,
    )


def test_idle_nodes_are_deleted_after_idle_time(azure, elastic):
    wait_for("both idle~", lambda: set(slurm_states(elastic).values()) == {"idle~"}, timeout=150)
    wait_for("no VM left", lambda: all(vm(azure, n) is None for n in NODES), timeout=60)
    log = head(elastic, POWER_LOG).stdout
    for name in NODES:  # one call for both, or one each when they went idle apart
        assert re.search(rf"suspend [\w,-]*\b{name}\b[\w,-]* \(idle past their idle_time\)", log), log
    assert f"delete cpu-2: {CLUSTER}-cpu-2" in log
    assert not any(r["name"].startswith(f"{CLUSTER}-cpu-") for r in azure.arm_state()["resources"].values())


def test_without_capacity_for_the_first_size_a_node_comes_up_as_the_next(azure, elastic):
    azure.set_capacity({SIZES[0]: {"limit": 0, "code": "AllocationFailed"}})
    try:
        job, took = submit_and_time_the_start(elastic, "-N1 -w cpu-1 -o /shared/fallover.out", "hostname; sleep 15")
    finally:
        azure.set_capacity(None)
    print(f"\nsbatch -N1 to RUNNING with {SIZES[0]} out of capacity ({SIZES[1]} created): {took:.1f}s")
    assert vm(azure, "cpu-1")["properties"]["hardwareProfile"]["vmSize"] == SIZES[1]
    # The resume program logs the VM once ARM's create operation reports it done, which can come
    # after the node booted, joined and took the job: wait for that line rather than race it.
    created = rf"resume cpu-1: {CLUSTER}-cpu-1 {SIZES[1]} at [\d.]+ \(fallback: {SIZES[0]}: AllocationFailed\)"
    log = wait_for("the resume program's log of cpu-1's VM", lambda: power_log_with(elastic, created), timeout=60)
    assert f"resume cpu-1: {SIZES[0]}: AllocationFailed: Allocation failed." in log
    assert f"{SIZES[0]} skipped for 10s, trying {SIZES[1]}" in log
    wait_done(elastic, job)
    assert head(elastic, "cat /shared/fallover.out").stdout.strip() == "cpu-1"


def test_a_node_no_size_has_capacity_for_goes_down_and_its_job_is_requeued(azure, elastic):
    wait_for("cpu-2 idle~", lambda: slurm_states(elastic)["cpu-2"] == "idle~", timeout=60)
    azure.set_capacity(
        {SIZES[0]: {"limit": 0, "code": "ZonalAllocationFailed"}, SIZES[1]: {"limit": 0, "code": "SkuNotAvailable"}}
    )
    try:
        job = submit_where_no_capacity_is(
            elastic,
            "Azure",
            rf"clusterbake: resume failed: no capacity \({SIZES[0]}: ZonalAllocationFailed[^;]*; "
            rf"{SIZES[1]}: SkuNotAvailable",
        )
        assert vm(azure, "cpu-2") is None
    finally:
        azure.set_capacity(None)
    requeued_job_runs_when_capacity_is_back(elastic, job)


def test_growing_max_count_keeps_every_address(azure, elastic, tmp_path):
    growing_keeps_every_address(elastic, _config(max_count=4), tmp_path / f"{CLUSTER}.yaml", CLUSTER)


def test_cluster_down_leaves_nothing(azure, elastic):
    elastic.cb("cluster", "down", timeout=600)
    state = azure.arm_state()
    assert [
        r["id"] for r in state["resources"].values() if (r.get("tags") or {}).get("clusterbake-cluster") == CLUSTER
    ] == []
    assert f"{CLUSTER}-rg" not in {g["name"] for g in state["groups"].values()}
    assert state["role_assignments"] == {} and state["role_definitions"] == {}
    wait_for("the cluster's VMs gone from the twin", lambda: azure.control("GET", "/status")["vms"] == [], 30)
