from pathlib import Path

import pytest

# The shared helpers assert too: rewritten like test modules, their failures show the values they saw.
pytest.register_assert_rewrite("azuretwintest", "clitest", "imagetest", "nodeshell", "programs", "twintest")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo() -> Path:
    return REPO


def pytest_collection_modifyitems(items):
    """A test that ends a cluster or twin the run shares (marked ends_shared_cluster) runs after every
    other test of the run, whichever module it is in."""
    items.sort(key=lambda item: item.get_closest_marker("ends_shared_cluster") is not None)
