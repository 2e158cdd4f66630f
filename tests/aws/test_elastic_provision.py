"""Elastic node groups on AWS, against moto_server: planned addresses, the inventory of every
planned node, the head's role, and the head's power program (its aws backend) run in-process.

`cluster up --provision-only` launches the head and the static nodes only; every planned
node (elastic ones too) has its address from the top of the subnet, kept in state.json.
The inventory's `slurm_power_aws` is what role slurm_power writes to the head's
/etc/clusterbake/power.json: the tests hand it to the program's AwsBackend, which then
launches and terminates instances on the same moto_server.
"""

from __future__ import annotations

import base64
import email
import ipaddress
import json

import programs
import pytest
import yaml
from awstest import REGION, inventory, live_instances, provisioned, run_cb, small_config, tag_map

from clusterbake.images.store import write_aws_record
from clusterbake.providers.aws.api import CAPACITY_ERRORS
from clusterbake.providers.aws.iam import volume_keys as iam_volume_keys
from clusterbake.providers.userdata import NAME_PLACEHOLDER
from clusterbake.state import StateDir

CLUSTER = "elasticaws"
PLAN = ["head", "cpu-1", "burst-1", "burst-2", "burst-3"]


def _config(network, max_count=3):
    burst = {"name": "burst", "min_count": 1, "max_count": max_count, "instance_types": ["c7a.large", "m7a.large"]}
    return small_config(network, CLUSTER, "c7a.large", burst | {"idle_time": 60}, power={"capacity_cooldown": 300})


@pytest.fixture(scope="module")
def elastic(moto, network, tmp_path_factory):
    yield from provisioned(moto, tmp_path_factory.mktemp("state-elastic"), network.ami_id, _config(network))


@pytest.fixture
def program(elastic, moto, tmp_path, monkeypatch):
    """The power program with the inventory's settings, its state file and log under tmp_path."""
    module = programs.power_program(monkeypatch, tmp_path / "state.json")
    settings = inventory(moto, elastic["state_dir"], elastic["path"])["all"]["vars"]["slurm_power_aws"]
    config = {"provider": "aws", "capacity_cooldown": 300, "aws": settings, "log": str(tmp_path / "power.log")}
    backend = module.aws.AwsBackend(config, client=moto.ec2(), sleep=lambda _: None)
    yield module, backend, tmp_path
    moto.limit_capacity(None)
    backend.power("stop", ["burst-2", "burst-3"])


def _state(elastic) -> dict:
    return json.loads((elastic["state_dir"] / "clusters" / CLUSTER / "state.json").read_text())


def _planned(elastic, name: str) -> str:
    return _state(elastic)["nodes"][name]["address"]


def _instances(moto) -> dict[str, dict]:
    return {tag_map(i)["clusterbake:name"]: i for i in live_instances(moto.ec2(), CLUSTER)}


def test_up_launches_the_static_nodes_at_their_planned_addresses(moto, elastic):
    instances = _instances(moto)
    assert sorted(instances) == ["burst-1", "cpu-1", "head"]
    assert "1 x c7a.large (burst)" in elastic["first"].stderr
    assert "2 elastic node(s) powered up by Slurm for jobs" in elastic["first"].stderr
    planned = {name: node["address"] for name, node in _state(elastic)["nodes"].items()}
    # Every planned node, elastic ones included, from the top of the subnet in plan order.
    assert list(planned) == sorted(PLAN)
    # 10.50.0.0/20 (conftest.make_network): from the top, in plan order, skipping the addresses
    # other clusters' instances on this server hold (the tests share the server).
    numbers = [ipaddress.ip_address(planned[name]) for name in PLAN]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(PLAN)
    assert all(ipaddress.ip_address("10.50.15.0") < n <= ipaddress.ip_address("10.50.15.254") for n in numbers)
    others = {
        i["PrivateIpAddress"]
        for r in moto.ec2().describe_instances()["Reservations"]
        for i in r["Instances"]
        if tag_map(i).get("clusterbake:cluster") != CLUSTER and i["State"]["Name"] != "terminated"
    }
    assert not others & set(planned.values())
    assert {name: i["PrivateIpAddress"] for name, i in instances.items()} == {name: planned[name] for name in instances}
    assert instances["burst-1"]["InstanceType"] == "c7a.large"  # the primary type


