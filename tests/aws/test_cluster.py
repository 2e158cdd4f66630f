"""`clusterbake cluster up --provision-only` / `cluster down` for examples/aws-p5.yaml, end to end.

The real CLI runs as a subprocess against a real moto_server (conftest.py); what
it created is then read back from that server with boto3. moto keeps launch
template data as sent, so the template checks (IMDSv2, EFA interfaces, spot,
capacity reservation) are real round trips. moto does not carry a template's
placement group or EFA interfaces over to the instances it launches; those two
are covered with botocore's Stubber in test_stubbed.py and test_placement.py.
"""

from __future__ import annotations

import base64
import email
import ipaddress
import json
import subprocess

import pytest
import yaml
from awstest import REGION, ZONE, example_config, inventory, live_instances, provisioned, run_cb, tag_map
from clitest import REPO

from clusterbake.config import load_config
from clusterbake.errors import ConfigError
from clusterbake.images.store import write_aws_record
from clusterbake.providers.aws.provider import AwsProvider
from clusterbake.state import StateDir
from clusterbake.topology import leaf_of

CLUSTER = "p5demo"


@pytest.fixture(scope="module")
def p5(moto, network, tmp_path_factory):
    """The example cluster, up once for the module (and down at its end)."""
    yield from provisioned(moto, tmp_path_factory.mktemp("state-p5"), network.ami_id, example_config(network))


def _templates(ec2) -> dict[str, dict]:
    found = ec2.describe_launch_templates(Filters=[{"Name": "tag:clusterbake:cluster", "Values": [CLUSTER]}])
    result = {}
    for template in found["LaunchTemplates"]:
        version = ec2.describe_launch_template_versions(
            LaunchTemplateId=template["LaunchTemplateId"], Versions=["$Latest"]
        )["LaunchTemplateVersions"][0]
        result[template["LaunchTemplateName"]] = version["LaunchTemplateData"]
    return result


def test_instances_are_tagged_and_named(moto, p5):
    instances = live_instances(moto.ec2(), CLUSTER)
    by_name = {tag_map(i)["clusterbake:name"]: i for i in instances}
    assert sorted(by_name) == ["gpu-1", "gpu-2", "head"]
    assert (
        tag_map(by_name["head"]).items()
        >= {
            "clusterbake:cluster": CLUSTER,
            "clusterbake:role": "head",
            "clusterbake:nodegroup": "head",
            "Name": f"{CLUSTER}-head",
        }.items()
    )
    for name in ("gpu-1", "gpu-2"):
        tags = tag_map(by_name[name])
        assert tags["clusterbake:role"] == "compute" and tags["clusterbake:nodegroup"] == "gpu"
        assert by_name[name]["InstanceType"] == "p5.48xlarge"
    assert by_name["head"]["InstanceType"] == "m7i.2xlarge"
    assert "3 nodes provisioned" in p5["first"].stdout


def test_hostnames_come_from_each_nodes_user_data(moto, p5):
    ec2 = moto.ec2()
    for instance in live_instances(ec2, CLUSTER):
        name = tag_map(instance)["clusterbake:name"]
        raw = ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
        message = email.message_from_bytes(base64.b64decode(raw["UserData"]["Value"]))
        parts = {
            p.get_content_type(): p.get_payload(decode=True).decode() for p in message.walk() if not p.is_multipart()
        }
        # cloud-init reads the cloud-config part, the image's boot service its own (role cloud_boot).
        cloud = yaml.safe_load(parts["text/cloud-config"])
        ours = json.loads(parts["text/x-clusterbake"])
        public_key = (p5["state_dir"] / "clusters" / CLUSTER / "ssh" / "id_ed25519.pub").read_text().strip()
        assert cloud["hostname"] == ours["hostname"] == name
        assert cloud["ssh_authorized_keys"] == ours["ssh_authorized_keys"] == [public_key]
        assert ours["cluster"] == CLUSTER and ours["ssh_user"] == "ubuntu"
        # The join bundle holds the munge key: user data only says where it is.
        assert "munge" not in json.dumps(ours)


PINNED_METADATA_OPTIONS = {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 1}


