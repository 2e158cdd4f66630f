"""The Azure twin as a real HTTPS server process for the azure provider's tests.

The tests that drive the SDK need the Azure SDK packages (azure-mgmt-*,
azure-keyvault-secrets, azure-identity) and skip without them (`needs_sdk`). The twin runs as
`python -m clusterbake.twins.azure.arm` on free ports of 127.0.0.1; the code under test
(CLI and inventory subprocesses, or in-process calls under `twin.sdk_env()`) reaches it
only through the standard Azure/requests environment the twin prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azuretest import LOCATION, NET_GROUP, SUBNET, SUBNET_PREFIX, VNET, Twin, arm_twin


def make_network(twin: Twin) -> str:
    """The existing network a cluster runs in (not clusterbake's): a resource group, a virtual network
    and a subnet, created with the SDK. Returns the subnet id."""
    from azure.identity import DefaultAzureCredential
    from azure.mgmt.network import NetworkManagementClient
    from azure.mgmt.resource.resources import ResourceManagementClient

    with twin.sdk_env():
        credential = DefaultAzureCredential()
        resources = ResourceManagementClient(credential, twin.subscription, base_url=twin.url)
        resources.resource_groups.create_or_update(NET_GROUP, {"location": LOCATION})
        network = NetworkManagementClient(credential, twin.subscription, base_url=twin.url)
        vnet = network.virtual_networks.begin_create_or_update(
            NET_GROUP,
            VNET,
            {
                "location": LOCATION,
                "properties": {
                    "addressSpace": {"addressPrefixes": ["10.70.0.0/16"]},
                    "subnets": [
                        {"name": SUBNET, "properties": {"addressPrefix": SUBNET_PREFIX}},
                        {"name": "tiny", "properties": {"addressPrefix": "10.70.9.0/29"}},
                    ],
                },
            },
        ).result()
        network.virtual_networks.begin_create_or_update(
            NET_GROUP,
            "west-vnet",
            {
                "location": "westeurope",
                "properties": {
                    "addressSpace": {"addressPrefixes": ["10.80.0.0/16"]},
                    "subnets": [{"name": SUBNET, "properties": {"addressPrefix": "10.80.0.0/24"}}],
                },
            },
        ).result()
        return next(s.id for s in vnet.subnets if s.name == SUBNET)


@pytest.fixture(scope="session")
def twin(tmp_path_factory) -> Iterator[Twin]:
    """The twin most tests share, with the existing network in place."""
    with arm_twin(tmp_path_factory.mktemp("azure-twin")) as server:
        make_network(server)
        yield server


@pytest.fixture
def own_twin(tmp_path_factory) -> Iterator[Twin]:
    """A twin of its own (for tests that change capacity or quota)."""
    with arm_twin(tmp_path_factory.mktemp("azure-own")) as server:
        make_network(server)
        yield server
