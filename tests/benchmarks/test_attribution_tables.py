"""The attribution generators of ``benchmarks.results_tables`` on tables made by hand: one
markdown row per summary row with its numbers, the Pearson's interval over prompts (a dash
under 10 prompts), the bar as written, and a summary without real grafts refused."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from benchmarks import attribution_tables, table_generators
from benchmarks.table_generators import GENERATORS, BlockError
from graft.results import pearson_interval

assert attribution_tables  # its import registers the generators


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setattr(table_generators, "ROOT", tmp_path)
    (tmp_path / "res").mkdir()
    return tmp_path / "res"


def _make(name: str, folder) -> str:
    text, files = GENERATORS[name].make(["res"], {})
    assert files and all(f.parent == folder for f in files)
    return text


def test_agreement_table(folder):
    pl.DataFrame(
        {
            "unit": ["FE", "LT", "all"],
            "kind": ["v", "v", "v"],
            "cells": [90, 6, 96],
            "verified": [90, 6, 96],
            "pearson": [0.9351, 0.99, 0.97],
            "sign_agreement": [1.0, 1.0, 0.96],
            "moving": [54, 6, 55],
            "top_k_overlap": [0.7333, None, None],
            "top_k": [5, 5, 5],
            "meets_bar": [False, True, True],
        }
    ).write_csv(folder / "attribution_summary.csv")
    # FE's cells come from 15 prompts (an interval), LT's from 2 (none: under 10 prompts)
    rng = np.random.default_rng(0)
    rows = [("FE", p, layer) for p in range(15) for layer in range(6)]
    rows += [("LT", p, layer) for p in range(2) for layer in range(3)]
    real = rng.normal(size=len(rows))
    verify = pl.DataFrame(
        {
            "prompt": [p for _, p, _ in rows],
            "layer": [layer for _, _, layer in rows],
            "unit": [u for u, _, _ in rows],
            "kind": ["v"] * len(rows),
            "estimate": real + rng.normal(0, 0.3, len(rows)),
            "real": real,
        }
    )
    verify.write_csv(folder / "attribution_verify.csv")
    fe = "{:.3f}-{:.3f}".format(*pearson_interval(verify.filter(pl.col("unit") == "FE")))
    every = "{:.3f}-{:.3f}".format(*pearson_interval(verify))
    lines = _make("attribution", folder).splitlines()
    assert lines[0].startswith("| unit | kind | cells | Pearson | 95% interval over prompts |")
    assert lines[2] == f"| FE | v | 90 | 0.935 | {fe} | 1.00 (54) | 0.73 | **no** |"
    assert lines[3] == "| LT | v | 6 | 0.990 | — | 1.00 (6) | — | yes |"
    assert lines[4] == f"| all | v | 96 | 0.970 | {every} | 0.96 (55) | — | yes |"


def test_a_summary_without_real_grafts_is_refused(folder):
    pl.DataFrame({"unit": ["LT"], "kind": ["o"], "cells": [4]}).write_csv(
        folder / "attribution_summary.csv"
    )
    with pytest.raises(BlockError, match="--verify all"):
        _make("attribution", folder)


def test_multicell_and_cost_tables(folder):
    pl.DataFrame(
        {
            "set": ["layer", "FE+LT"],
            "grafts": [90, 3],
            "mean_estimate": [2.178, 12.61],
            "mean_real": [0.709, 6.79],
            "mean_abs_error": [1.529, 5.82],
            "median_relative_error": [0.217, 0.775],
            "pearson": [0.622, None],
            "sign_agreement": [0.93, 1.0],
        }
    ).write_csv(folder / "attribution_multicell_summary.csv")
    lines = _make("attribution-multicell", folder).splitlines()
    assert lines[2].startswith("| one whole layer (`ALL:l:attn,mlp`) | 90 | +2.178 | +0.709 |")
    assert lines[3] == "| `FE+LT:all:attn,mlp` | 3 | +12.610 | +6.790 | 5.820 | 0.78 | — | 1.00 |"
    row = {"model": "m", "prompts": 3, "cells_per_prompt": 420, "attribution_s": 30.9}
    row |= {"attribution_forwards": 4.13, "real_all_cells_s_scaled": 1081.2}
    row |= {"real_sample_cells": 120, "real_per_cell_s": 0.8581, "ratio": 35.0}
    row |= {"real_sweep_s": 402.46, "sweep_ratio": 13.0}
    pl.DataFrame([row]).write_csv(folder / "attribution_cost.csv")
    lines = _make("attribution-cost", folder).splitlines()
    assert lines[2] == (
        "| m | 3 x 420 | 30.9 s (4.13 forwards) | 402.5 s (13x) | 1081 s (from 120 cells, 0.858 "
        "s each; 35x) |"
    )
