"""The EC2 twin's tests: the real CLI against the twin, instances that boot as local nodes.

Needs root (nspawn, network namespaces) and the host packages `make deps` installs;
`make test` and CI provide both. The twin builds its node image on first use (cached
by its inputs, like `make image`). Everything here goes through public surfaces:
`clusterbake` as a subprocess, boto3 against the twin's endpoint with the twin's
credentials, and `nsenter` into a node where a test must look without SSH.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from azuretwintest import AzureTwin, azure_twin_environment
from timetable import boots_cluster
from twintest import CB, CLUSTER, REPO, Twin, host_leftovers, run, twin_environment


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    if os.environ.get("CLUSTERBAKE_REQUIRE_INTEGRATION"):
        raise pytest.UsageError(
            "the twin tests need root, and this run requires them (CLUSTERBAKE_REQUIRE_INTEGRATION)"
        )
    marker = pytest.mark.skip(reason="the twin tests need root (nspawn, netns); run `make test` as root")
    for item in items:
        if "tests/twin" in str(item.fspath):
            item.add_marker(marker)


@pytest.fixture(scope="session")
@boots_cluster("EC2 twin (twin up aws)")
def twin_env(tmp_path_factory):
    env = twin_environment()
    yield env
    run([*CB, "twin", "down", "aws"], timeout=300)
    # `twin down` leaves a clean host: a failure here fails the run (a teardown error).
    assert host_leftovers() == []


@pytest.fixture(scope="session")
def twin_config(tmp_path_factory) -> Path:
    """examples/aws-twin.yaml under the tests' own cluster name, with a second user, and an SSH key of
    the researcher's (`researcher_key` beside the file) in users.0.ssh_authorized_keys."""
    config = yaml.safe_load((REPO / "examples" / "aws-twin.yaml").read_text())
    config["cluster_name"] = CLUSTER
    # A second, untrusted cluster user: the attacker of the security tests (test_aws_twin.py).
    config["users"].append({"name": "mallory", "uid": 2002})
    folder = tmp_path_factory.mktemp("twin")
    key = folder / "researcher_key"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "researcher", "-f", str(key)])
    config["users"][0]["ssh_authorized_keys"] = [key.with_suffix(".pub").read_text().strip()]
    path = folder / "citwin.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture(scope="module")
@boots_cluster("AWS twin 1+2 (aws-twin.yaml)")
def twin(twin_env, twin_config):
    """A cluster on the twin, up for the module's tests; down (and checked empty) after them."""
    twin = Twin(twin_env, twin_config)
    twin.up = twin.cb("cluster", "up", timeout=1200)
    yield twin
    twin.cb("cluster", "down", timeout=600)


@pytest.fixture(scope="session")
@boots_cluster("Azure twin (twin up azure)")
def azure():
    """The Azure twin, up for the whole run: its modules' clusters each have a resource group of their
    own and remove it; `twin down` and a clean host at the end (a failure there fails the run)."""
    twin = AzureTwin(azure_twin_environment())
    yield twin
    run([*CB, "twin", "down", "azure"], timeout=300)
    assert host_leftovers("azure") == []
