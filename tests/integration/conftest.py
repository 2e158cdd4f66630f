"""Integration tests run the real thing: packer, nspawn nodes, Ansible, Slurm, munge.

They need root and the host packages `make deps` installs; `make test` (and CI)
provide both. The image is built once per session (or reused when its inputs are
unchanged) and shared with `make image`.
"""

import os

import pytest
from directory import DirectoryServer, Person
from localtest import CONFIG, cb, run
from timetable import boots_cluster

# The shared cluster's directory users (cluster.yaml's `directory`): dana of the cluster's group, eve not.
DIRECTORY_PEOPLE = (("dana", 5001, True), ("eve", 5002, False))


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
def directory():
    """The shared cluster's directory server (tests/integration/directory.py) on its bridge's host address,
    up before the cluster and for as long; each person's SSH key beside it (keys/<name>)."""
    import yaml

    settings = yaml.safe_load(CONFIG.read_text())["directory"]
    address = settings["uri"].split("//")[1].split(":")[0]
    server = DirectoryServer(address)
    keys = server.root.parent / "directory-keys"
    run(["rm", "-rf", str(keys)])
    keys.mkdir(parents=True, mode=0o700)
    people = []
    for name, uid, member in DIRECTORY_PEOPLE:
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(keys / name)])
        people.append(Person(name, uid, (keys / f"{name}.pub").read_text().strip(), member))
    server.start(people)
    server.keys = keys
    yield server
    server.stop()
    run(["rm", "-rf", str(keys)])


@pytest.fixture(scope="session")
@boots_cluster("local 1+2 (cluster.yaml)")
def cluster(image, directory):
    """The suite's local cluster, shared by the modules that read it (each test leaves it as it found
    it); the test that ends it runs last (`ends_shared_cluster`). Its users: the config's, and the
    directory's (the `directory` server, up first)."""
    result = run(["make", "cluster", f"CONFIG={CONFIG}"], timeout=600)
    yield result
    run(["make", "destroy", f"CONFIG={CONFIG}"], timeout=300)
