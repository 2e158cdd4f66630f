import os
from pathlib import Path

import pytest
import suite

# The shared helpers assert too: rewritten like test modules, their failures show the values they saw.
pytest.register_assert_rewrite("azuretwintest", "clitest", "imagetest", "nodeshell", "programs", "twintest")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo() -> Path:
    return REPO


def pytest_collection_modifyitems(items):
    """A test that ends a cluster or twin the run shares (marked ends_shared_cluster) runs after every
    other test of the run, whichever module it is in; the node-less modules of suite.SLOW_FIRST lead
    the rest (the order within a module stays)."""
    rank = {module: i for i, module in enumerate(suite.SLOW_FIRST)}
    items.sort(
        key=lambda item: (
            item.get_closest_marker("ends_shared_cluster") is not None,
            rank.get(item.nodeid.split("::", 1)[0], len(rank)),
        )
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CLUSTERBAKE_REQUIRE_INTEGRATION (CI, `bash .ci/run`) a skipped test is a failure: a check
    that did not run (a tool or module missing, not root) must not pass as one that did."""
    report = (yield).get_result()
    if not report.skipped or hasattr(report, "wasxfail") or not os.environ.get("CLUSTERBAKE_REQUIRE_INTEGRATION"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (
        f"skipped ({reason.removeprefix('Skipped: ')}), and this run requires every test to run"
        " (CLUSTERBAKE_REQUIRE_INTEGRATION)"
    )
