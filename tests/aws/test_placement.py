"""Placement group calls, with botocore's Stubber.

moto 5.2.5 answers CreatePlacementGroup, DescribePlacementGroups and
DeletePlacementGroup with "not implemented", so these exact requests are checked
here against botocore's EC2 model with a Stubber (the end-to-end tests run them
against the small placement-group addition in moto_ec2_server.py).
"""

from __future__ import annotations

import pytest
from botocore.stub import Stubber
from stubbed import ec2_client

from clusterbake.errors import ClusterbakeError
from clusterbake.providers.aws import placement

NAME = "clusterbake-p5demo-gpu"
BY_NAME = {"Filters": [{"Name": "group-name", "Values": [NAME]}]}
TAGS = [{"Key": "clusterbake:cluster", "Value": "p5demo"}]


def _group(tags=TAGS, strategy="cluster"):
    return {
        "GroupName": NAME,
        "GroupId": "pg-0123456789abcdef0",
        "Strategy": strategy,
        "State": "available",
        "Tags": tags,
    }


def test_ensure_creates_a_tagged_cluster_group_when_missing():
    client = ec2_client()
    with Stubber(client) as stub:
        stub.add_response("describe_placement_groups", {"PlacementGroups": []}, BY_NAME)
        stub.add_response(
            "create_placement_group",
            {"PlacementGroup": _group()},
            {
                "GroupName": NAME,
                "Strategy": "cluster",
                "TagSpecifications": [{"ResourceType": "placement-group", "Tags": TAGS}],
            },
        )
        assert placement.ensure(client, NAME, "p5demo") is True
        stub.assert_no_pending_responses()


def test_ensure_reuses_the_clusters_group():
    client = ec2_client()
    with Stubber(client) as stub:
        stub.add_response("describe_placement_groups", {"PlacementGroups": [_group()]}, BY_NAME)
        assert placement.ensure(client, NAME, "p5demo") is False
        stub.assert_no_pending_responses()


@pytest.mark.parametrize(
    ("group", "message"),
    [
        (_group(tags=[]), "is not tagged clusterbake:cluster=p5demo"),
        (_group(strategy="spread"), "has strategy spread, not cluster"),
    ],
)
def test_ensure_refuses_a_group_that_is_not_the_clusters(group, message):
    client = ec2_client()
    with Stubber(client) as stub:
        stub.add_response("describe_placement_groups", {"PlacementGroups": [group]}, BY_NAME)
        with pytest.raises(ClusterbakeError, match=message):
            placement.ensure(client, NAME, "p5demo")


def test_find_by_cluster_tag():
    client = ec2_client()
    with Stubber(client) as stub:
        stub.add_response(
            "describe_placement_groups",
            {"PlacementGroups": [_group()]},
            {"Filters": [{"Name": "tag:clusterbake:cluster", "Values": ["p5demo"]}]},
        )
        assert placement.find(client, "p5demo") == [NAME]


def test_delete_waits_while_terminating_instances_still_use_the_group(monkeypatch):
    sleeps = []
    monkeypatch.setattr("time.sleep", sleeps.append)
    client = ec2_client()
    with Stubber(client) as stub:
        stub.add_client_error("delete_placement_group", "InvalidPlacementGroup.InUse", "in use")
        stub.add_response("delete_placement_group", {}, {"GroupName": NAME})
        placement.delete(client, NAME)
        stub.assert_no_pending_responses()
    assert len(sleeps) == 1