def _reserved(moto, network, cluster=CLUSTER) -> set[str]:
    """Addresses in the cluster's explicit subnet CIDR reservations."""
    found = moto.ec2().get_subnet_cidr_reservations(SubnetId=network.subnet_id)["SubnetIpv4CidrReservations"]
    return {
        str(address)
        for r in found
        if tag_map(r).get("clusterbake:cluster") == cluster and r["ReservationType"] == "explicit"
        for address in ipaddress.ip_network(r["Cidr"])
    }


def test_the_planned_addresses_are_reserved_so_ec2_gives_none_of_them_to_another_interface(moto, elastic, network):
    """Realcloud review A4: the twin gives out free addresses in no order, as EC2 does; without the
    reservation some of these interfaces would take the powered-down burst nodes' addresses."""
    planned = {name: node["address"] for name, node in _state(elastic)["nodes"].items()}
    assert _reserved(moto, network) == set(planned.values())
    ec2 = moto.ec2()
    made = [ec2.create_network_interface(SubnetId=network.subnet_id)["NetworkInterface"] for _ in range(200)]
    try:
        assert not {i["PrivateIpAddress"] for i in made} & set(planned.values())
        assert max(ipaddress.ip_address(i["PrivateIpAddress"]) for i in made) > ipaddress.ip_address("10.50.8.0")
    finally:
        for interface in made:
            ec2.delete_network_interface(NetworkInterfaceId=interface["NetworkInterfaceId"])


def test_up_again_launches_nothing(moto, elastic):
    again = run_cb(moto, elastic["state_dir"], elastic["config"], "cluster", "up", "--provision-only")
    assert "all 3 nodes exist" in again.stderr
    assert "launching" not in again.stderr and "created" not in again.stderr and "updated" not in again.stderr
    assert sorted(_instances(moto)) == ["burst-1", "cpu-1", "head"]


def test_inventory_lists_every_planned_node(moto, elastic):
    inv = inventory(moto, elastic["state_dir"], elastic["path"])
    hostvars = inv["_meta"]["hostvars"]
    assert inv["slurm_compute"]["hosts"] == ["cpu-1", "burst-1", "burst-2", "burst-3"]
    assert inv["nodegroup_burst"]["hosts"] == ["burst-1", "burst-2", "burst-3"]
    planned = {name: node["address"] for name, node in _state(elastic)["nodes"].items()}
    assert {name: host["ansible_host"] for name, host in hostvars.items()} == planned
    running = {name: host["clusterbake_running"] for name, host in hostvars.items()}
    assert running == {"head": True, "cpu-1": True, "burst-1": True, "burst-2": False, "burst-3": False}
    assert [n for n, h in hostvars.items() if h["clusterbake_elastic"]] == ["burst-2", "burst-3"]
    assert hostvars["burst-3"]["clusterbake_instance_id"] is None
    assert hostvars["burst-3"]["clusterbake_instance_type"] == "c7a.large"
    # The Slurm spec of an elastic node is its primary type's.
    assert hostvars["burst-3"]["clusterbake_slurm_node"]["real_memory"] == int(4096 * 0.95)


def test_inventory_tells_the_head_how_to_launch_elastic_nodes(moto, elastic, network):
    variables = inventory(moto, elastic["state_dir"], elastic["path"])["all"]["vars"]
    assert variables["slurm_power_provider"] == "aws"
    power = variables["slurm_power_aws"]
    assert (power["cluster"], power["region"], power["endpoint_url"]) == (CLUSTER, REGION, moto.url)
    # Every group: elastic nodes are powered up, static ones replaced when lost (recovery.replace_lost_nodes).
    assert sorted(power["groups"]) == ["burst", "cpu"]
    burst = power["groups"]["burst"]
    templates = _state(elastic)["launch_templates"]
    assert burst["launch_template"] == templates["burst"]
    assert burst["instance_types"] == ["c7a.large", "m7a.large"]
    addresses = {name: node["address"] for name, node in _state(elastic)["nodes"].items()}
    assert burst["addresses"] == {name: addresses[name] for name in ("burst-1", "burst-2", "burst-3")}
    assert power["groups"]["cpu"]["addresses"] == {"cpu-1": addresses["cpu-1"]}
    assert power["groups"]["cpu"]["launch_template"] == templates["cpu"]
    group_id = _state(elastic)["security_group"]
    for instance_type in ("c7a.large", "m7a.large"):
        assert burst["network_interfaces"][instance_type] == [
            {"DeviceIndex": 0, "SubnetId": network.subnet_id, "Groups": [group_id], "DeleteOnTermination": True}
        ]
    assert burst["tags"] == {
        "clusterbake:cluster": CLUSTER,
        "clusterbake:role": "compute",
        "clusterbake:nodegroup": "burst",
    }
    assert power["name_placeholder"] == NAME_PLACEHOLDER and burst["user_data"].count(NAME_PLACEHOLDER) == 2
    assert power["capacity_errors"] == sorted(CAPACITY_ERRORS)  # the program falls over on the controller's list