def test_gpu_launch_template_has_imdsv2_32_efa_interfaces_and_placement(moto, p5, network):
    data = _templates(moto.ec2())[f"clusterbake-{CLUSTER}-gpu"]
    assert data["ImageId"] == network.ami_id
    assert data["InstanceType"] == "p5.48xlarge"
    # Security review finding 9: the hop limit pinned to 1 (our AMIs' ImdsSupport v2.0 would make it 2).
    assert data["MetadataOptions"] == PINNED_METADATA_OPTIONS
    interfaces = data["NetworkInterfaces"]
    # AWS EC2 user guide, P5 "use case 1": an ENA primary on card 0 (device 0), EFA-only on
    # card 0 device 1 and on cards 1-31 device 0 (DescribeInstanceTypes: 32 cards, 32 EFA).
    layout = [(i["NetworkCardIndex"], i["DeviceIndex"], i.get("InterfaceType")) for i in interfaces]
    assert layout == [(0, 0, None), (0, 1, "efa-only")] + [(c, 0, "efa-only") for c in range(1, 32)]
    assert all(i["SubnetId"] == network.subnet_id and i["DeleteOnTermination"] for i in interfaces)
    # Every network interface is tagged as the node is (found by the cluster's tag).
    interface_tags = next(s for s in data["TagSpecifications"] if s["ResourceType"] == "network-interface")
    assert tag_map(interface_tags) == {
        "clusterbake:cluster": CLUSTER,
        "clusterbake:role": "compute",
        "clusterbake:nodegroup": "gpu",
    }
    assert data["Placement"] == {"GroupName": f"clusterbake-{CLUSTER}-gpu"}
    assert "InstanceMarketOptions" not in data  # spot: false -> on-demand
    assert "CapacityReservationSpecification" not in data
    instance_tags = next(s for s in data["TagSpecifications"] if s["ResourceType"] == "instance")
    assert tag_map(instance_tags) == {
        "clusterbake:cluster": CLUSTER,
        "clusterbake:role": "compute",
        "clusterbake:nodegroup": "gpu",
    }


def test_head_launch_template_has_one_plain_interface(moto, p5):
    data = _templates(moto.ec2())[f"clusterbake-{CLUSTER}-head"]
    assert data["InstanceType"] == "m7i.2xlarge"
    assert data["MetadataOptions"] == PINNED_METADATA_OPTIONS
    [interface] = data["NetworkInterfaces"]
    assert interface["DeviceIndex"] == 0 and "InterfaceType" not in interface
    assert "Placement" not in data


def test_security_group_allows_itself_and_ssh_from_the_cidrs(moto, p5, network):
    [group] = moto.ec2().describe_security_groups(Filters=[{"Name": "tag:clusterbake:cluster", "Values": [CLUSTER]}])[
        "SecurityGroups"
    ]
    assert group["GroupName"] == f"clusterbake-{CLUSTER}" and group["VpcId"] == network.vpc_id
    ingress = {
        (p["IpProtocol"], p.get("FromPort"), g["GroupId"])
        for p in group["IpPermissions"]
        for g in p.get("UserIdGroupPairs", [])
    }
    assert ingress == {("-1", None, group["GroupId"])}
    ssh = {
        (p["IpProtocol"], p["FromPort"], p["ToPort"], r["CidrIp"])
        for p in group["IpPermissions"]
        for r in p.get("IpRanges", [])
    }
    assert ssh == {("tcp", 22, 22, "203.0.113.0/24")}
    egress_to_self = [p for p in group["IpPermissionsEgress"] if p.get("UserIdGroupPairs")]
    assert egress_to_self and egress_to_self[0]["IpProtocol"] == "-1"
    assert egress_to_self[0]["UserIdGroupPairs"][0]["GroupId"] == group["GroupId"]


def test_placement_group_per_efa_group(moto, p5):
    groups = moto.ec2().describe_placement_groups(Filters=[{"Name": "tag:clusterbake:cluster", "Values": [CLUSTER]}])
    assert [(g["GroupName"], g["Strategy"]) for g in groups["PlacementGroups"]] == [
        (f"clusterbake-{CLUSTER}-gpu", "cluster")
    ]


