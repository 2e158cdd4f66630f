"""`clusterbake token`: what it refuses before it asks the head anything."""

import pytest

from clusterbake.config import ClusterConfig
from clusterbake.errors import ConfigError
from clusterbake.rest_api import issue


def config(enabled: bool) -> ClusterConfig:
    return ClusterConfig.model_validate(
        {"cluster_name": "rest", "node_groups": [{"name": "cpu", "count": 1}], "rest_api": {"enabled": enabled}}
    )


class NoHead:
    """A provider that fails the test if asked for the head: every case below is refused before that."""

    def endpoint(self, node):
        raise AssertionError(f"asked for {node}")


@pytest.mark.parametrize(
    "enabled, user, lifespan, message",
    [
        (False, "alice", 3600, "rest_api.enabled is false"),
        (True, "alice; touch /tmp/x", 3600, "is not a user name"),
        (True, "--help", 3600, "is not a user name"),
        (True, "alice", 30, "give 60 to 86400"),
        (True, "alice", 86401, "give 60 to 86400"),
    ],
)
def test_a_token_is_refused_before_the_head_is_asked(enabled, user, lifespan, message):
    with pytest.raises(ConfigError, match=message):
        issue(config(enabled), NoHead(), user, lifespan)


def test_the_rest_api_port_is_an_unprivileged_one():
    with pytest.raises(ValueError, match=r"rest_api\.port"):
        ClusterConfig.model_validate(
            {"cluster_name": "rest", "node_groups": [{"name": "cpu", "count": 1}], "rest_api": {"port": 80}}
        )
