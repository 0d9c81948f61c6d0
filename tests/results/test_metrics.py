"""Per-example metrics and interval summaries (graft.results.metrics)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch

from graft.errors import GraftError
from graft.results.metrics import example_metrics, top_tokens_table
from graft.results.summary import bootstrap_ci, summarize


class _Tok:
    """A tokenizer stand-in: token i decodes to ``" t<i>"``."""

    def decode(self, ids):
        return "".join(f" t{i}" for i in ids)


def _logits_with_target_at(rank: int, vocab: int = 60, target: int = 7) -> torch.Tensor:
    """One row whose target has exactly ``rank`` strictly larger logits."""
    row = torch.zeros(vocab)
    row[target] = 1.0
    others = [i for i in range(vocab) if i != target][:rank]
    row[others] = 2.0 + torch.arange(rank, dtype=torch.float32)
    return row


def test_rank_and_topk_edges():
    logits = torch.stack([_logits_with_target_at(r) for r in (0, 4, 5, 9, 10, 49, 50)])
    df = example_metrics(logits, torch.full((7,), 7))
    assert df["target_rank"].to_list() == [0, 4, 5, 9, 10, 49, 50]
    # rank 4 is the 5th best token: inside top-5; rank 5 is not.
    assert df["hit@5"].to_list() == [True, True, False, False, False, False, False]
    assert df["hit@1"].to_list() == [True] + [False] * 6
    assert df["hit@10"].to_list() == [True, True, True, True, False, False, False]
    assert df["hit@50"].to_list() == [True] * 6 + [False]
    assert df.schema["hit@5"] == pl.Boolean


def test_ties_count_only_strictly_greater():
    logits = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0, 5.0]])
    df = example_metrics(logits, torch.tensor([2, 4]), ks=(1, 2))
    assert df["target_rank"].to_list() == [0, 0]
    assert df["hit@1"].to_list() == [True, True]
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 2.0]])
    assert example_metrics(logits, torch.tensor([4]))["target_rank"].item() == 2


def test_probabilities_and_logprobs():
    torch.manual_seed(0)
    logits = torch.randn(4, 30, dtype=torch.float64) * 3
    targets = torch.tensor([0, 5, 29, 12])
    df = example_metrics(logits, targets, top=30)
    ref = torch.log_softmax(logits.float(), -1)[torch.arange(4), targets]
    np.testing.assert_allclose(df["target_logprob"].to_numpy(), ref.numpy(), rtol=1e-6)
    np.testing.assert_allclose(
        df["target_prob"].to_numpy(), np.exp(df["target_logprob"].to_numpy()), rtol=1e-6
    )
    # With top = vocab the listed probabilities are the whole distribution.
    sums = [sum(p) for p in df["top30_probs"].to_list()]
    np.testing.assert_allclose(sums, 1.0, atol=1e-5)
    for probs in df["top30_probs"].to_list():
        assert probs == sorted(probs, reverse=True)
    # The target's entry in the top list carries the target probability.
    for ids, probs, t, p in df.select(
        "top30_ids", "top30_probs", "target_id", "target_prob"
    ).iter_rows():
        assert math.isclose(probs[ids.index(t)], p, rel_tol=1e-6)


def test_columns_and_tokenizer():
    logits = torch.randn(3, 20)
    df = example_metrics(logits, [1, 2, 3], tokenizer=_Tok(), top=4)
    assert df.columns == [
        "target_id",
        "target_text",
        "target_rank",
        "target_prob",
        "target_logprob",
        "hit@1",
        "hit@5",
        "hit@10",
        "hit@50",
        "top4_ids",
        "top4_tokens",
        "top4_probs",
    ]
    assert df["target_text"].to_list() == [" t1", " t2", " t3"]
    ids, toks = df["top4_ids"][0].to_list(), df["top4_tokens"][0].to_list()
    assert toks == [f" t{i}" for i in ids]
    assert "target_text" not in example_metrics(logits, [1, 2, 3]).columns


def test_bad_inputs():
    with pytest.raises(GraftError, match="target ids"):
        example_metrics(torch.zeros(2, 5), [0, 5])
    with pytest.raises(GraftError, match="2 target ids for 3 rows"):
        example_metrics(torch.zeros(3, 5), [0, 1])
    with pytest.raises(GraftError, match="NaN"):
        example_metrics(torch.tensor([[0.0, float("nan")]]), [0])


def _frame(n: int, p: float, graft: str = "FE", seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    hits = rng.random(n) < p
    ranks = np.where(hits, rng.integers(0, 5, n), rng.integers(5, 100, n))
    return pl.DataFrame(
        {
            "graft": [graft] * n,
            "target_rank": ranks.astype(np.int64),
            "target_prob": rng.random(n) * np.where(hits, 1.0, 0.1),
        }
    )


def test_summary_columns_and_point_estimates():
    df = pl.concat([_frame(50, 0.8, "LT"), _frame(30, 0.2, "FE", seed=1)])
    s = summarize(df, ks=(1, 5), n_boot=200)
    stats = ["acc@1", "acc@5", "mean_rank", "median_rank", "mean_prob"]
    values = [f"{m}{x}" for m in stats for x in ("", "_lo", "_hi")]
    assert s.columns == ["graft", "n", *values, *(f"{m}_ci_method" for m in stats)]
    assert s["graft"].to_list() == ["LT", "FE"]
    assert s["n"].to_list() == [50, 30]
    lt = df.filter(pl.col("graft") == "LT")
    row = s.row(0, named=True)
    assert row["acc@5"] == pytest.approx((lt["target_rank"] < 5).mean())
    assert row["median_rank"] == pytest.approx(lt["target_rank"].median())
    assert row["mean_prob"] == pytest.approx(lt["target_prob"].mean())


def _ranks(ranks: list[int], graft: str = "A") -> pl.DataFrame:
    """Rows of one graft with the given target ranks (probability 1 / (rank + 2))."""
    return pl.DataFrame(
        {
            "graft": [graft] * len(ranks),
            "target_rank": pl.Series(ranks, dtype=pl.Int64),
            "target_prob": [1.0 / (r + 2) for r in ranks],
            "target_logprob": [-math.log(r + 2) for r in ranks],
        }
    )


def test_accuracies_get_wilson_intervals():
    # 0/50 used to give a bootstrap interval [0, 0]; Wilson's upper bound is 0.0713.
    # Known values (Newcombe 1998, Table II): 0/50 -> [0, 0.0713], 15/148 -> [0.0624, 0.1605].
    s = summarize(pl.concat([_ranks([100] * 50), _ranks([0] * 15 + [9] * 133, "B")]), ks=(1, 10))
    zero, some = s.row(0, named=True), s.row(1, named=True)
    assert (zero["acc@1"], zero["acc@1_lo"]) == (0.0, 0.0)
    assert zero["acc@1_hi"] == pytest.approx(0.0713, abs=5e-5)
    assert some["acc@1"] == pytest.approx(15 / 148)
    assert (some["acc@1_lo"], some["acc@1_hi"]) == pytest.approx((0.0624, 0.1605), abs=5e-5)
    # n/n mirrors 0/n, whose upper bound is z^2 / (n + z^2) in closed form.
    z2 = 1.959964**2
    assert some["acc@10_hi"] == 1.0
    assert some["acc@10_lo"] == pytest.approx(1 - z2 / (148 + z2), abs=1e-6)
    # 90% coverage: z = 1.645 gives a narrower interval (0/50 -> 0.0513).
    narrow = summarize(_ranks([100] * 50), ks=(1,), ci=0.9).row(0, named=True)
    assert narrow["acc@1_hi"] == pytest.approx(1.6449**2 / (50 + 1.6449**2), abs=1e-4)
    assert narrow["acc@1_ci_method"] == "90% Wilson interval"


def test_each_interval_says_its_method():
    s = summarize(_ranks([0, 3, 7, 20]), ks=(1, 5), n_boot=100)
    row = s.row(0, named=True)
    assert row["acc@1_ci_method"] == row["acc@5_ci_method"] == "95% Wilson interval"
    for m in ("mean_rank", "median_rank", "mean_prob", "mean_logprob"):
        assert row[f"{m}_ci_method"] == "95% bootstrap CI", m
    assert row["mean_logprob"] == pytest.approx(-np.mean(np.log([2, 5, 9, 22])))
    assert row["mean_logprob_lo"] <= row["mean_logprob"] <= row["mean_logprob_hi"]
    # Without resamples the rank/prob intervals are the point; accuracies keep Wilson's.
    none = summarize(_ranks([0, 3, 7, 20]), ks=(1,), n_boot=0).row(0, named=True)
    assert none["mean_rank_lo"] == none["mean_rank_hi"] == none["mean_rank"]
    assert none["mean_rank_ci_method"] == "no interval (no bootstrap resamples)"
    assert none["acc@1_hi"] > none["acc@1"] > none["acc@1_lo"] > 0
    # Rows without log-probs get no mean_logprob.
    assert "mean_logprob" not in summarize(_frame(10, 0.5), n_boot=10).columns


def test_ci_contains_point_and_shrinks_with_n():
    widths = {}
    for n in (20, 2000):
        s = summarize(_frame(n, 0.5), n_boot=500, seed=3)
        row = s.row(0, named=True)
        for m in ("acc@5", "mean_rank", "median_rank", "mean_prob"):
            assert row[f"{m}_lo"] <= row[m] <= row[f"{m}_hi"], (n, m)
        widths[n] = {
            m: row[f"{m}_hi"] - row[f"{m}_lo"] for m in ("acc@5", "mean_rank", "mean_prob")
        }
    for m, wide in widths[20].items():
        assert widths[2000][m] < wide / 4, m
    # Around sqrt(p(1-p)/n) * 2 * 1.96 for accuracy.
    assert widths[2000]["acc@5"] == pytest.approx(2 * 1.96 * math.sqrt(0.25 / 2000), rel=0.25)


def test_summary_is_deterministic_for_a_seed():
    df = pl.concat([_frame(40, 0.6, "LT"), _frame(40, 0.3, "FE", seed=2)])
    a = summarize(df, n_boot=300, seed=7)
    b = summarize(df, n_boot=300, seed=7)
    c = summarize(df, n_boot=300, seed=8)
    assert a.equals(b)
    assert not a.equals(c)
    # A group's interval does not depend on the other groups present.
    alone = summarize(df.filter(pl.col("graft") == "FE"), n_boot=300, seed=7)
    assert alone.equals(a.filter(pl.col("graft") == "FE"))


def test_bootstrap_degenerate_cases():
    one = bootstrap_ci({"x": np.array([0.5])}, {"m": "mean:x"}, n_boot=100)
    assert one["m"] == (0.5, 0.5)
    none = bootstrap_ci({"x": np.array([1.0, 3.0])}, {"m": "mean:x"}, n_boot=0)
    assert none["m"] == (2.0, 2.0)
    with pytest.raises(GraftError, match="statistic"):
        bootstrap_ci({"x": np.array([1.0])}, {"m": "max:x"})


def test_summary_groups_and_drops():
    df = pl.concat(
        [
            _frame(10, 0.5, "LT").with_columns(template=pl.lit("headline")),
            _frame(12, 0.5, "LT").with_columns(template=pl.lit("qa")),
        ]
    )
    s = summarize(
        df, by=["graft", "template"], n_boot=50, drops={"missing_span:FE": 2, "target_empty": 1}
    )
    assert s["n_dropped"].to_list() == [3, 3]
    assert s["dropped_reasons"][0] == "missing_span:FE=2; target_empty=1"
    s = summarize(
        df,
        by=["graft", "template"],
        n_boot=50,
        drops={"qa": {"missing_span:FE": 4}},
        drops_by="template",
    )
    assert s["n_dropped"].to_list() == [0, 4]
    assert s["dropped_reasons"].to_list() == ["", "missing_span:FE=4"]
    overall = summarize(df, by=[], n_boot=50)
    assert overall["n"].to_list() == [22]
    with pytest.raises(GraftError, match="missing"):
        summarize(df, by=["nope"])


def test_top_tokens_table():
    torch.manual_seed(1)
    df = example_metrics(torch.randn(6, 40), list(range(6)), tokenizer=_Tok(), top=10)
    df = df.with_columns(graft=pl.Series(["A"] * 3 + ["B"] * 3))
    table = top_tokens_table(df, per_group=2, seed=0)
    assert table.height == 2 * 2 * 10
    assert table.columns[:6] == ["graft", "example", "rank", "token_id", "token", "prob"]
    assert table.filter(pl.col("rank") == 0)["prob"].min() > 0
    assert table.equals(top_tokens_table(df, per_group=2, seed=0))
