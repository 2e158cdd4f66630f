"""tests/conftest.py: under CLUSTERBAKE_REQUIRE_INTEGRATION (CI) a skipped test fails the run; without
it, a skip stays a skip. A real pytest run of a module that skips, under the suite's conftest.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

UNIT = Path(__file__).resolve().parent
SKIPPING = """
import pytest

def test_that_cannot_run_here():
    pytest.skip("no such tool on this machine")

@pytest.mark.xfail(reason="known", strict=True)
def test_a_known_failure():
    assert False
"""


def _run(tmp: Path, require: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CLUSTERBAKE_REQUIRE_INTEGRATION"}
    if require:
        env["CLUSTERBAKE_REQUIRE_INTEGRATION"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(tmp)],
        cwd=UNIT.parents[1], env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_skip_fails_a_run_that_requires_every_test_and_stays_a_skip_otherwise():
    # Under tests/ (so that tests/conftest.py applies), made and removed here: no other run collects it.
    tmp = UNIT / f"skipping_{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        (tmp / "test_skipping.py").write_text(SKIPPING)
        required = _run(tmp, require=True)
        assert required.returncode == 1, required.stdout
        assert "1 failed, 1 xfailed" in required.stdout
        assert "skipped (no such tool on this machine), and this run requires every test to run" in required.stdout
        relaxed = _run(tmp, require=False)
        assert relaxed.returncode == 0, relaxed.stdout
        assert "1 skipped, 1 xfailed" in relaxed.stdout
    finally:
        shutil.rmtree(tmp)
