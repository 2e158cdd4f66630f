"""Findings 3, 11 and 16 at the CLI's side of `job submit` / `job report`: what reaches a root shell
line on the head is checked first, and a job never runs as root by accident."""

from __future__ import annotations

import shlex

import pytest

from clusterbake import jobs
from clusterbake.config import ClusterConfig
from clusterbake.errors import ConfigError


def config(users: list[dict]) -> ClusterConfig:
    return ClusterConfig.model_validate(
        {"cluster_name": "t", "node_groups": [{"name": "cpu", "count": 1}], "users": users}
    )


def test_a_config_without_users_needs_root_asked_for_by_name():
    with pytest.raises(ConfigError, match="--user root"):
        jobs.job_user(config([]), None)
    assert jobs.job_user(config([]), "root") == "root"
    assert jobs.job_user(config([{"name": "ada", "uid": 2001}]), None) == "ada"


@pytest.mark.parametrize("job_id", ["1;touch /tmp/x", "$(id)", "12 13", "", "-1", "12_x"])
def test_a_job_id_that_is_not_one_never_reaches_the_head(job_id):
    class NoHead:
        def run(self, *args, **kwargs):
            raise AssertionError("a command reached the head")

    with pytest.raises(ConfigError, match="job id"):
        jobs.job_state(NoHead(), job_id)


@pytest.mark.parametrize("name", ["../../etc/x", "a/b", ".hidden", "a b", "x;id", "", "-rf"])
def test_job_names_and_upload_names_are_file_names_only(name):
    assert not jobs.SAFE_NAME.match(name)


def test_commands_as_the_job_user_are_one_quoted_argv():
    line = jobs.as_user("ada", 'cat > "$2.sbatch"', "name; rm -rf /")
    argv = shlex.split(line)
    assert argv[:6] == ["runuser", "-u", "ada", "--", "sh", "-c"]
    assert argv[7:] == ["sh", "/shared/jobs/ada", "name; rm -rf /"]  # data, never shell text
    assert argv[6].startswith('d=$1; if [ ! -d "$d" ] || [ -L "$d" ] || [ ! -O "$d" ]')
