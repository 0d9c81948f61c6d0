"""Whole-name metrics in graft.results.metrics: the per-example columns and their summary."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from graft.results.metrics import name_metrics_frame
from graft.results.summary import bootstrap_ci, summarize


def table(exact: list[bool], logprob: list[float]) -> pl.DataFrame:
    n = len(exact)
    return pl.DataFrame(
        {
            "graft": ["A"] * n,
            "target_rank": [0] * n,
            "target_prob": [0.5] * n,
            "target_logprob": [-0.7] * n,
            "name_tokens": [3] * n,
            "name_logprob": logprob,
            "name_exact": exact,
        }
    )


def test_name_metrics_frame():
    scores = {
        "tokens": torch.tensor([3, 1]),
        "logprob": torch.tensor([-2.5, -0.25], dtype=torch.float64),
        "exact": torch.tensor([False, True]),
    }
    frame = name_metrics_frame(scores)
    assert frame.schema == {
        "name_tokens": pl.Int64,
        "name_logprob": pl.Float64,
        "name_exact": pl.Boolean,
    }
    assert frame.rows() == [(3, -2.5, False), (1, -0.25, True)]


def test_summary_of_names_wilson_and_bootstrap():
    logprob = [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0, -9.0, -10.0]
    df = table([True] * 3 + [False] * 7, logprob)
    row = summarize(df, n_boot=200, seed=3).row(0, named=True)
    # 3/10: the Wilson score interval at 95% is (0.1078, 0.6032)
    assert row["name_exact"] == pytest.approx(0.3)
    assert row["name_exact_lo"] == pytest.approx(0.1078, abs=1e-4)
    assert row["name_exact_hi"] == pytest.approx(0.6032, abs=1e-4)
    assert row["name_exact_ci_method"] == "95% Wilson interval"
    assert row["mean_name_logprob"] == pytest.approx(-5.5)
    expected = bootstrap_ci(
        {
            "rank": np.zeros(10),
            "prob": np.full(10, 0.5),
            "logprob": np.full(10, -0.7),
            "name_logprob": np.array(logprob),
        },
        {"mean_name_logprob": "mean:name_logprob"},
        n_boot=200,
        seed=3,
    )["mean_name_logprob"]
    assert (row["mean_name_logprob_lo"], row["mean_name_logprob_hi"]) == pytest.approx(expected)
    assert row["mean_name_logprob_lo"] < -5.5 < row["mean_name_logprob_hi"]
    assert row["mean_name_logprob_ci_method"] == "95% bootstrap CI"


def test_no_name_columns_no_name_statistics():
    df = table([True], [-1.0]).drop("name_exact", "name_logprob", "name_tokens")
    summary = summarize(df, n_boot=10)
    assert not [c for c in summary.columns if "name" in c]


def test_zero_exact_names_still_get_an_upper_bound():
    row = summarize(table([False] * 50, [-3.0] * 50), n_boot=10).row(0, named=True)
    assert row["name_exact"] == 0.0 and row["name_exact_lo"] == 0.0
    assert row["name_exact_hi"] == pytest.approx(0.0713, abs=1e-4)
