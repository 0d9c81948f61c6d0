"""``graft.results.cell_summary``, ``pooled_agreement`` and ``multicell_summary`` on tables
made by hand: exact estimates agree everywhere, flipped or shuffled ones do not, a partly
verified group has no top-k overlap, cells pooled across groups are scored as one group, and
the multi-cell errors are the ones written in; the Pearson's bootstrap interval resamples
whole prompts."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from graft.errors import StatsError
from graft.results import (
    MIN_INTERVAL_PROMPTS,
    cell_summary,
    multicell_summary,
    pearson_interval,
    pooled_agreement,
)


def _table(n_layers: int = 8, prompts: int = 2) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    rows = [
        {"prompt": p, "layer": ly, "unit": u, "kind": k, "estimate": float(rng.normal())}
        for p in range(prompts)
        for ly in range(n_layers)
        for u in ("FE", "LT")
        for k in ("o", "mlp")
    ]
    return pl.DataFrame(rows)


def test_exact_estimates_agree_everywhere():
    table = _table()
    summary = cell_summary(table, table.with_columns(real=pl.col("estimate")), top_k=3)
    assert summary.select("unit", "kind").rows() == [
        ("FE", "o"),
        ("FE", "mlp"),
        ("LT", "o"),
        ("LT", "mlp"),
        ("all", "o"),
        ("all", "mlp"),
    ]
    assert summary["cells"].to_list() == [16] * 4 + [32] * 2
    assert np.allclose(summary["pearson"], 1) and np.allclose(summary["sign_agreement"], 1)
    assert np.allclose(summary["top_k_overlap"], 1) and summary["meets_bar"].all()


def test_wrong_estimates_fail():
    table = _table()
    flipped = cell_summary(table, table.with_columns(real=-pl.col("estimate")))
    assert np.allclose(flipped["pearson"], -1) and np.allclose(flipped["sign_agreement"], 0)
    assert not flipped["meets_bar"].any()
    rng = np.random.default_rng(1)
    shuffled = table.with_columns(real=pl.Series(rng.permutation(table["estimate"].to_numpy())))
    summary = cell_summary(table, shuffled, top_k=3)
    assert (summary["pearson"].abs() < 0.6).all() and not summary["meets_bar"].any()
    assert (summary["top_k_overlap"] < 1).all()


def test_sign_agreement_counts_only_the_moving_cells():
    table = _table(prompts=1).filter(pl.col("unit") == "LT", pl.col("kind") == "o")
    real = table["estimate"].to_numpy().copy()
    small = int(np.argmin(np.abs(real)))
    real[small] = -np.sign(real[small]) * 1e-4 * np.abs(real).max()  # wrong sign, tiny effect
    summary = cell_summary(table, table.with_columns(real=pl.Series(real)))
    row = summary.row(0, named=True)
    assert row["sign_agreement"] == 1.0 and row["moving"] == len(table) - 1


def test_partly_verified_groups_have_no_overlap_and_no_checked_means_no_columns():
    table = _table()
    checked = table.head(5).with_columns(real=pl.col("estimate"))
    summary = cell_summary(table, checked)
    assert summary["top_k_overlap"].is_null().all()
    assert summary.filter(pl.col("unit") == "FE", pl.col("kind") == "o")["verified"][0] == 2
    plain = cell_summary(table)
    assert "pearson" not in plain.columns
    means = table.group_by("unit", "kind", maintain_order=True).agg(pl.col("estimate").mean())
    assert plain.head(4)["mean_estimate"].to_list() == pytest.approx(means["estimate"].to_list())


def test_multicell_summary():
    multi = pl.DataFrame(
        {
            "set": ["layer", "layer", "layer", "FE"],
            "estimate": [1.0, 2.0, -1.0, 0.5],
            "real": [2.0, 2.0, -0.5, -1.0],
        }
    )
    summary = multicell_summary(multi)
    assert summary["set"].to_list() == ["layer", "FE"]
    layer = summary.row(0, named=True)
    assert layer["grafts"] == 3 and layer["mean_abs_error"] == pytest.approx(0.5)
    assert layer["median_relative_error"] == pytest.approx(0.5)  # of 0.5, 0, 1
    assert layer["sign_agreement"] == 1.0
    assert layer["pearson"] == pytest.approx(0.9449112, abs=1e-6)  # of [1, 2, -1] and [2, 2, -0.5]
    fe = summary.row(1, named=True)
    assert fe["sign_agreement"] == 0.0 and fe["pearson"] is None
    assert fe["median_relative_error"] == pytest.approx(1.5)


def test_pooled_agreement_scores_every_cell_as_one_group():
    table = _table()
    checked = table.with_columns(real=pl.col("estimate"))
    pooled = pooled_agreement(checked)
    assert pooled["cells"] == 64 and pooled["meets_bar"]
    assert np.isclose(pooled["pearson"], 1) and pooled["sign_agreement"] == 1
    # one group pooled is that group's row of cell_summary
    one = checked.filter((pl.col("unit") == "FE") & (pl.col("kind") == "o"))
    row = cell_summary(table, checked).row(0, named=True)
    assert {k: pooled_agreement(one)[k] for k in ("pearson", "moving")} == {
        "pearson": row["pearson"],
        "moving": row["moving"],
    }
    # pooled is not the mean of the groups: LT's estimates scaled by 10 keep every group's
    # Pearson at 1 but bend the pooled line
    bent = checked.with_columns(
        estimate=pl.when(pl.col("unit") == "LT")
        .then(pl.col("estimate") * 10)
        .otherwise(pl.col("estimate"))
    )
    assert np.allclose(cell_summary(table, bent)["pearson"].head(4), 1)
    assert pooled_agreement(bent)["pearson"] < 0.95 and not pooled_agreement(bent)["meets_bar"]
    flipped = checked.with_columns(estimate=-pl.col("estimate"))
    assert pooled_agreement(flipped)["sign_agreement"] == 0


def test_pearson_interval_resamples_prompts():
    table = _table(prompts=12)
    rng = np.random.default_rng(1)
    noisy = table.with_columns(real=pl.col("estimate") + rng.normal(0, 0.5, table.height))
    pearson = pooled_agreement(noisy)["pearson"]
    low, high = pearson_interval(noisy)
    assert low < pearson < high < 1 and high - low < 0.3
    assert pearson_interval(noisy) == (low, high)  # seeded
    # one prompt whose estimates are far off: every resample that draws it bends the line,
    # so the interval widens far more than for the cells taken one by one (the prompt is
    # the sample, not the cell)
    bent = noisy.with_columns(
        estimate=pl.when(pl.col("prompt") == 0)
        .then(-pl.col("real") * 4)
        .otherwise(pl.col("estimate"))
    )
    b_low, b_high = pearson_interval(bent)
    assert b_high - b_low > 2 * (high - low)
    exact = table.with_columns(real=pl.col("estimate"))
    assert np.allclose(pearson_interval(exact), 1)
    with pytest.raises(StatsError, match="two prompts"):
        pearson_interval(noisy.filter(pl.col("prompt") == 0))
    with pytest.raises(StatsError, match="undefined"):
        pearson_interval(noisy.with_columns(estimate=pl.lit(1.0)))


def test_cell_summary_gives_the_interval_from_ten_prompts_on():
    rng = np.random.default_rng(2)
    many = _table(prompts=12)
    checked = many.with_columns(real=pl.col("estimate") + rng.normal(0, 0.5, many.height))
    summary = cell_summary(many, checked)
    for row in summary.iter_rows(named=True):
        rows = checked.filter(pl.col("kind") == row["kind"])
        rows = rows if row["unit"] == "all" else rows.filter(pl.col("unit") == row["unit"])
        assert (row["pearson_low"], row["pearson_high"]) == pearson_interval(rows)
        assert row["pearson_low"] < row["pearson"] < row["pearson_high"]
    few = _table(prompts=MIN_INTERVAL_PROMPTS - 1)
    plain = cell_summary(few, few.with_columns(real=pl.col("estimate") * 2))
    assert plain["pearson_low"].is_null().all() and plain["pearson_high"].is_null().all()