def test_up_again_reuses_everything(moto, p5):
    ec2 = moto.ec2()
    before = sorted(i["InstanceId"] for i in live_instances(ec2, CLUSTER))
    templates = _templates(ec2)
    again = run_cb(moto, p5["state_dir"], p5["config"], "cluster", "up", "--provision-only")
    assert "all 3 nodes exist" in again.stderr
    assert "created" not in again.stderr and "updated" not in again.stderr
    assert sorted(i["InstanceId"] for i in live_instances(ec2, CLUSTER)) == before
    assert _templates(ec2) == templates
    assert (
        len(
            ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [f"clusterbake-{CLUSTER}"]}])[
                "SecurityGroups"
            ]
        )
        == 1
    )


def test_up_launches_only_the_missing_node(moto, p5):
    ec2 = moto.ec2()
    gpu2 = next(i for i in live_instances(ec2, CLUSTER) if tag_map(i)["clusterbake:name"] == "gpu-2")
    ec2.terminate_instances(InstanceIds=[gpu2["InstanceId"]])
    result = run_cb(moto, p5["state_dir"], p5["config"], "cluster", "up", "--provision-only")
    assert "launching 1 x p5.48xlarge (gpu)" in result.stderr
    names = sorted(tag_map(i)["clusterbake:name"] for i in live_instances(ec2, CLUSTER))
    assert names == ["gpu-1", "gpu-2", "head"]


def test_inventory_lists_running_nodes_with_slurm_specs_from_the_instance_type(moto, p5):
    inv = inventory(moto, p5["state_dir"], p5["path"])
    hostvars = inv["_meta"]["hostvars"]
    assert sorted(hostvars) == ["gpu-1", "gpu-2", "head"]
    assert inv["slurm_head"]["hosts"] == ["head"]
    assert inv["slurm_compute"]["hosts"] == ["gpu-1", "gpu-2"]
    assert inv["nodegroup_gpu"]["hosts"] == ["gpu-1", "gpu-2"]
    assert inv["efa"]["hosts"] == ["gpu-1", "gpu-2"] and inv["gpu"]["hosts"] == ["gpu-1", "gpu-2"]
    assert inv["nvswitch"]["hosts"] == ["gpu-1", "gpu-2"]  # p5.48xlarge: its join runs the fabric manager
    assert inv["train"]["hosts"] == ["gpu-1", "gpu-2"]
    instances = {tag_map(i)["clusterbake:name"]: i for i in live_instances(moto.ec2(), CLUSTER)}
    state = json.loads((p5["state_dir"] / "clusters" / CLUSTER / "state.json").read_text())
    for name, host in hostvars.items():
        # The planned address (from the top of the subnet), which the instance was launched with.
        assert host["ansible_host"] == instances[name]["PrivateIpAddress"] == state["nodes"][name]["address"]
        assert host["clusterbake_instance_id"] == instances[name]["InstanceId"]
        assert host["clusterbake_availability_zone"] == ZONE
        assert host["clusterbake_running"] is True
    # From the top of 10.50.0.0/20 in plan order (below what other tests' clusters hold there).
    numbers = [ipaddress.ip_address(hostvars[n]["ansible_host"]) for n in ("head", "gpu-1", "gpu-2")]
    assert numbers == sorted(numbers, reverse=True) and numbers[0] <= ipaddress.ip_address("10.50.15.254")
    assert numbers[-1] > ipaddress.ip_address("10.50.15.0")
    assert hostvars["gpu-1"]["clusterbake_instance_type"] == "p5.48xlarge"
    assert hostvars["gpu-1"]["clusterbake_slurm_node"] == {
        "cpus": 192,
        "sockets": 1,
        "cores_per_socket": 96,
        "threads_per_core": 2,
        "real_memory": 1992294,  # 95% of 2,097,152 MiB
        "gres": ["gpu:h100:8"],
        "features": ["gpu", "train", "efa", "p5.48xlarge"],
    }
    assert hostvars["head"]["clusterbake_slurm_node"]["cpus"] == 8
    variables = inv["all"]["vars"]
    assert variables["clusterbake_provider"] == "aws"
    assert variables["ansible_user"] == "ubuntu" and variables["ansible_become"] is True
    assert variables["slurm_proctrack_type"] == "proctrack/cgroup"
    # topology.conf's switches from EC2's DescribeInstanceTopology (p5.48xlarge has a place there): every
    # compute node under a leaf of EC2's network nodes, none unplaced.
    topology = variables["clusterbake_topology"]
    assert sorted(leaf_of(topology)) == ["gpu-1", "gpu-2"]
    assert all(line["name"].startswith("nn-") for line in topology), topology


