"""The scaling sweep's arithmetic, table and plot (the jobs themselves run in
tests/integration/test_training.py)."""

from __future__ import annotations

import pytest

from clusterbake.errors import ConfigError
from clusterbake.sweep import Point, parse_sizes, plot, score, table


def _points() -> list[Point]:
    return score(
        [
            Point(1, "11", "COMPLETED", 4, 1000.0),
            Point(2, "12", "COMPLETED", 8, 1800.0),
            Point(4, "13", "COMPLETED", 16, 2400.0),
            Point(8, "14", "FAILED", None, None),
        ]
    )


def test_efficiency_is_per_node_throughput_against_the_smallest_size():
    one, two, four, eight = _points()
    assert (one.speedup, one.efficiency) == (1.0, 1.0)
    assert two.per_rank == 225.0 and two.speedup == 1.8 and two.efficiency == pytest.approx(0.9)
    assert four.efficiency == pytest.approx(0.6)
    assert eight.efficiency is None


def test_the_table_flags_sizes_under_70_percent_and_says_what_local_nodes_share():
    text = table(_points(), "local")
    rows = text.splitlines()
    assert rows[2].split()[:6] == ["2", "8", "1,800", "225", "1.80x", "90%"] and "70%" not in rows[2]
    assert rows[3].endswith("< 70%: more nodes do not pay here") and " 60% " in rows[3]
    assert rows[4].split() == ["8", "-", "-", "-", "-", "-", "14", "FAILED"]
    assert rows[5].startswith("note: local nodes share this one machine's CPUs")
    assert "note:" not in table(_points(), "aws")


def test_the_plot_is_a_png(tmp_path):
    plot(_points(), tmp_path / "sweep.png", "test")
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("text", "message"), [("1,x", "not a list"), ("0,2", "of 1 or more"), ("1,16", "has 8")])
def test_bad_sizes_are_refused(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_sizes(text, 8)
    assert parse_sizes("4,1,2,2", 8) == [1, 2, 4]