def test_user_data_template_gives_each_node_its_own_name(moto, elastic):
    """The template with a node's name put in parses as the user data `cluster up` gives a node."""
    variables = inventory(moto, elastic["state_dir"], elastic["path"])["all"]["vars"]
    template = variables["slurm_power_aws"]["groups"]["burst"]["user_data"]
    ec2 = moto.ec2()
    burst1 = _instances(moto)["burst-1"]
    launched = base64.b64decode(
        ec2.describe_instance_attribute(InstanceId=burst1["InstanceId"], Attribute="userData")["UserData"]["Value"]
    ).decode()

    def parts(text: str) -> dict:
        message = email.message_from_string(text)
        return {
            p.get_content_type(): p.get_payload(decode=True).decode() for p in message.walk() if not p.is_multipart()
        }

    filled = parts(template.replace(NAME_PLACEHOLDER, "burst-1"))
    assert filled == parts(launched)  # the same parts (only the MIME boundary differs)
    assert yaml.safe_load(filled["text/cloud-config"])["hostname"] == "burst-1"
    assert json.loads(filled["text/x-clusterbake"])["hostname"] == "burst-1"


def test_the_head_has_its_own_role_that_may_pass_only_the_node_role(moto, elastic):
    ec2, iam = moto.ec2(), moto.client("iam")

    def profile_of(name: str) -> str:
        data = ec2.describe_launch_template_versions(LaunchTemplateName=name, Versions=["$Latest"])
        return data["LaunchTemplateVersions"][0]["LaunchTemplateData"]["IamInstanceProfile"]["Name"]

    assert profile_of(f"clusterbake-{CLUSTER}-head") == f"clusterbake-{CLUSTER}-head"
    assert profile_of(f"clusterbake-{CLUSTER}-burst") == f"clusterbake-{CLUSTER}-node"
    document = iam.get_role_policy(RoleName=f"clusterbake-{CLUSTER}-head", PolicyName="clusterbake-head")
    statements = {s["Sid"]: s for s in document["PolicyDocument"]["Statement"]}
    node_role = iam.get_role(RoleName=f"clusterbake-{CLUSTER}-node")["Role"]["Arn"]
    assert statements["PassNodeRole"]["Action"] == "iam:PassRole"
    assert statements["PassNodeRole"]["Resource"] == node_role
    launch = statements["WhatComputeNodesLaunchWith"]["Resource"]
    state = _state(elastic)
    templates = {t["id"] for name, t in state["launch_templates"].items() if name != "head"}
    assert {r.rsplit("/", 1)[1] for r in launch if ":launch-template/" in r} == templates
    assert any(r.endswith(f":security-group/{state['security_group']}") for r in launch)
    assert not any(":key-pair/" in r for r in launch)  # security review finding 2: no key pair of choice
    # Instances only from the compute templates (ARNs), only of the groups' types.
    instances = statements["LaunchComputeNodes"]
    assert instances["Resource"].endswith(":instance/*")
    assert {a.rsplit("/", 1)[1] for a in instances["Condition"]["ArnEquals"]["ec2:LaunchTemplate"]} == templates
    assert statements["WhatComputeNodesLaunchWith"]["Condition"] == {"ArnEquals": instances["Condition"]["ArnEquals"]}
    assert instances["Condition"]["StringEquals"]["ec2:InstanceType"]
    assert statements["TerminateClusterNodes"]["Condition"] == {
        "StringEquals": {"ec2:ResourceTag/clusterbake:cluster": CLUSTER, "ec2:ResourceTag/clusterbake:role": "compute"}
    }
    assert statements["SeeInstances"]["Resource"] == "*"
    assert not any(s["Action"] == "secretsmanager:GetSecretValue" for s in statements.values())  # never needs one
    assert "EncryptedVolumes" not in statements  # moto's AMIs have unencrypted volumes, no default key


