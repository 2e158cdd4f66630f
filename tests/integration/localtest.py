"""Helpers of the integration tests: the real CLI and commands on nodes of a test cluster.

(A module of its own, not conftest.py: several test directories have a conftest.py,
and `from conftest import ...` would find whichever was imported first.)
"""

import functools
import os
import subprocess
from pathlib import Path

from nodeshell import run_on

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


def up_for_the_module(config: Path):
    """A module fixture's body: `cluster up` of `config`, the module's tests, `cluster down`."""
    cb("cluster", "up", config=config, timeout=600)
    yield
    cb("cluster", "down", config=config, timeout=300)


@functools.cache
def _provider(config: str):
    from clusterbake.config import load_config
    from clusterbake.providers import get_provider

    return get_provider(load_config(Path(config)))


def on(node, command, config=CONFIG, **kwargs):
    """A shell command on a node of a test cluster (nodeshell: as `clusterbake ssh` runs it, over a
    connection kept open); kwargs: check, timeout, input."""
    return run_on(_provider(str(config)).endpoint(node), command, **kwargs)
