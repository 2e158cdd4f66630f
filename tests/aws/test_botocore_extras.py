"""The head's power program on a distribution's older botocore (Debian 12: 1.29), which has no
DescribeInstanceTopology: role slurm_power ships the operation as a botocore sdk-extras file
(clusterbake.providers.aws.botocore_extras), and the program's client merges it. Found on the EC2
twin's elastic cluster, whose head has Debian's botocore: `'EC2' object has no attribute
'describe_instance_topology'` in every reconcile pass."""

from __future__ import annotations

import json
import os

import boto3
import botocore.session
import programs
import pytest
from awstest import REGION
from botocore.loaders import Loader

from clusterbake.providers.aws.botocore_extras import API_VERSION, SERVICE, sdk_extras

SHIPPED = programs.POWER_FILES / "botocore-data" / SERVICE / API_VERSION / "service-2.sdk-extras.json"


def _model() -> dict:
    return botocore.session.get_session().get_component("data_loader").load_service_model(SERVICE, "service-2")


def test_the_shipped_extras_are_the_vendors_model_of_the_operation():
    """The operation and its shapes as the controller's pinned botocore has them (AWS's own model),
    renamed; regenerate after a botocore update with UPDATE_GOLDEN=1."""
    expected = json.dumps(sdk_extras(_model()), indent=1, sort_keys=True) + "\n"
    if os.environ.get("UPDATE_GOLDEN"):
        SHIPPED.write_text(expected)
    assert SHIPPED.read_text() == expected


@pytest.fixture
def old_botocore(tmp_path):
    """A botocore session whose EC2 model lacks DescribeInstanceTopology, as 1.29's does: the current
    model with the operation taken out, found first on the loader's path."""
    model = _model()
    del model["operations"]["DescribeInstanceTopology"]
    old = tmp_path / "old" / SERVICE / API_VERSION
    old.mkdir(parents=True)
    (old / "service-2.json").write_text(json.dumps(model))

    new_session = botocore.session.get_session

    def session(*extra: str):
        found = new_session()
        builtin = Loader().search_paths  # endpoints, partitions, retry settings
        found.register_component("data_loader", Loader(extra_search_paths=[str(tmp_path / "old"), *builtin]))
        for path in extra:
            found.get_component("data_loader").search_paths.append(path)
        return found

    return session


def _client(session, moto):
    return boto3.session.Session(botocore_session=session).client(
        "ec2", region_name=REGION, endpoint_url=moto.url, aws_access_key_id="testing", aws_secret_access_key="testing"
    )


def test_an_old_botocore_with_the_extras_asks_ec2_where_instances_hang(old_botocore, moto, network, monkeypatch):
    assert not hasattr(_client(old_botocore(), moto), "describe_instance_topology")  # the head's botocore, bare
    module = programs.power_program(monkeypatch, moto.topology_file.parent / "power-state.json")
    monkeypatch.setattr(botocore.session, "get_session", lambda: old_botocore())
    # The program's own session: the old model plus the extras it installs beside its package.
    client = _client(module.aws.botocore_session(), moto)
    assert str(module.aws.BOTOCORE_DATA) == str(SHIPPED.parents[2])
    ec2 = moto.ec2()
    launched = ec2.run_instances(
        ImageId=network.ami_id, InstanceType="p5.48xlarge", MinCount=2, MaxCount=2, SubnetId=network.subnet_id
    )["Instances"]
    ids = [i["InstanceId"] for i in launched]
    try:
        answer = client.describe_instance_topology(InstanceIds=ids)["Instances"]
        assert sorted(i["InstanceId"] for i in answer) == sorted(ids)
        assert all(len(i["NetworkNodes"]) == 3 and i["InstanceType"] == "p5.48xlarge" for i in answer), answer
        # What the program's backend reads from it: name -> its network nodes, top first.
        config = {
            "provider": "aws",
            "capacity_cooldown": 60,
            "aws": {"cluster": "x", "groups": {}, "capacity_errors": []},
        }
        backend = module.aws.AwsBackend(config, client=client)
        paths = backend.network_paths({"p5-1": ids[0], "p5-2": ids[1]})
        assert paths == {
            f"p5-{n}": i["NetworkNodes"]
            for n, i in enumerate(sorted(answer, key=lambda i: ids.index(i["InstanceId"])), 1)
        }
    finally:
        ec2.terminate_instances(InstanceIds=ids)