def test_volumes_under_a_customer_managed_key_get_the_head_its_kms_permissions(moto, network, tmp_path):
    """Realcloud review A8: an AMI whose snapshot is encrypted with a customer managed key, and EBS
    encryption by default with another: the head's role may use both through EC2 (else its launches
    end terminated); the AWS managed aws/ebs key needs nothing."""
    ec2, kms, iam = moto.ec2(), moto.client("kms"), moto.client("iam")
    snapshot_key, default_key = (kms.create_key()["KeyMetadata"]["Arn"] for _ in range(2))
    volume = ec2.create_volume(AvailabilityZone="us-east-1a", Size=8, Encrypted=True, KmsKeyId=snapshot_key)
    snapshot = ec2.create_snapshot(VolumeId=volume["VolumeId"])["SnapshotId"]
    root = [{"DeviceName": "/dev/xvda", "Ebs": {"SnapshotId": snapshot}}]
    ami = ec2.register_image(Name="cmk-ami", RootDeviceName="/dev/xvda", Architecture="x86_64",
                             BlockDeviceMappings=root)["ImageId"]  # fmt: skip
    assert iam_volume_keys(ec2, kms, ami) == [snapshot_key]  # encryption by default is off
    ec2.enable_ebs_encryption_by_default()
    try:
        assert iam_volume_keys(ec2, kms, ami) == [snapshot_key]  # the default key is aws/ebs
        ec2.modify_ebs_default_kms_key_id(KmsKeyId=default_key)
        write_aws_record(StateDir(tmp_path), ami, REGION)
        config = _config(network) | {"cluster_name": "cmkheads"}
        run_cb(moto, tmp_path, config, "cluster", "up", "--provision-only")
        document = iam.get_role_policy(RoleName="clusterbake-cmkheads-head", PolicyName="clusterbake-head")
        statements = {s["Sid"]: s for s in document["PolicyDocument"]["Statement"]}
        assert statements["EncryptedVolumes"]["Resource"] == sorted([snapshot_key, default_key])
        assert statements["EncryptedVolumes"]["Condition"] == {
            "StringEquals": {"kms:ViaService": f"ec2.{REGION}.amazonaws.com"}
        }
        assert statements["EncryptedVolumeGrants"]["Action"] == "kms:CreateGrant"
        assert statements["EncryptedVolumeGrants"]["Condition"]["Bool"] == {"kms:GrantIsForAWSResource": "true"}
        run_cb(moto, tmp_path, config, "cluster", "down")
    finally:
        ec2.reset_ebs_default_kms_key_id()
        ec2.disable_ebs_encryption_by_default()


def test_a_head_launched_with_the_node_profile_gets_the_heads(moto, elastic):
    """A cluster whose head predates the head role: `cluster up` moves its head to the head's profile."""
    ec2 = moto.ec2()

    def association():
        head = _instances(moto)["head"]
        found = ec2.describe_iam_instance_profile_associations(
            Filters=[{"Name": "instance-id", "Values": [head["InstanceId"]]}]
        )["IamInstanceProfileAssociations"]
        return next(a for a in found if a["State"] in ("associating", "associated"))

    ec2.replace_iam_instance_profile_association(
        AssociationId=association()["AssociationId"], IamInstanceProfile={"Name": f"clusterbake-{CLUSTER}-node"}
    )
    assert association()["IamInstanceProfile"]["Arn"].endswith(f"/clusterbake-{CLUSTER}-node")
    result = run_cb(moto, elastic["state_dir"], elastic["config"], "cluster", "up", "--provision-only")
    assert f"instance profile now clusterbake-{CLUSTER}-head" in result.stderr
    assert association()["IamInstanceProfile"]["Arn"].endswith(f"/clusterbake-{CLUSTER}-head")
    again = run_cb(moto, elastic["state_dir"], elastic["config"], "cluster", "up", "--provision-only")
    assert "instance profile now" not in again.stderr