def test_inventory_cluster_name_from_the_environment(moto, p5):
    inv = inventory(moto, p5["state_dir"], p5["path"], CLUSTERBAKE_CLUSTER="no-such-cluster")
    assert inv["_meta"]["hostvars"] == {} and inv["slurm_head"] == {"hosts": []}


def test_inventory_warns_of_a_cluster_instance_without_a_node_name(moto, p5, network):
    ec2 = moto.ec2()
    stray = ec2.run_instances(
        ImageId=network.ami_id,
        InstanceType="c7a.large",
        MinCount=1,
        MaxCount=1,
        SubnetId=network.subnet_id,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "clusterbake:cluster", "Value": CLUSTER}]}],
    )["Instances"][0]["InstanceId"]
    try:
        result = subprocess.run(
            [str(REPO / "inventories" / "aws_ec2.py"), "--list"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**moto.env, "CLUSTERBAKE_STATE_DIR": str(p5["state_dir"]), "CLUSTERBAKE_CONFIG": str(p5["path"])},
        )
        assert result.returncode == 0, result.stderr
        assert f"warning: {stray} is tagged clusterbake:cluster={CLUSTER} but has no clusterbake:name tag" in (
            result.stderr
        )
        hostvars = json.loads(result.stdout)["_meta"]["hostvars"]
        assert stray not in {h.get("clusterbake_instance_id") for h in hostvars.values()}
    finally:
        ec2.terminate_instances(InstanceIds=[stray])


def test_stopped_node_stays_in_the_inventory_not_running_and_up_starts_it(moto, p5):
    ec2 = moto.ec2()
    gpu1 = next(i for i in live_instances(ec2, CLUSTER) if tag_map(i)["clusterbake:name"] == "gpu-1")
    ec2.stop_instances(InstanceIds=[gpu1["InstanceId"]])
    # Every planned node is in the inventory (slurm.conf and /etc/hosts name it); Ansible connects to the head only.
    host = inventory(moto, p5["state_dir"], p5["path"])["_meta"]["hostvars"]["gpu-1"]
    assert host["clusterbake_running"] is False and host["ansible_host"] == gpu1["PrivateIpAddress"]
    result = run_cb(moto, p5["state_dir"], p5["config"], "cluster", "up", "--provision-only")
    assert "starting 1 stopped instance" in result.stderr
    state = ec2.describe_instances(InstanceIds=[gpu1["InstanceId"]])["Reservations"][0]["Instances"][0]["State"]
    assert state["Name"] == "running"


