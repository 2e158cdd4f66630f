"""The operator's custom role (`clusterbake permissions`, providers/azure/permissions.py) against the product
(issue 31): the ARM twin records the action of every request the controller makes (linked actions too), all
of which the role allows; then, with the controller held to its role assignments like any principal, an
operator with only this role brings a cluster up and down, and one action fewer is refused."""

from __future__ import annotations

import json
import uuid

import pytest
from azuretest import example_config, needs_sdk, run_cb, storage_subnet
from clitest import CLUSTER_LIFE, write_config

from clusterbake.config import load_config
from clusterbake.providers.azure import permissions

pytestmark = needs_sdk


def _config(twin, name: str, prefix: str) -> dict:
    config = example_config(twin, cluster_name=name)
    config["azure"] |= {"resource_group": f"{name}-rg", "subnet_id": storage_subnet(twin, f"{name}-nodes", prefix)}
    config["node_groups"].append({"name": "burst", "min_count": 0, "max_count": 2, "instance_type": "Standard_D4s_v5"})
    config["storage"] = [
        {"name": "home", "mount_point": "/home", "type": "azure_files"},
        {"name": "data", "mount_point": "/data", "type": "azure_blob"},
    ]
    return config


def _controller(twin, restricted: bool | None = None) -> dict:
    status, body, _ = twin.request("GET" if restricted is None else "PUT", "/_twin/controller",
                                   None if restricted is None else {"restricted": restricted})  # fmt: skip
    assert status == 200, body
    return body


def test_every_action_of_a_clusters_life_is_in_the_printed_role(own_twin, tmp_path):
    config = _config(own_twin, "azperm", "10.70.61.0/24")
    _controller(own_twin, restricted=False)  # a new record
    for args in CLUSTER_LIFE:
        run_cb(own_twin, tmp_path, config, *args, timeout=300)
    actions = _controller(own_twin)["actions"]
    role = json.loads(run_cb(own_twin, tmp_path, config, "permissions").stdout)
    assert role == permissions.role_definition(load_config(write_config(tmp_path, config)))
    assert len(actions) > 30, actions  # the record saw the life, not nothing
    assert [a for a in actions if not permissions.allowed(role, a)] == []


def _assign(twin, role: dict) -> None:
    """The role at the subscription for the controller, made by the subscription's owner (the controller
    before it is restricted)."""
    scope = f"/subscriptions/{twin.subscription}"
    token = twin.token()
    guid = str(uuid.uuid4())
    body = {"properties": {"roleName": f"{role['Name']} {guid[:4]}", "description": role["Description"],
                           "type": "CustomRole", "permissions": [{"actions": role["Actions"], "notActions": []}],
                           "assignableScopes": role["AssignableScopes"]}}  # fmt: skip
    status, made, _ = twin.request(
        "PUT", f"{scope}/providers/Microsoft.Authorization/roleDefinitions/{guid}?api-version=2022-04-01", body, token
    )
    assert status in (200, 201), made
    assignment = {"properties": {"roleDefinitionId": made["id"], "principalId": _controller(twin)["object_id"],
                                 "principalType": "ServicePrincipal"}}  # fmt: skip
    status, done, _ = twin.request(
        "PUT",
        f"{scope}/providers/Microsoft.Authorization/roleAssignments/{uuid.uuid4()}?api-version=2022-04-01",
        assignment,
        token,
    )
    assert status in (200, 201), done


@pytest.mark.parametrize("without", [None, "Microsoft.Compute/virtualMachines/write"])
def test_an_operator_held_to_the_printed_role_brings_a_cluster_up_and_down(own_twin, tmp_path, without):
    """The whole role: up, status, down. Without VM writes: `cluster up` refused, naming the action."""
    config = _config(own_twin, "azheld", "10.70.62.0/24")
    role = permissions.role_definition(load_config(write_config(tmp_path, config)))
    role["Actions"] = [a for a in role["Actions"] if a != without]
    _assign(own_twin, role)
    _controller(own_twin, restricted=True)
    try:
        if without is None:
            for args in (("cluster", "up", "--provision-only"), ("cluster", "status"), ("cluster", "down")):
                run_cb(own_twin, tmp_path, config, *args, timeout=300)
            return
        refused = run_cb(own_twin, tmp_path, config, "cluster", "up", "--provision-only", check=False, timeout=300)
        assert refused.returncode != 0 and "AuthorizationFailed" in refused.stderr, refused.stderr[-3000:]
        assert f"'{without}'" in refused.stderr and "Traceback" not in refused.stderr
    finally:
        _controller(own_twin, restricted=False)
    run_cb(own_twin, tmp_path, config, "cluster", "down", timeout=300)
