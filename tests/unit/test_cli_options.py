"""The command line's option placement: -c/--config before or after the subcommand."""

from __future__ import annotations

import pytest

from clusterbake.cli import build_parser


@pytest.mark.parametrize(
    ("argv", "config"),
    [
        (["-c", "a.yaml", "validate"], "a.yaml"),
        (["validate", "--config", "b.yaml"], "b.yaml"),
        (["cluster", "up", "-c", "c.yaml", "--reconfigure"], "c.yaml"),
        (["--config", "outer.yaml", "job", "submit", "deepspeed", "--config", "inner.yaml"], "inner.yaml"),
        (["twin", "status", "azure"], None),
    ],
)
def test_config_is_taken_before_or_after_the_subcommand(argv, config):
    assert build_parser().parse_args(argv).config == config


def test_a_config_option_without_its_file_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["validate", "--config"])
    assert exit_info.value.code == 2
    assert "argument -c/--config: expected one argument" in capsys.readouterr().err
