"""The summary table as the console shows it (:func:`format_summary`): rounded, its group
column named only when a graft has a group."""

from __future__ import annotations

import polars as pl

from graft.study.running.summaries import format_summary


def _summary(groups: list[str]) -> pl.DataFrame:
    n = len(groups)
    return pl.DataFrame(
        {
            "group": groups,
            "graft": [f"G{i}" for i in range(n)],
            "template": ["headline"] * n,
            "acc@5": [1 / 3] * n,
            "acc@5_lo": [0.0] * n,
            "acc@5_hi": [0.561497] * n,
            "n": [3] * n,
        }
    )


def test_values_are_rounded_and_an_empty_group_column_is_left_out():
    text = format_summary(_summary(["", ""]))
    assert "0.561 " in text and "0.333 " in text and "0.000 " in text
    assert "0.561497" not in text and "0.3333" not in text
    assert "group" not in text
    assert "0.561497" in format_summary(_summary(["", ""]), digits=None)  # as stored


def test_groups_are_named_and_a_graft_of_none_shows_a_dash():
    lines = format_summary(_summary(["late layers", ""])).splitlines()
    assert "group" in lines[1]
    row = next(line for line in lines if "G1" in line)
    assert row.split()[1] == "-"
    assert any("late layers" in line for line in lines)
