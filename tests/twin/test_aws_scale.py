"""A 1 + 1,000-node elastic cluster on the EC2 twin (issue 33's scale rehearsal): every node planned
(addresses, slurm.conf, /etc/hosts, the inventory, the scrape targets, `cluster status`) while none
but the head runs, then one job that powers 32 of them up at once through the head's ResumeProgram.

The twin's default subnet (a /24) holds 250 nodes: the test makes a /22 in the twin's VPC through
EC2's API, as a user would for a large cluster. Figures (how each grows from 100 to 1,000 nodes)
are bench/scale.py's, not this test's.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import subprocess

import pytest
import yaml
from polling import wait_for
from timetable import boots_cluster
from twintest import (
    POWER_LOG,
    REPO,
    Twin,
    elastic_cpu_group,
    slurm_states,
    submit_and_time_the_start,
    twin_setting,
)

from clusterbake.config import MONITORING_PORTS

pytestmark = pytest.mark.integration
CLUSTER = "citscale"
NODES = 1000
RESUMED = 32
SUBNET = "10.90.4.0/22"  # 1,019 addresses EC2 hands out (it keeps each subnet's first four and last)
# EC2's quota of running on-demand standard vCPUs (L-1216C47A): the twin's account has 1,152, as an
# established account might; 1 + 1,000 two-vCPU nodes need 2,002, and `cluster up` refuses the plan
# before making anything unless it is raised (what a user does in Service Quotas first).
STANDARD_VCPUS = "L-1216C47A"


def raised_vcpu_quota(vcpus: int):
    """The twin account's standard vCPU quota at `vcpus` (its $MOTO_QUOTAS_FILE), as before after."""
    return twin_setting("quotas.json", {STANDARD_VCPUS: vcpus})


def scale_config(subnet_id: str, nodes: int, cluster: str) -> dict:
    """examples/aws-twin.yaml with one elastic group of `nodes` c7a.large in the subnet, no login node."""
    config = yaml.safe_load((REPO / "examples" / "aws-twin.yaml").read_text())
    config["cluster_name"] = cluster
    config["aws"]["subnet_id"] = subnet_id
    config.pop("login_nodes")
    config["node_groups"], config["power"] = elastic_cpu_group(nodes, ["c7a.large"])
    # 32 twin nodes boot at once on this machine's 2 cores: the default ResumeTimeout (600 s), not the
    # elastic tests' 180 s, which a first boot of 32 overran (Slurm then powered up 32 others).
    config["power"]["resume_timeout"] = 600
    return config


def large_subnet(twin: Twin, cidr: str) -> str:
    """The twin VPC's subnet `cidr` in the default subnet's zone, made if missing: its id."""
    ec2 = twin.client("ec2")
    found = ec2.describe_subnets(Filters=[{"Name": "cidr-block", "Values": [cidr]}])["Subnets"]
    if found:
        return found[0]["SubnetId"]
    default = ec2.describe_subnets(SubnetIds=[twin.status()["subnet_id"]])["Subnets"][0]
    made = ec2.create_subnet(VpcId=default["VpcId"], CidrBlock=cidr, AvailabilityZone=default["AvailabilityZone"])
    return made["Subnet"]["SubnetId"]


@pytest.fixture(scope="module")
@boots_cluster(f"AWS twin 1+0..{NODES} elastic")
def scale(twin_env, tmp_path_factory):
    path = tmp_path_factory.mktemp("scale") / f"{CLUSTER}.yaml"
    twin = Twin(twin_env, path, cluster=CLUSTER)
    path.write_text(yaml.safe_dump(scale_config(large_subnet(twin, SUBNET), NODES, CLUSTER), sort_keys=False))
    with raised_vcpu_quota(2048):
        twin.up = twin.cb("cluster", "up", timeout=1800)
        yield twin
        twin.cb("cluster", "down", timeout=900)
    twin.assert_cluster_gone()


def compute_names() -> list[str]:
    return [f"cpu-{i}" for i in range(1, NODES + 1)]


