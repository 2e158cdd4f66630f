"""Integration tests run the real thing: packer, nspawn nodes, Ansible, Slurm, munge.

They need root and the host packages `make deps` installs; `make test` (and CI)
provide both. The image is built once per session (or reused when its inputs are
unchanged) and shared with `make image`.
"""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "tests" / "integration" / "cluster.yaml"
CB = [str(REPO / ".venv" / "bin" / "clusterbake")]


def run(argv, check=True, timeout=900, env=None, **kwargs):
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})}, **kwargs
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, argv))} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
            f"\n--- stderr\n{result.stderr[-6000:]}"
        )
    return result


def cb(*args, config=CONFIG, **kwargs):
    return run([*CB, "--config", str(config), *args], **kwargs)


def on(node, command, config=CONFIG, **kwargs):
    """Run a shell command on a node of a test cluster (via `clusterbake ssh`)."""
    return cb("ssh", node, "--", command, config=config, **kwargs)


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


@pytest.fixture(scope="module")
def cluster(image):
    result = run(["make", "cluster", f"CONFIG={CONFIG}"], timeout=600)
    yield result
    run(["make", "destroy", f"CONFIG={CONFIG}"], timeout=300)
