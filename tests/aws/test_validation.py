"""Config errors found with EC2's read-only calls, before anything is created (exit status 2).

Three cases run the CLI as a subprocess (message on stderr, exit status); the others
call `cluster.up` in-process against the same moto_server, which is what the CLI
runs (a subprocess costs about a second, most of it imports).
"""

from __future__ import annotations

import pytest
import yaml
from awstest import REGION, ZONE, example_config
from clitest import assert_up_refused

from clusterbake.errors import ConfigError
from clusterbake.images.store import write_aws_record
from clusterbake.state import StateDir

SUBPROCESS = {"not-in-zone", "efa-unsupported", "no-image-built"}


def _gpu(**changes):
    return [{"name": "gpu", "count": 1, "instance_type": "p5.48xlarge", "efa": True, **changes}]


def _burst(types):
    """An elastic group with fallback instance types."""
    return [{"name": "burst", "min_count": 0, "max_count": 2, "instance_types": types}]


CASES = {
    "not-in-zone": (
        {"node_groups": _gpu(instance_type="trn1.32xlarge")},
        2,
        "node_groups.0.instance_type: trn1.32xlarge is not offered in {zone} (subnet {subnet})",
    ),
    "unknown-type": (
        {"node_groups": _gpu(instance_type="p9.48xlarge")},
        2,
        "node_groups.0.instance_type: p9.48xlarge is not an instance type offered in {region}",
    ),
    "head-type": (
        {"head": {"instance_type": "p9.small"}},
        2,
        "head.instance_type: p9.small is not an instance type offered in {region}",
    ),
    "efa-unsupported": (
        {"node_groups": _gpu(instance_type="c7i.large")},
        2,
        "node_groups.0.efa: c7i.large has no EFA support; set efa: false",
    ),
    "placement-group-missing": (
        {"node_groups": _gpu(capacity_reservation_id="cr-0123456789abcdef0", placement_group="odcr-pg")},
        2,
        "node_groups.0.placement_group: no placement group named odcr-pg in {region}",
    ),
    "subnet-of-another-vpc": (
        {"aws": "other-subnet"},
        2,
        "aws.subnet_id: {other} is in vpc-",
    ),
    "unknown-key-pair": (
        {"aws": {"key_name": "nope"}},
        2,
        "aws.key_name: no key pair named nope in {region}",
    ),
    "unknown-ami": (
        {"aws": {"ami_id": "ami-0000000000000000f"}},
        2,
        "aws.ami_id: ami-0000000000000000f does not exist in {region}",
    ),
    "fallback-not-offered": (
        {"node_groups": _burst(["c7a.large", "p9.large"])},
        2,
        "node_groups.0.instance_types.1: p9.large is not an instance type offered in {region}",
    ),
    "fallback-vcpus": (
        {"node_groups": _burst(["c7a.large", "c7a.xlarge"])},
        2,
        "node_groups.0.instance_types.1: c7a.xlarge has 4 vCPUs, the primary c7a.large 2; "
        "a fallback type needs the same vCPUs",
    ),
    "fallback-memory": (
        {"node_groups": _burst(["m7a.large", "c7a.large"])},
        2,
        "node_groups.0.instance_types.1: c7a.large has 4096 MiB of memory, less than the primary m7a.large's 8192 MiB",
    ),
    "fallback-gpus": (
        {"node_groups": _burst(["g5.xlarge", "g4dn.xlarge"])},
        2,
        "node_groups.0.instance_types.1: g4dn.xlarge has 1 x t4, the primary g5.xlarge 1 x a10g; "
        "a fallback type needs at least the primary's GPUs",
    ),
    "no-image-built": (
        {"no_record": True},
        3,
        "run `make image PROVIDER=aws` (or set aws.ami_id)",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_config_error_names_the_field_and_creates_nothing(moto, network, tmp_path, monkeypatch, case):
    changes, status, expected = CASES[case]
    changes = dict(changes)
    name = "val" + "".join(c for c in case if c.isalpha())[:20]
    if not changes.pop("no_record", False):
        write_aws_record(StateDir(tmp_path), network.ami_id, REGION)
    config = example_config(network, cluster_name=name, partitions=[])
    aws = changes.pop("aws", {})
    if aws == "other-subnet":
        aws = {"subnet_id": network.other_subnet_id}
    config["aws"] |= aws
    config |= changes
    expected = expected.format(zone=ZONE, subnet=network.subnet_id, region=REGION, other=network.other_subnet_id)
    assert_up_refused(
        moto.env, tmp_path, config, status, expected, monkeypatch, in_subprocess=case in SUBPROCESS, timeout=120
    )
    ec2 = moto.ec2()
    tagged = [{"Name": "tag:clusterbake:cluster", "Values": [name]}]
    assert ec2.describe_security_groups(Filters=tagged)["SecurityGroups"] == []
    assert ec2.describe_launch_templates(Filters=tagged)["LaunchTemplates"] == []
    assert ec2.describe_instances(Filters=tagged)["Reservations"] == []


def _validate(moto, monkeypatch, tmp_path, network, subnet_id: str, vpc_id: str, node_groups=None) -> None:
    """The aws provider's read-only checks (what `cluster up` runs first) for a config in that subnet."""
    from clusterbake.config import load_config
    from clusterbake.providers import get_provider

    for key, value in moto.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CLUSTERBAKE_STATE_DIR", str(tmp_path))
    config = example_config(network, cluster_name="valegress", partitions=[])
    config["aws"] |= {"vpc_id": vpc_id, "subnet_id": subnet_id}
    if node_groups is not None:
        config["node_groups"] = node_groups
    path = tmp_path / "egress.yaml"
    path.write_text(yaml.safe_dump(config))
    get_provider(load_config(path)).validate()


def test_a_subnet_whose_nodes_could_not_reach_secrets_manager_is_refused(moto, network, tmp_path, monkeypatch):
    """Realcloud review C4: without a NAT route, an interface endpoint or (for single-interface nodes)
    public addresses, nodes never read their join bundle; said before anything is made."""
    ec2 = moto.ec2()
    vpc = ec2.create_vpc(CidrBlock="10.70.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.70.0.0/20", AvailabilityZone=ZONE)["Subnet"]["SubnetId"]
    with pytest.raises(ConfigError, match=rf"aws.subnet_id: nodes in {subnet} could not reach Secrets Manager"):
        _validate(moto, monkeypatch, tmp_path, network, subnet, vpc)
    # A public subnet: fine for single-interface nodes, not for EFA groups' many interfaces.
    gateway = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=gateway, VpcId=vpc)
    main = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["RouteTables"][0]
    ec2.create_route(RouteTableId=main["RouteTableId"], DestinationCidrBlock="0.0.0.0/0", GatewayId=gateway)
    ec2.modify_subnet_attribute(SubnetId=subnet, MapPublicIpOnLaunch={"Value": True})
    with pytest.raises(ConfigError, match=r"EFA groups \(gpu\) have several interfaces"):
        _validate(moto, monkeypatch, tmp_path, network, subnet, vpc)
    _validate(
        moto, monkeypatch, tmp_path, network, subnet, vpc, [{"name": "cpu", "count": 1, "instance_type": "c7a.large"}]
    )
    # An interface endpoint with private DNS: every node reaches it.
    service = f"com.amazonaws.{REGION}.secretsmanager"
    ec2.create_vpc_endpoint(VpcId=vpc, ServiceName=service, VpcEndpointType="Interface", SubnetIds=[subnet],
                            PrivateDnsEnabled=True)  # fmt: skip
    _validate(moto, monkeypatch, tmp_path, network, subnet, vpc)


def test_fallback_types_in_one_cluster_placement_group_are_warned_of(moto, network, tmp_path, monkeypatch, capsys):
    """Realcloud review A12: EC2 advises one instance type per cluster placement group."""
    burst = {"name": "burst", "min_count": 0, "max_count": 2, "instance_types": ["c7a.large", "m7a.large"]}
    _validate(moto, monkeypatch, tmp_path, network, network.subnet_id, network.vpc_id, [burst])
    assert "fallback instance types in one cluster placement group" not in capsys.readouterr().err
    _validate(
        moto, monkeypatch, tmp_path, network, network.subnet_id, network.vpc_id, [burst | {"placement_group": True}]
    )
    assert "warning: node_groups.0: fallback instance types in one cluster placement group" in capsys.readouterr().err


QUOTA_CASES = {
    # Two p5.48xlarge (192 vCPUs each) where the account's P quota was raised to 192 only.
    "p-on-demand": (
        {"L-417A185B": 192},
        _gpu(count=2),
        'node_groups.0.instance_type: 2 x p5.48xlarge: 384 vCPUs of the EC2 quota "Running On-Demand P instances" '
        "(L-417A185B) in {region}, which allows 192 with",
    ),
    # A quota never raised: GetServiceQuota has no applied value, AWS's default (0) holds.
    "p-spot-default": (
        {"L-7212CCBC": None},
        _gpu(spot=True, efa=False),
        'node_groups.0.instance_type: 1 x p5.48xlarge: 192 vCPUs of the EC2 quota "All P Spot Instance Requests" '
        "(L-7212CCBC) in {region}, which allows 0 with",
    ),
    # Elastic nodes count at max_count: the plan is the whole group powered up.
    "elastic-standard": (
        {"L-1216C47A": 6},
        [{"name": "burst", "min_count": 0, "max_count": 4, "instance_type": "c7a.large"}],
        "node_groups.0.instance_type: 4 x c7a.large",
    ),
}


@pytest.mark.parametrize("case", list(QUOTA_CASES))
def test_a_plan_past_an_ec2_vcpu_quota_is_refused_before_any_create(moto, network, tmp_path, monkeypatch, case):
    """Issue 31: a quota error after half the resources exist is where a first real run loses money and trust."""
    quotas, node_groups, expected = QUOTA_CASES[case]
    name = "quota" + "".join(c for c in case if c.isalpha())[:16]
    write_aws_record(StateDir(tmp_path), network.ami_id, REGION)
    config = example_config(network, cluster_name=name, partitions=[], node_groups=node_groups)
    moto.set_quotas(quotas)
    try:
        assert_up_refused(moto.env, tmp_path, config, 2, expected.format(region=REGION), monkeypatch,
                          in_subprocess=case == "p-on-demand", timeout=120)  # fmt: skip
    finally:
        moto.set_quotas(None)
    ec2 = moto.ec2()
    tagged = [{"Name": "tag:clusterbake:cluster", "Values": [name]}]
    assert ec2.describe_security_groups(Filters=tagged)["SecurityGroups"] == []
    assert ec2.describe_instances(Filters=tagged)["Reservations"] == []
