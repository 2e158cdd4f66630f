"""Integration tests run the real thing: packer, nspawn nodes, Ansible, Slurm, munge.

They need root and the host packages `make deps` installs; `make test` (and CI)
provide both. The image is built once per session (or reused when its inputs are
unchanged) and shared with `make image`.
"""

import os

import pytest
from localtest import CONFIG, cb, run
from timetable import boots_cluster


def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0 and os.environ.get("CLUSTERBAKE_REQUIRE_INTEGRATION"):
        raise pytest.UsageError("the integration tests need root, and this run requires them (CI)")
    if os.geteuid() != 0:
        marker = pytest.mark.skip(reason="integration tests need root (nspawn, netns, mounts); run `make test` as root")
        for item in items:
            if "integration" in str(item.fspath):
                item.add_marker(marker)


@pytest.fixture(scope="session")
def image():
    """`make image` for the tests' config (a no-op when an image for these inputs exists)."""
    result = cb("image", "build", timeout=1800)
    return result.stderr


@pytest.fixture(scope="session")
@boots_cluster("local 1+2 (cluster.yaml)")
def cluster(image):
    """The suite's local cluster, shared by the modules that read it (each test leaves it as it found
    it); the test that ends it runs last (`ends_shared_cluster`)."""
    result = run(["make", "cluster", f"CONFIG={CONFIG}"], timeout=600)
    yield result
    run(["make", "destroy", f"CONFIG={CONFIG}"], timeout=300)