def test_down_removes_everything_and_a_second_down_finds_nothing(moto, network, tmp_path):
    """Its own small cluster (head + a login node + 1 EFA node + 1 spot node), so that it can go down here."""
    write_aws_record(StateDir(tmp_path), network.ami_id, REGION)
    config = example_config(
        network,
        cluster_name="downtest",
        node_groups=[
            {"name": "gpu", "count": 1, "instance_type": "p4d.24xlarge", "efa": True},
            {"name": "cpu", "count": 1, "instance_type": "c7i.large", "spot": True},
        ],
        partitions=[],
        login_nodes={"count": 1, "instance_type": "m7i.large", "ssh_cidrs": ["192.0.2.0/24"]},
    )
    run_cb(moto, tmp_path, config, "cluster", "up", "--provision-only")
    ec2 = moto.ec2()
    instances = {tag_map(i)["clusterbake:name"]: i for i in live_instances(ec2, "downtest")}
    assert sorted(instances) == ["cpu-1", "gpu-1", "head", "login-1"]
    # The login node: the cluster's group and its own, which admits SSH from the users' networks only.
    in_vpc = [{"Name": "vpc-id", "Values": [network.vpc_id]}]
    groups = {g["GroupName"]: g for g in ec2.describe_security_groups(Filters=in_vpc)["SecurityGroups"]}
    login_group, cluster_group = groups["clusterbake-downtest-login"], groups["clusterbake-downtest"]
    assert [(p["FromPort"], p["IpRanges"][0]["CidrIp"]) for p in login_group["IpPermissions"]] == [(22, "192.0.2.0/24")]
    assert sorted(g["GroupId"] for g in instances["login-1"]["NetworkInterfaces"][0]["Groups"]) == sorted(
        [login_group["GroupId"], cluster_group["GroupId"]]
    )
    assert [g["GroupId"] for g in instances["head"]["NetworkInterfaces"][0]["Groups"]] == [cluster_group["GroupId"]]
    assert tag_map(instances["login-1"])["clusterbake:role"] == "login"
    raw = ec2.describe_instance_attribute(InstanceId=instances["login-1"]["InstanceId"], Attribute="userData")
    # It joins by itself from its own secret, like a compute node.
    assert "clusterbake/downtest/join/login" in base64.b64decode(raw["UserData"]["Value"]).decode()
    secrets = moto.client("secretsmanager").list_secrets()["SecretList"]
    assert "clusterbake/downtest/join/login" in {s["Name"] for s in secrets}
    spot = ec2.describe_launch_template_versions(LaunchTemplateName="clusterbake-downtest-cpu", Versions=["$Latest"])
    market = spot["LaunchTemplateVersions"][0]["LaunchTemplateData"]["InstanceMarketOptions"]
    assert market["MarketType"] == "spot"
    p4d = ec2.describe_launch_template_versions(LaunchTemplateName="clusterbake-downtest-gpu", Versions=["$Latest"])
    p4d_interfaces = p4d["LaunchTemplateVersions"][0]["LaunchTemplateData"]["NetworkInterfaces"]
    assert [i.get("InterfaceType") for i in p4d_interfaces] == [None] + ["efa-only"] * 4  # p4d: ENA + 4 EFA cards

    down = run_cb(moto, tmp_path, config, "cluster", "down")
    assert "removed instance head" in down.stderr
    assert "removed placement group clusterbake-downtest-gpu" in down.stderr
    tagged = [{"Name": "tag:clusterbake:cluster", "Values": ["downtest"]}]
    assert live_instances(ec2, "downtest") == []
    states = {
        i["State"]["Name"] for r in ec2.describe_instances(Filters=tagged)["Reservations"] for i in r["Instances"]
    }
    assert states == {"terminated"}
    assert ec2.describe_launch_templates(Filters=tagged)["LaunchTemplates"] == []
    assert ec2.describe_placement_groups(Filters=tagged)["PlacementGroups"] == []
    assert ec2.describe_security_groups(Filters=tagged)["SecurityGroups"] == []
    names = {s["Name"] for s in moto.client("secretsmanager").list_secrets()["SecretList"]}
    assert not {n for n in names if n.startswith("clusterbake/downtest/")}, names
    assert not (tmp_path / "clusters" / "downtest").exists()

    again = run_cb(moto, tmp_path, config, "cluster", "down")
    assert "nothing to remove" in again.stderr


def test_status_and_node_stop_start_in_process(moto, p5, monkeypatch):
    """provider.status / stop_node / start_node (the CLI's `cluster status` would also ssh to
    the head's private IP for sinfo, which does not exist here)."""
    for key, value in moto.env.items():
        monkeypatch.setenv(key, value)
    provider = AwsProvider(load_config(p5["path"]), StateDir(p5["state_dir"]))
    assert {s.name: s.state for s in provider.status()} == {"head": "running", "gpu-1": "running", "gpu-2": "running"}
    provider.stop_node("gpu-2")
    assert {s.name: s.state for s in provider.status()}["gpu-2"] == "stopped"
    provider.start_node("gpu-2")
    states = {s.name: (s.state, s.address) for s in provider.status()}
    assert states["gpu-2"][0] == "running" and states["gpu-2"][1]
    with pytest.raises(ConfigError, match="no node 'gpu-9'"):
        provider.stop_node("gpu-9")