def test_every_node_is_planned_while_only_the_head_runs(scale):
    status = json.loads(scale.cb("cluster", "status", "--json").stdout)
    nodes = {n["name"]: n for n in status["nodes"]}
    assert sorted(nodes) == sorted(["head", *compute_names()])
    addresses = [n["address"] for n in nodes.values()]
    assert len(set(addresses)) == NODES + 1
    assert all(ipaddress.ip_address(a) in ipaddress.ip_network(SUBNET) for a in addresses)
    assert status["summary"]["running"] == 1 and status["summary"]["powered_down"] == NODES
    assert {nodes[n]["state"] for n in compute_names()} == {"absent"}
    # slurm.conf: one line for the 1,000 cloud nodes, the partition over all of them.
    conf = scale.on("head", "cat /etc/slurm/slurm.conf").stdout.splitlines()
    assert any(line.startswith(f"NodeName=cpu-[1-{NODES}] ") and line.endswith(" State=CLOUD") for line in conf)
    assert any(line.startswith(f"PartitionName=cpu Nodes=cpu-[1-{NODES}] ") for line in conf)
    assert set(slurm_states(scale).values()) == {"idle~"} and len(slurm_states(scale)) == NODES
    # Every node's planned address is in the head's /etc/hosts (a node resumed later needs no change).
    hosts = dict(
        reversed(line.split()) for line in scale.on("head", "getent hosts " + " ".join(nodes)).stdout.splitlines()
    )
    assert hosts == {name: n["address"] for name, n in nodes.items()}
    # The inventory script (what ops playbooks run on) lists them all, the compute group too.
    listed = json.loads(
        subprocess.run(
            [str(REPO / ".venv" / "bin" / "python"), str(REPO / "inventories" / "aws_ec2.py"), "--list"],
            capture_output=True, text=True, check=True, env={**scale.env, "CLUSTERBAKE_CONFIG": str(scale.config)},
        ).stdout
    )  # fmt: skip
    assert len(listed["slurm_compute"]["hosts"]) == NODES and len(listed["_meta"]["hostvars"]) == NODES + 1
    # Prometheus scrapes the head; powered-down nodes are no target (they come with their power-up).
    assert node_targets(scale) == {"head"}


def node_targets(twin: Twin) -> set[str]:
    url = f"http://127.0.0.1:{MONITORING_PORTS['prometheus']}/api/v1/targets?state=active"
    fetch = f"import sys, urllib.request as u; sys.stdout.write(u.urlopen({url!r}, timeout=30).read().decode())"
    targets = json.loads(twin.on("head", f"python3 -c {shlex.quote(fetch)}").stdout)["data"]["activeTargets"]
    return {t["labels"]["node"] for t in targets if t["labels"]["job"] == "node"}


def why_no_start(twin: Twin) -> str:
    """What the head says of a job that did not start (a rehearsal once saw 32 nodes boot and the job
    not run within 400 s, and nothing else): its queue, the nodes not idle~, the power log's end."""
    said = [
        twin.on("head", "squeue -o '%i %T %r %N'; sinfo -R; sinfo -h -N -o '%N %t' | grep -v 'idle~'", check=False),
        twin.on("head", f"{POWER_LOG} | tail -n 40; tail -n 40 /var/log/slurm/slurmctld.log", check=False),
    ]
    return "\n".join(f"--- {result.args[-1][:60]}\n{result.stdout}{result.stderr}" for result in said)


def test_a_job_powers_32_nodes_up_at_once_and_runs(scale):
    # Each node says what its configless slurmd fetched from slurmctld: the partition of 1,000 nodes (the
    # sleep: the job is seen RUNNING before it ends).
    step = "srun sh -c 'echo $(hostname) $(scontrol show partition cpu -o | grep -o \" Nodes=[^ ]*\")'; sleep 3"
    try:
        job, took = submit_and_time_the_start(scale, f"-N{RESUMED} -o /shared/scale.out", step)
    except AssertionError as failed:
        raise AssertionError(f"{failed}\n{why_no_start(scale)}") from None
    print(f"\nsbatch -N{RESUMED} on powered-down twin nodes to RUNNING: {took:.1f}s")
    wait_for(
        f"job {job} completed",
        lambda: "JobState=COMPLETED" in scale.on("head", f"scontrol show job {job}").stdout,
        timeout=300,
    )
    lines = dict(line.split(" ", 1) for line in scale.on("head", "cat /shared/scale.out").stdout.splitlines())
    ran = sorted(lines)
    assert len(ran) == RESUMED and set(ran) <= set(compute_names()), lines
    assert set(lines.values()) == {f"Nodes=cpu-[1-{NODES}]"}, lines
    # One ResumeProgram call for the 32 (ResumeRate=0), one instance each, at its planned address.
    power = scale.on("head", POWER_LOG).stdout
    resumes = [line for line in power.splitlines() if " resume " in line and f" for job {job} " in line]
    assert len(resumes) == 1, power[-3000:]
    assert set(resumes[0].split(" resume ", 1)[1].split(" for ", 1)[0].split(",")) == set(ran)
    launched = dict(re.findall(r" resume (cpu-\d+): i-[0-9a-f]+ c7a\.large at (\S+)", power))
    planned = {n["name"]: n["address"] for n in json.loads(scale.cb("cluster", "status", "--json").stdout)["nodes"]}
    assert launched == {n: planned[n] for n in ran}
    # Their power-down after idle_time is test_aws_elastic.py's; `cluster down` ends these (the fixture
    # checks that nothing of the cluster is left).
