"""Helpers of the integration tests: the real CLI and commands on nodes of a test cluster.

(A module of its own, not conftest.py: several test directories have a conftest.py,
and `from conftest import ...` would find whichever was imported first.)
"""

import os
import subprocess
from pathlib import Path

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
