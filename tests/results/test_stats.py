"""Intervals, paired tests and contrast tables (graft.results.stats) against published values.

Sources of the reference numbers:
- [N98a] Newcombe (1998), "Two-sided confidence intervals for the single proportion:
  comparison of seven methods", Stat. Med. 17:857-872, Table II (Wilson score without
  continuity correction, and Clopper-Pearson "exact"), four decimals.
- [CT] R package contingencytables (Fagerland, Lydersen & Laake, "Statistical Analysis of
  Contingency Tables"), tests/testthat/test-ch8.R: Cavo et al. (2012) paired table
  [[59, 6], [16, 80]] -> exact conditional McNemar P = 0.052479, Newcombe square-and-add
  -0.0621 (95% CI -0.1186 to -0.0046); Ligarden (2010) 13/16 -> Clopper-Pearson 0.5435 to
  0.9595; 0/10 -> 0 to 0.3085; 10/10 -> 0.6915 to 1.
- [R] R: ``binom.test(0, 50)$conf.int`` = 0 to 0.07112174; ``qt(0.975, df)``;
  ``t.test(1:5)$conf.int`` = 1.036757 to 4.963243;
  ``p.adjust(c(.01, .02, .03, .04, .05), "holm")`` = .05 .08 .09 .09 .09.
- [F13] Fagerland, Lydersen & Laake (2013), "The McNemar test for binary matched-pairs
  data: mid-p and asymptotic are better than exact conditional", BMC Med. Res. Methodol.
  13:91: airway hyper-responsiveness, discordant 1 and 7 -> exact conditional P = 0.070.
Closed forms are used where they exist (Wilson 0/n upper bound z^2 / (n + z^2); the
binomial tail as an exact fraction). The numerics underneath are statsmodels' and scipy's;
these tests check graft's wrappers (argument order, edge cases, errors) against the sources.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import polars as pl
import pytest

from graft.errors import GraftError
from graft.results.stats import (
    StatsError,
    clopper_pearson_interval,
    cluster_bootstrap,
    holm,
    mcnemar_exact_p,
    newcombe_paired_interval,
    paired_bootstrap,
    paired_contrasts,
    paired_hits,
    seed_summary,
    wilson_interval,
)

Z975 = 1.959963984540054


# ------------------------------------------------------------------ one proportion
def test_zero_of_fifty_has_an_honest_upper_bound():
    lo, hi = wilson_interval(0, 50)
    assert lo == 0.0
    assert hi == pytest.approx(Z975**2 / (50 + Z975**2), rel=1e-12)  # closed form
    assert hi == pytest.approx(0.0713, abs=5e-5)
    lo, hi = clopper_pearson_interval(0, 50)
    assert lo == 0.0
    assert hi == pytest.approx(0.07112174, abs=5e-9)  # [R] binom.test(0, 50)
    assert hi == pytest.approx(1 - 0.025 ** (1 / 50), rel=1e-12)  # closed form for k = 0


@pytest.mark.parametrize(
    ("k", "n", "wilson", "exact"),  # [N98a] Table II
    [
        (81, 263, (0.2553, 0.3662), (0.2527, 0.3676)),
        (15, 148, (0.0624, 0.1605), (0.0578, 0.1617)),
        (0, 20, (0.0, 0.1611), (0.0, 0.1684)),
        (1, 29, (0.0061, 0.1718), (0.0009, 0.1776)),
    ],
)
def test_single_proportion_intervals_match_newcombe_1998(k, n, wilson, exact):
    assert wilson_interval(k, n) == pytest.approx(wilson, abs=5e-5)
    assert clopper_pearson_interval(k, n) == pytest.approx(exact, abs=5e-5)


def test_clopper_pearson_matches_contingencytables():
    # [CT] Ligarden (2010) 13/16, and the all/none edge cases.
    assert clopper_pearson_interval(13, 16) == pytest.approx((0.5435, 0.9595), abs=5e-5)
    assert clopper_pearson_interval(0, 10) == pytest.approx((0.0, 0.3085), abs=5e-5)
    assert clopper_pearson_interval(10, 10) == pytest.approx((0.6915, 1.0), abs=5e-5)


def test_intervals_are_symmetric_and_ordered():
    for k in range(0, 21):
        for fn in (wilson_interval, clopper_pearson_interval):
            lo, hi = fn(k, 20, 0.9)
            mlo, mhi = fn(20 - k, 20, 0.9)
            assert lo == pytest.approx(1 - mhi, abs=1e-12)
            assert 0.0 <= lo <= k / 20 <= hi <= 1.0
    # Exact intervals are wider than Wilson's in the tails.
    assert clopper_pearson_interval(1, 29).lo < wilson_interval(1, 29).lo


@pytest.mark.parametrize(
    "call",
    [
        lambda: wilson_interval(3, 2),
        lambda: wilson_interval(0, 0),
        lambda: wilson_interval(1.5, 4),
        lambda: clopper_pearson_interval(-1, 4),
        lambda: wilson_interval(1, 4, level=1.0),
        lambda: clopper_pearson_interval(1, 4, level=95),
    ],
)
def test_bad_counts_and_levels_raise_a_graft_error(call):
    with pytest.raises(GraftError):
        call()


# --------------------------------------------------------------- paired proportions
def test_exact_mcnemar_equals_two_sided_binomial_test():
    # [CT] Cavo et al. (2012): discordant 6 and 16.
    assert mcnemar_exact_p(6, 16) == pytest.approx(0.052479, abs=5e-7)
    # [F13] airway hyper-responsiveness: discordant 1 and 7.
    assert mcnemar_exact_p(1, 7) == pytest.approx(0.070, abs=5e-4)
    # Exact fractions: 2 * P(X <= 2 | n = 12) = 2 * 79 / 4096; 2 * P(X = 0 | n = 5) = 1/16.
    assert mcnemar_exact_p(2, 10) == float(Fraction(2 * 79, 4096))
    assert mcnemar_exact_p(5, 0) == 1 / 16
    assert mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(4, 4) == 1.0
    assert mcnemar_exact_p(10, 3) == mcnemar_exact_p(3, 10)
    # Large counts stay exact (no float underflow): 2 * P(X <= 0 | n = 2000) = 2^-1999.
    assert mcnemar_exact_p(0, 2000) == 2.0**-1999


def test_newcombe_interval_matches_contingencytables():
    # [CT] Cavo et al. (2012): table [[59, 6], [16, 80]] (rows: first classification).
    lo, hi = newcombe_paired_interval(59, 6, 16, 80)
    assert (lo, hi) == pytest.approx((-0.1186, -0.0046), abs=5e-5)


def test_paired_hits_counts_the_discordant_pairs():
    # Rebuild the Cavo table as 161 paired booleans, shuffled.
    a = np.array([1] * 59 + [1] * 6 + [0] * 16 + [0] * 80, dtype=bool)
    b = np.array([1] * 59 + [0] * 6 + [1] * 16 + [0] * 80, dtype=bool)
    perm = np.random.default_rng(3).permutation(a.size)
    res = paired_hits(a[perm], b[perm])
    assert (res.n, res.both, res.b, res.c, res.neither) == (161, 59, 6, 16, 80)
    assert res.diff == pytest.approx(-10 / 161)
    assert res.diff == pytest.approx(res.acc_a - res.acc_b)
    assert res.p == pytest.approx(0.052479, abs=5e-7)
    assert (res.lo, res.hi) == pytest.approx((-0.1186, -0.0046), abs=5e-5)
    # Swapping A and B mirrors the interval and keeps p.
    swapped = paired_hits(b, a)
    assert (swapped.lo, swapped.hi) == pytest.approx((-res.hi, -res.lo), abs=1e-12)
    assert swapped.p == res.p


def test_paired_hits_identical_grafts():
    hits = np.array([True, False] * 25)
    res = paired_hits(hits, hits)
    assert res.diff == 0.0 and res.p == 1.0 and res.b == res.c == 0
    assert res.lo < 0 < res.hi  # no discordance is not certainty of equality


def test_paired_hits_rejects_mismatched_or_non_boolean_input():
    with pytest.raises(StatsError, match="same examples"):
        paired_hits([True, False], [True])
    with pytest.raises(StatsError, match="booleans"):
        paired_hits([0.5, 1.0], [1, 0])


# ---------------------------------------------------------------------- bootstraps
def test_paired_bootstrap_is_seeded_and_pairs_examples():
    rng = np.random.default_rng(0)
    a = rng.normal(size=200)
    b = a - 0.3 + rng.normal(scale=0.05, size=200)
    r1 = paired_bootstrap(a, b, n_boot=3000, seed=7)
    r2 = paired_bootstrap(a, b, n_boot=3000, seed=7)
    assert r1 == r2
    assert r1.estimate == pytest.approx(float(np.mean(a - b)))
    assert r1.lo < r1.estimate < r1.hi
    # Paired: the interval reflects the spread of a - b (sd 0.05), not of a (sd 1).
    se = float(np.std(a - b)) / math.sqrt(a.size)
    assert (r1.hi - r1.lo) == pytest.approx(2 * Z975 * se, rel=0.15)
    assert r1.p == pytest.approx(2 / 3001)  # every resample is above 0
    assert paired_bootstrap(a, b, n_boot=3000, seed=8) != r1


def test_paired_bootstrap_null_and_constant_differences():
    x = np.linspace(-1, 1, 50)
    same = paired_bootstrap(x, x, n_boot=500)
    assert (same.estimate, same.lo, same.hi, same.p) == (0.0, 0.0, 0.0, 1.0)
    rng = np.random.default_rng(1)
    noise = paired_bootstrap(rng.normal(size=400), rng.normal(size=400), n_boot=2000)
    assert noise.lo < 0 < noise.hi and noise.p > 0.05


def test_paired_bootstrap_variance_matches_theory():
    # The bootstrap variance of a mean is the plug-in variance / n.
    d = np.array([0.0, 1.0, 0.0, 3.0, 1.0, 2.0, 0.0, 5.0])
    res = paired_bootstrap(d, np.zeros_like(d), n_boot=200_000, seed=2, level=0.6827)
    half = (res.hi - res.lo) / 2
    assert half == pytest.approx(float(np.std(d)) / math.sqrt(d.size), rel=0.08)


def test_cluster_bootstrap_widens_with_between_seed_spread():
    rng = np.random.default_rng(4)
    tight = [rng.normal(0.5, 0.2, 100) for _ in range(3)]
    spread = [rng.normal(mu, 0.2, 100) for mu in (0.2, 0.5, 0.8)]
    rt = cluster_bootstrap(tight, n_boot=2000, seed=0)
    rs = cluster_bootstrap(spread, n_boot=2000, seed=0)
    assert rs.estimate == pytest.approx(np.mean([v.mean() for v in spread]))
    assert (rs.hi - rs.lo) > 3 * (rt.hi - rt.lo)
    # One cluster: the examples-only bootstrap of the mean.
    one = cluster_bootstrap([spread[0]], n_boot=2000, seed=0)
    assert one.estimate == pytest.approx(spread[0].mean())
    assert one.lo < one.estimate < one.hi
    assert cluster_bootstrap(spread, n_boot=2000, seed=0) == rs
    with pytest.raises(StatsError):
        cluster_bootstrap([np.array([])])


# ---------------------------------------------------------------------- seeds, Holm
def test_seed_summary_matches_t_test():
    s = seed_summary([1, 2, 3, 4, 5])  # [R] t.test(1:5)
    assert (s.lo, s.hi) == pytest.approx((1.036757, 4.963243), abs=5e-7)
    assert s.mean == 3.0 and s.n == 5 and s.values == (1.0, 2.0, 3.0, 4.0, 5.0)
    acc = seed_summary([0.92, 0.82, 0.88])
    half = 4.302653 * float(np.std([0.92, 0.82, 0.88], ddof=1)) / math.sqrt(3)
    assert (acc.lo, acc.hi) == pytest.approx((acc.mean - half, acc.mean + half), abs=1e-6)


def test_seed_summary_single_seed_has_no_interval():
    s = seed_summary([0.76])
    assert s.mean == 0.76 and s.n == 1
    assert math.isnan(s.lo) and math.isnan(s.hi) and math.isnan(s.sd)
    with pytest.raises(StatsError):
        seed_summary([])


@pytest.mark.slow
def test_holm_matches_r():
    got = holm([0.01, 0.02, 0.03, 0.04, 0.05])  # [R] p.adjust(..., "holm")
    np.testing.assert_allclose(got, [0.05, 0.08, 0.09, 0.09, 0.09], atol=1e-15)
    # Order is kept; NaN is left out of the family; capped at 1.
    got = holm([0.04, np.nan, 0.001, 0.5])
    np.testing.assert_allclose(got, [0.08, np.nan, 0.003, 0.5], atol=1e-15)
    assert holm([0.6, 0.7]).tolist() == [1.0, 1.0]
    with pytest.raises(StatsError):
        holm([1.5])


# ------------------------------------------------------------------- contrast table
def _examples(seeds=(None,), n=40) -> pl.DataFrame:
    """Three grafts on ``n`` examples and two templates, known hits and log-probs."""
    rng = np.random.default_rng(5)
    frames = []
    for s in seeds:
        for template in ("headline", "qa"):
            base = rng.normal(-3.0, 1.0, n)
            hits = {
                "SFT": np.arange(n) % 10 != 0,  # 36/40
                "FE+LT": np.arange(n) % 5 != 0,  # 32/40, a subset of SFT's hits
                "PRE": np.zeros(n, dtype=bool),
            }
            shift = {"SFT": 2.0, "FE+LT": 1.5, "PRE": 0.0}
            for graft, h in hits.items():
                cols = {
                    "group": "position",
                    "template": template,
                    "graft": graft,
                    "prompt_id": [f"f{i}:{template}" for i in range(n)],
                    "hit@5": h,
                    "target_logprob": base + shift[graft],
                }
                if s is not None:
                    cols["finetune_seed"] = s
                frames.append(pl.DataFrame(cols))
    return pl.concat(frames).sample(fraction=1.0, shuffle=True, seed=1)


@pytest.mark.slow
def test_paired_contrasts_table():
    table = paired_contrasts(_examples(), [("FE+LT", "SFT"), ("SFT", "PRE")], n_boot=500)
    assert table.height == 4
    assert table.columns[:4] == ["group", "template", "graft_a", "graft_b"]
    row = table.filter(template="headline", graft_a="FE+LT").row(0, named=True)
    assert row["n"] == 40 and row["n_seeds"] == 1
    assert (row["acc@5_a"], row["acc@5_b"]) == (32 / 40, 36 / 40)
    assert row["acc@5_diff"] == pytest.approx(-0.1)
    assert (row["mcnemar_b"], row["mcnemar_c"]) == (0, 4)
    assert row["mcnemar_p"] == mcnemar_exact_p(0, 4) == 0.125
    ref = newcombe_paired_interval(32, 0, 4, 4)
    assert (row["acc@5_diff_lo"], row["acc@5_diff_hi"]) == pytest.approx(ref)
    assert row["target_logprob_diff"] == pytest.approx(-0.5)
    assert row["target_logprob_diff_lo"] == pytest.approx(-0.5)  # a constant shift
    assert row["interval"] == "newcombe"
    # Holm over the four rows of the table.
    np.testing.assert_allclose(table["mcnemar_p_holm"], holm(table["mcnemar_p"].to_numpy()))
    sft_pre = table.filter(graft_a="SFT")["mcnemar_p"].to_list()
    assert sft_pre == [2.0**-35] * 2


@pytest.mark.slow
def test_paired_contrasts_holm_families():
    table = paired_contrasts(
        _examples(), [("FE+LT", "SFT"), ("SFT", "PRE")], holm_by=["template"], n_boot=200
    )
    for template in ("headline", "qa"):
        part = table.filter(template=template)
        np.testing.assert_allclose(part["mcnemar_p_holm"], holm(part["mcnemar_p"].to_numpy()))


def test_paired_contrasts_with_seeds_uses_the_cluster_bootstrap():
    frame = _examples(seeds=(0, 1, 2))
    with pytest.raises(StatsError, match="seed_col"):
        paired_contrasts(frame, [("FE+LT", "SFT")], n_boot=100)
    table = paired_contrasts(frame, [("FE+LT", "SFT")], seed_col="finetune_seed", n_boot=300)
    row = table.filter(template="qa").row(0, named=True)
    assert row["n"] == 120 and row["n_seeds"] == 3
    assert (row["mcnemar_b"], row["mcnemar_c"]) == (0, 12)
    assert row["acc@5_diff"] == pytest.approx(-0.1)
    assert row["acc@5_diff_lo"] <= -0.1 <= row["acc@5_diff_hi"]
    assert row["interval"] == "cluster-bootstrap"


@pytest.mark.slow
def test_paired_contrasts_bad_input():
    frame = _examples()
    with pytest.raises(StatsError, match="not in the table"):
        paired_contrasts(frame, [("FE+LT", "LT")])
    with pytest.raises(StatsError, match="missing"):
        paired_contrasts(frame.drop("target_logprob"), [("FE+LT", "SFT")])
    # Pairs absent from a cell are skipped, not an error.
    only_headline = frame.filter((pl.col("template") == "headline") | (pl.col("graft") != "PRE"))
    table = paired_contrasts(only_headline, [("SFT", "PRE")], n_boot=100)
    assert table["template"].to_list() == ["headline"]


def test_signed_rank_p_is_scipys_wilcoxon():
    from scipy.stats import wilcoxon

    from graft.results.stats.paired import signed_rank_p

    d = np.random.default_rng(3).normal(0.3, 1.0, 150)
    assert signed_rank_p(d) == pytest.approx(wilcoxon(d).pvalue)
    assert signed_rank_p(np.zeros(10)) == 1.0
    assert signed_rank_p(np.full(150, 1.2)) < 1e-25  # no floor from a resample count
    with pytest.raises(StatsError, match="finite"):
        signed_rank_p([np.nan])


def test_a_one_nat_difference_survives_holm_over_hundreds_of_contrasts():
    # the committed patching sweep's family: 359 contrasts of 150 prompts. A bootstrap p is
    # at least 2/(n_boot + 1), so Holm over 359 gives at least 0.72 at n_boot 1000: a
    # difference of 1.2 nats (residual LT, layer 21) could never be significant.
    rng = np.random.default_rng(7)
    n, pairs, frames = 150, [], []
    for c in range(360):
        base = rng.normal(-3.0, 2.0, n)
        shift = 1.2 if c == 0 else 0.0
        for graft, value in ((f"p{c}", base + shift + rng.normal(0, 1, n)), (f"w{c}", base)):
            frames.append(
                pl.DataFrame(
                    {
                        "graft": graft,
                        "prompt_id": [f"x{i}" for i in range(n)],
                        "hit@5": np.zeros(n, dtype=bool),
                        "target_logprob": value,
                    }
                )
            )
        pairs.append((f"p{c}", f"w{c}"))
    table = paired_contrasts(pl.concat(frames), pairs, by=[], n_boot=50)
    first = table.row(0, named=True)
    assert first["target_logprob_test"] == "Wilcoxon signed-rank"
    assert first["target_logprob_p_holm"] < 1e-6
    assert (table["target_logprob_p_holm"][1:] > 0.05).mean() > 0.95


def test_with_seeds_the_signed_rank_test_takes_each_example_once():
    frame = _examples(seeds=(0, 1, 2))
    table = paired_contrasts(frame, [("FE+LT", "SFT")], seed_col="finetune_seed", n_boot=50)
    row = table.filter(template="qa").row(0, named=True)
    assert row["target_logprob_test"] == "Wilcoxon signed-rank over examples (seed means)"
    # 40 examples, each a constant -0.5 shift averaged over its 3 seeds: the exact test of
    # 40 equal differences (ties: the normal approximation), not 120
    from scipy.stats import wilcoxon

    assert row["target_logprob_p"] == pytest.approx(wilcoxon(np.full(40, -0.5)).pvalue)