def test_program_launches_an_elastic_node_and_terminates_it(moto, elastic, program):
    _, backend, tmp = program
    assert backend.running() == {"head", "cpu-1", "burst-1"}
    assert backend.power("start", ["burst-2"]) == {"burst-2": "ok"}
    instance = _instances(moto)["burst-2"]
    assert instance["InstanceType"] == "c7a.large"
    assert instance["PrivateIpAddress"] == _planned(elastic, "burst-2")
    assert (
        tag_map(instance).items()
        >= {
            "clusterbake:cluster": CLUSTER,
            "clusterbake:role": "compute",
            "clusterbake:nodegroup": "burst",
            "clusterbake:name": "burst-2",
            "Name": f"{CLUSTER}-burst-2",
        }.items()
    )
    raw = moto.ec2().describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
    assert '"hostname": "burst-2"' in base64.b64decode(raw["UserData"]["Value"]).decode()
    assert "burst-2" in backend.running()
    # A second resume of a node that runs launches nothing.
    assert backend.power("start", ["burst-2"]) == {"burst-2": "ok"}
    assert sum(1 for i in live_instances(moto.ec2(), CLUSTER) if tag_map(i)["clusterbake:name"] == "burst-2") == 1
    assert backend.power("stop", ["burst-2", "burst-3"]) == {"burst-2": "ok", "burst-3": "ok"}
    assert "burst-2" not in _instances(moto) and "burst-2" not in backend.running()
    log = (tmp / "power.log").read_text()
    assert f"resume burst-2: {instance['InstanceId']} c7a.large at {_planned(elastic, 'burst-2')}" in log
    assert f"terminate burst-2: {instance['InstanceId']}" in log


def test_program_places_a_node_it_started_as_the_next_inventory_would(moto, elastic, program, monkeypatch):
    """EC2 places an instance in its network only once it runs: the node the head started hangs under
    `unplaced` in the topology.conf of `cluster up` until the reconcile loop's pass (network.py) puts it
    where EC2 says, in the very file the next `cluster up` would write (nothing for it to change). The
    twin's layout answers for c7a.large and m7a.large here as EC2 answers for a p5 (stand_in_types):
    EC2 itself gives them no topology."""
    from clusterbake.topology import UNPLACED, collect_hostlist, leaf_of, render

    module, backend, tmp = program
    monkeypatch.setattr(module.core, "scontrol", lambda *args: "")
    monkeypatch.setattr(module.core, "compress", collect_hostlist)  # a head's scontrol: tests/twin
    moto.topology_file.write_text(json.dumps({"stand_in_types": ["c7a.large", "m7a.large"]}))
    try:
        at_cluster_up = inventory(moto, elastic["state_dir"], elastic["path"])["all"]["vars"]["clusterbake_topology"]
        assert {n: leaf != UNPLACED for n, leaf in leaf_of(at_cluster_up).items()} == {
            "cpu-1": True, "burst-1": True, "burst-2": False, "burst-3": False
        }  # fmt: skip
        conf = tmp / "topology.conf"
        conf.write_text(render(at_cluster_up))
        config = backend.config | {
            "topology_file": str(conf), "static_nodes": ["cpu-1", "burst-1"], "elastic_nodes": ["burst-2", "burst-3"]
        }  # fmt: skip
        assert backend.power("start", ["burst-2"]) == {"burst-2": "ok"}
        backend.running()
        module.network.refresh(config, backend, now=1000.0)
        after = inventory(moto, elastic["state_dir"], elastic["path"])["all"]["vars"]["clusterbake_topology"]
        assert leaf_of(after)["burst-2"] != UNPLACED and leaf_of(after)["burst-3"] == UNPLACED
        assert conf.read_text() == render(after)
    finally:
        moto.topology_file.unlink()


def test_program_falls_over_to_the_next_type_when_ec2_has_no_capacity(moto, elastic, program):
    _, backend, tmp = program
    used = sum(1 for i in live_instances(moto.ec2(), CLUSTER) if i["InstanceType"] == "c7a.large")
    moto.limit_capacity({"c7a.large": used})  # not one more c7a.large
    assert backend.power("start", ["burst-3"]) == {"burst-3": "ok"}
    instance = _instances(moto)["burst-3"]
    address = _planned(elastic, "burst-3")
    assert instance["InstanceType"] == "m7a.large" and instance["PrivateIpAddress"] == address
    log = (tmp / "power.log").read_text()
    assert "resume burst-3: c7a.large: InsufficientInstanceCapacity" in log
    assert "c7a.large skipped for 300s, trying m7a.large" in log
    assert f"resume burst-3: {instance['InstanceId']} m7a.large at {address} (fallback: c7a.large: " in log
    # The cool-down is in the program's state file: the next resume skips c7a.large at once.
    state = json.loads((tmp / "state.json").read_text())
    assert list(state["capacity"]) == ["c7a.large"]
    assert state["capacity"]["c7a.large"]["code"] == "InsufficientInstanceCapacity"


