"""examples/azure-twin-ib.yaml end to end on the Azure twin: a group of RDMA VMs (the twin's ND-class size
Standard_NDisr_twin) on one InfiniBand fabric (issue 30's "done when").

The real CLI brings it up as `ciazib`: the group goes in an availability set in its proximity placement
group (the twin refuses an RdmaEnabled size in a Flexible scale set, as Azure gives such VMs no shared
partition), the nodes join by themselves with the `ib` feature and fabric profile, and their health check
reads the ports of the size through the twin's ibstat stand-in (twins/ibstat_helper.py): a link the test
takes down drains the node, its return resumes it. A job runs across both nodes, over TCP (no InfiniBand
here), which the job report calls out on an `ib` node. `cluster down` leaves nothing.
"""

from __future__ import annotations

import json

import pytest
from azuretwintest import AzureTwin, Environ, example_cluster
from polling import wait_for
from timetable import boots_cluster
from twintest import run

pytestmark = pytest.mark.integration
CLUSTER = "ciazib"
NODES = ("nd-1", "nd-2")
GROUP = f"{CLUSTER}-rg"


@pytest.fixture(scope="module")
@boots_cluster("Azure twin 1+2 InfiniBand (azure-twin-ib.yaml)")
def cluster(azure, tmp_path_factory):
    cluster = example_cluster(azure.env, tmp_path_factory.mktemp("azib"), "azure-twin-ib.yaml", CLUSTER)
    yield cluster
    cluster.cb("cluster", "down", timeout=600)


def _resources(azure: AzureTwin, kind: str) -> list[dict]:
    return [
        r
        for r in azure.arm_state()["resources"].values()
        if r["type"] == kind and (r.get("tags") or {}).get("clusterbake-cluster") == CLUSTER
    ]


def test_the_group_shares_one_fabric_in_an_availability_set_and_joined_with_the_ib_feature(azure, cluster):
    assert f"cluster {CLUSTER} is up: 2 compute nodes idle" in cluster.up.stdout + cluster.up.stderr
    vms = {vm["name"]: vm for vm in _resources(azure, "Microsoft.Compute/virtualMachines")}
    (availability_set,) = _resources(azure, "Microsoft.Compute/availabilitySets")
    (placement,) = _resources(azure, "Microsoft.Compute/proximityPlacementGroups")
    members = [vms[f"{CLUSTER}-{node}"] for node in NODES]
    for vm in members:
        assert vm["properties"]["availabilitySet"]["id"].lower() == availability_set["id"].lower()
        assert vm["properties"]["hardwareProfile"]["vmSize"] == "Standard_NDisr_twin"
        assert "virtualMachineScaleSet" not in vm["properties"]
    assert availability_set["properties"]["proximityPlacementGroup"]["id"].lower() == placement["id"].lower()
    assert members[0]["_ib_fabric"] == members[1]["_ib_fabric"] == availability_set["id"].lower()
    listing = cluster.on("head", "sinfo --noheader --Node --format='%N %f'").stdout.split()
    features = dict(zip(listing[::2], listing[1::2], strict=True))
    assert {n: features[n] for n in NODES} == {n: "nd,train,ib,Standard_NDisr_twin" for n in NODES}, features


def test_the_nodes_fabric_profile_and_health_check_expect_infiniband(azure, cluster):
    for node in NODES:
        assert "export CLUSTERBAKE_FABRIC=ib" in cluster.on(node, "cat /etc/clusterbake/fabric.env").stdout
        config = json.loads(cluster.on(node, "cat /etc/clusterbake/health.json").stdout)
        assert config["infiniband"] == {"min_rate": 0}, config["infiniband"]
        report = cluster.on(node, "clusterbake-health --report").stdout
        assert "ok   infiniband" in report, report
    # The head (a D-series size) has no HCA: its ibstat says so, and its checks do not ask.
    assert cluster.on("head", "ibstat", check=False).returncode == 1


def test_a_link_down_drains_the_node_and_its_return_resumes_it(azure, cluster):
    def reason() -> str:
        return cluster.on("head", "sinfo --noheader --Node --nodes nd-2 --format='%t %E'").stdout.strip()

    azure.control("PUT", f"/vms/{CLUSTER}-nd-2/infiniband", {"state": "Down"})
    try:
        wait_for("nd-2's link down", lambda: "State: Down" in cluster.on("nd-2", "ibstat").stdout, timeout=30)
        assert cluster.on("nd-2", "clusterbake-health", check=False).returncode == 1
        assert reason().endswith("clusterbake-health: mlx5_ib0 port 1 is Down/Polling"), reason()
    finally:
        azure.control("PUT", f"/vms/{CLUSTER}-nd-2/infiniband", {"state": "Active"})
    wait_for("nd-2's link up", lambda: "State: Active" in cluster.on("nd-2", "ibstat").stdout, timeout=30)
    cluster.on("nd-2", "clusterbake-health")
    cluster.wait_idle(set(NODES), timeout=60)


def test_a_job_runs_on_both_nodes_and_its_report_says_it_went_over_tcp(azure, cluster):
    result = cluster.cb("job", "submit", "hello-distributed", "--nodes", "2", "--wait", check=False, timeout=600)
    output = result.stdout
    assert "COMPLETED, exit status 0" in output, output[-3000:] + result.stderr[-2000:]
    assert "transport: gloo over TCP [fabric ib]" in output, output[-3000:]
    assert "WARNING: this node's fabric is ib but collectives went over gloo-tcp" in output
    assert result.returncode == 4  # the report's exit status for a fabric mismatch


def test_cluster_down_leaves_nothing(azure, cluster):
    cluster.cb("cluster", "down", timeout=600)
    *_, resources = azure.clients()
    with Environ(azure.env):
        tagged = list(resources.resources.list(filter=f"tagName eq 'clusterbake-cluster' and tagValue eq '{CLUSTER}'"))
        groups = [g.name for g in resources.resource_groups.list()]
    assert tagged == [] and GROUP not in groups
    wait_for("the cluster's VMs gone from the twin", lambda: azure.control("GET", "/status")["vms"] == [], 30)
    wait_for("the cluster's nodes gone", lambda: "cb-twin-azure-" not in run(["ip", "netns", "list"]).stdout, 30)
