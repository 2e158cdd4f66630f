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
from azuretest import Twin, arm_twin, make_network


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