def test_program_rides_out_a_dropped_connection_and_a_5xx(moto, elastic, program):
    """realcloud review A3: EC2's transient failures (the twin's injected faults, over real HTTP)."""
    _, backend, _ = program
    faults = {
        "DescribeInstances": {"fault": "drop", "times": 1},
        "RunInstances": {"fault": "InternalError", "times": 1},
    }
    moto.inject_faults(faults)
    try:
        assert backend.power("start", ["burst-3"]) == {"burst-3": "ok"}
        assert moto.faults_left() == {}
    finally:
        moto.inject_faults(None)
    assert backend.power("stop", ["burst-3"]) == {"burst-3": "ok"}


@pytest.mark.parametrize("code", ["VcpuLimitExceeded", "Unsupported"])
def test_program_falls_over_on_a_vcpu_quota_or_a_type_the_zone_does_not_offer(moto, elastic, program, code):
    """EC2 says "no" in more ways than InsufficientInstanceCapacity (the twin's capacity takes the code)."""
    _, backend, tmp = program
    moto.limit_capacity({"c7a.large": {"count": 0, "code": code}})
    try:
        assert backend.power("start", ["burst-3"]) == {"burst-3": "ok"}
    finally:
        moto.limit_capacity(None)
    assert _instances(moto)["burst-3"]["InstanceType"] == "m7a.large"
    assert f"resume burst-3: c7a.large: {code}: " in (tmp / "power.log").read_text()
    assert backend.power("stop", ["burst-3"]) == {"burst-3": "ok"}


def test_program_reports_the_ec2_error_when_no_type_has_capacity(moto, elastic, program):
    _, backend, _ = program
    moto.limit_capacity({"c7a.large": 0, "m7a.large": 0})
    result = backend.power("start", ["burst-2"])["burst-2"]
    assert result.startswith(
        "no capacity (c7a.large: InsufficientInstanceCapacity; m7a.large: InsufficientInstanceCapacity)"
    )
    assert "We currently do not have sufficient m7a.large capacity" in result
    assert "burst-2" not in _instances(moto)
    # Within the cool-down neither type is asked again.
    again = backend.power("start", ["burst-2"])["burst-2"]
    assert again.startswith("no capacity (c7a.large: InsufficientInstanceCapacity until ")
    assert "; m7a.large: InsufficientInstanceCapacity until " in again
    assert again.endswith(
        "): We currently do not have sufficient m7a.large capacity in the Availability Zone you "
        "requested. Our system will be working on provisioning additional capacity."
    )


def test_growing_max_count_keeps_every_address(moto, elastic, network):
    before = {name: node["address"] for name, node in _state(elastic)["nodes"].items()}
    grown = _config(network, max_count=5)
    run_cb(moto, elastic["state_dir"], grown, "cluster", "up", "--provision-only")
    after = {name: node["address"] for name, node in _state(elastic)["nodes"].items()}
    assert {name: after[name] for name in before} == before
    assert sorted(set(after) - set(before)) == ["burst-4", "burst-5"]
    assert len(set(after.values())) == len(after)
    assert sorted(_instances(moto)) == ["burst-1", "cpu-1", "head"]  # nothing launched for them
    assert _reserved(moto, network) == set(after.values())
    run_cb(moto, elastic["state_dir"], elastic["config"], "cluster", "up", "--provision-only")
    assert _reserved(moto, network) == set(before.values())  # burst-4 and -5's released again


def test_down_removes_the_head_role_too(moto, network, tmp_path):
    write_aws_record(StateDir(tmp_path), network.ami_id, REGION)
    config = _config(network) | {"cluster_name": "elasticdown"}
    run_cb(moto, tmp_path, config, "cluster", "up", "--provision-only")
    assert _reserved(moto, network, "elasticdown")
    down = run_cb(moto, tmp_path, config, "cluster", "down")
    assert _reserved(moto, network, "elasticdown") == set()
    assert "removed role clusterbake-elasticdown-head" in down.stderr
    assert "removed instance profile clusterbake-elasticdown-head" in down.stderr
    names = [r["RoleName"] for r in moto.client("iam").list_roles()["Roles"]]
    assert not [n for n in names if "elasticdown" in n]
