"""``benchmarks.attribution_cost`` on a tiny llama: one row whose counts and ratios follow
from its timings (both estimators, the real sweep and the scaled forward-a-cell sample), written with its provenance into a results folder; a count below 1 is refused."""

from __future__ import annotations

import json

import polars as pl
import pytest

from benchmarks.attribution_cost import main


def test_the_row_and_its_provenance(tmp_path, capsys):
    out = tmp_path / "results"
    assert (
        main(["--model", "tiny-llama", "--prompts", "2", "--sample", "5", "--out", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert "scaled from 10 cells" in printed and "x attribution)" in printed
    assert "real sweep, every cell" in printed and "estimator linear" in printed
    row = pl.read_csv(out / "attribution_cost.csv").row(0, named=True)
    assert row["prompts"] == 2 and row["cells_per_prompt"] == 4 * 2 * 7  # layers x units x kinds
    assert row["real_sample_cells"] == 10
    per_cell = row["real_sample_s"] / row["real_sample_cells"]
    assert row["real_per_cell_s"] == pytest.approx(per_cell, abs=1e-4)
    scaled = per_cell * row["cells_per_prompt"] * row["prompts"]
    assert row["real_all_cells_s_scaled"] == pytest.approx(scaled, abs=0.1)
    assert row["ratio"] == pytest.approx(scaled / row["attribution_s"], rel=0.05, abs=0.1)
    sweep = row["real_sweep_s"] / row["attribution_s"]
    assert row["real_sweep_s"] > 0 and row["sweep_ratio"] == pytest.approx(sweep, rel=0.05, abs=0.1)
    assert row["linear_s"] > 0 and row["linear_forwards"] > 0  # ms on a tiny model: rounded
    entry = json.loads((out / "provenance.json").read_text())["benchmarks"]["attribution_cost"]
    assert entry["command"].startswith("python -m benchmarks.attribution_cost --model tiny-llama")
    assert entry["settings"]["sample"] == 5


def test_a_count_below_one_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "tiny-llama", "--sample", "0"])
    assert exit_info.value.code == 2
    assert "--sample must be at least 1" in capsys.readouterr().err
