"""Agreement with the paper's numbers: the three verdicts (agrees, disagrees, undecided)
against hand computations and statsmodels (graft.results.stats.agreement), and the checks
of a run's saved tables (graft.results.paper.agreement)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import polars as pl
import pytest
from statsmodels.stats.proportion import binom_tost, proportion_confint

from graft.errors import GraftError
from graft.results.paper.agreement import check_run, read_results
from graft.results.stats import wording
from graft.results.stats.agreement import (
    MARGIN,
    VERDICTS,
    Agreement,
    binomial_agreement,
    interval_agreement,
    mcnemar_agreement,
    mcnemar_p_range,
    mcnemar_range_agreement,
    rules_text,
    seed_interval,
)
from graft.results.stats.intervals import newcombe_paired_interval, seed_summary

RESULTS = Path(__file__).resolve().parents[2] / "results"


def _binomial_p(k: int, n: int, p: float) -> float:
    """Exact two-sided binomial p by hand: outcomes no more likely than k."""
    pmf = [math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(n + 1)]
    return min(1.0, sum(q for q in pmf if q <= pmf[k] * (1 + 1e-7)))


def _mcnemar_p(b: int, c: int) -> float:
    """Exact McNemar by hand: twice the smaller binomial(b + c, 1/2) tail, capped at 1."""
    m = b + c
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(min(b, c) + 1)) / 2**m
    return min(1.0, 2 * tail)


@pytest.mark.parametrize(
    ("k", "n", "p"), [(35, 50, 0.53), (6, 50, 0.53), (27, 50, 0.53), (50, 50, 1.0)]
)
def test_binomial_rule_is_the_exact_two_sided_test(k, n, p):
    result = binomial_agreement(k, n, p)
    assert result.p == pytest.approx(_binomial_p(k, n, p), rel=1e-9)
    assert wording.test_text(result).startswith("exact binomial test, two-sided")
    if result.verdict == "disagrees":
        assert result.p < 0.05


def test_agreement_is_a_frozen_record_of_three_verdicts():
    result = binomial_agreement(795, 1500, 0.53)
    assert result.verdict in VERDICTS and result.agrees is True
    assert {binomial_agreement(k, 50, 0.53).verdict for k in (2, 26)} == {
        "disagrees",
        "undecided",
    }
    assert binomial_agreement(2, 50, 0.53).agrees is False
    assert binomial_agreement(26, 50, 0.53).agrees is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.verdict = "disagrees"  # type: ignore[misc]
    fields = {f.name for f in dataclasses.fields(Agreement)}
    assert all(f"{name}:" in Agreement.__doc__ for name in fields)


def test_a_wide_interval_is_undecided_whatever_the_paper_says():
    # the referee's case: an interval over seeds of [0, 1] contains every proportion
    for paper in (0.0, 0.28, 0.53, 1.0):
        result = interval_agreement(paper, (0.0, 1.0), (0.0, 1.0), "interval over 3 seeds")
        assert result.verdict == "undecided"
        assert "[+0.00, +1.00] is too wide to test against ±0.10" in wording.reason_text(result)
    # 26/50 against 0.53: Wilson [0.39, 0.65] is wider than 2 x 0.10
    one = binomial_agreement(26, 50, 0.53)
    assert one.verdict == "undecided" and "too wide to test against ±0.10" in wording.reason_text(
        one
    )
    # a wide interval that excludes the paper's value still disagrees: the two-sided test
    # rejects whatever the width (35/50 against 0.53: p = 0.016)
    far = interval_agreement(0.9, (0.0, 0.5), (0.05, 0.45))
    assert (
        far.verdict == "disagrees"
        and "+0.90 above" in wording.reason_text(far)
        and "is wide" in wording.reason_text(far)
    )
    wide_off = binomial_agreement(35, 50, 0.53)
    assert wide_off.verdict == "disagrees" and "significantly above" in wording.reason_text(
        wide_off
    )
    # a wider margin admits the wider interval
    assert binomial_agreement(26, 50, 0.53, margin=0.2).verdict == "agrees"


def test_tight_intervals_agree_around_the_paper_and_disagree_away_from_it():
    near = interval_agreement(0.29, (0.25, 0.33), (0.26, 0.32))
    assert near.verdict == "agrees" and "lies within +0.29 ± 0.10" in wording.reason_text(near)
    away = interval_agreement(0.29, (-0.03, 0.03), (-0.02, 0.02))
    assert away.verdict == "disagrees" and "+0.29 above" in wording.reason_text(away)
    # neither: the paper's value inside the 95% interval, the 90% one past the margin
    neither = interval_agreement(0.29, (0.12, 0.30), (0.14, 0.28))
    assert neither.verdict == "undecided" and "neither test decides" in wording.reason_text(neither)
    # significantly off, by less than the margin: agrees, and says so
    close = interval_agreement(0.53, (0.55, 0.58), (0.555, 0.575), signed=False)
    assert close.verdict == "agrees" and "by less than the margin" in wording.reason_text(close)
    with pytest.raises(GraftError, match="reversed"):
        interval_agreement(0.1, (0.2, 0.1), (0.2, 0.1))


def test_one_finetune_needs_enough_prompts_to_agree():
    assert binomial_agreement(26, 50, 0.53).verdict == "undecided"
    big = binomial_agreement(795, 1500, 0.53)
    assert big.verdict == "agrees" and big.p_equivalence < 0.05
    assert big.lo_tost >= 0.43 and big.hi_tost <= 0.63
    assert binomial_agreement(600, 1500, 0.53).verdict == "disagrees"  # 0.40: off by > δ
    assert binomial_agreement(2, 50, 0.53).verdict == "disagrees"
    assert binomial_agreement(150, 150, 1.0).verdict == "agrees"  # 1.0 + δ: no upper test
    with pytest.raises(GraftError, match="0 <= k <= n"):
        binomial_agreement(51, 50, 0.5)
    with pytest.raises(GraftError, match="proportion"):
        binomial_agreement(5, 50, 53)
    with pytest.raises(GraftError, match="margin"):
        binomial_agreement(5, 50, 0.5, margin=0)


@pytest.mark.parametrize("k", range(560, 1041, 20))
def test_the_one_finetune_tost_is_statsmodels_binom_tost(k):
    n, paper = 1500, 0.53
    result = binomial_agreement(k, n, paper)
    p_tost = float(binom_tost(k, n, paper - MARGIN, paper + MARGIN)[0])
    assert result.p_equivalence == pytest.approx(p_tost, rel=1e-9, abs=1e-300)
    assert (result.verdict == "agrees") == (p_tost < 0.05)  # intervals here are narrow
    # and the TOST is the 90% Clopper-Pearson interval inside paper ± δ
    lo, hi = proportion_confint(k, n, alpha=0.10, method="beta")
    assert (p_tost < 0.05) == (paper - MARGIN < lo and hi < paper + MARGIN)


def test_seed_interval_is_the_summaries_construction():
    values, k, n = [0.5, 0.6, 0.7], 90, 150
    t = seed_summary(values, 0.9)
    pooled = proportion_confint(k, n, alpha=0.1, method="wilson")
    lo, hi = seed_interval(values, k, n, 0.9)
    assert lo == pytest.approx(min(t.lo, pooled[0])) and hi == pytest.approx(max(t.hi, pooled[1]))
    assert seed_interval([1.0, 1.0, 1.0], 150, 150, 0.9) == (
        pytest.approx(proportion_confint(150, 150, alpha=0.1, method="wilson")[0]),
        1.0,
    )
    assert seed_interval([0.0, 1.0, 0.5], 75, 150, 0.95) == (0.0, 1.0)  # clipped to [0, 1]


def test_floor_and_ceiling_cannot_show_a_difference():
    for k in (0, 150):
        result = mcnemar_range_agreement(k, k, 150)
        assert result.verdict == "undecided"
        assert "acc@5 cannot show a difference here" in wording.reason_text(result)
    assert "both at the floor" in wording.reason_text(mcnemar_range_agreement(0, 0, 150))
    assert "both at the ceiling" in wording.reason_text(mcnemar_range_agreement(150, 150, 150))
    paired = mcnemar_agreement(1.0, (0, 0, 0, 150))
    assert paired.verdict == "undecided" and "both at the floor" in wording.reason_text(paired)
    # near the floor (both within the margin of it) neither graft recovers the answer: 1/150
    # vs 0/150 and 15/150 vs 12/150 are undecided, not agreement
    for k_a, k_b in ((1, 0), (15, 12)):
        near = mcnemar_range_agreement(k_a, k_b, 150)
        assert near.verdict == "undecided" and "within 0.10 of the floor" in wording.reason_text(
            near
        )
    # away from the floor, a tight paired interval agrees, near the ceiling too
    assert mcnemar_agreement(1.0, (60, 2, 3, 85)).verdict == "agrees"
    assert mcnemar_agreement(1.0, (140, 2, 3, 5)).verdict == "agrees"


@pytest.mark.parametrize(("k_a", "k_b"), [(0, 15), (15, 0), (3, 15), (15, 3)])
def test_the_floor_does_not_hide_a_significant_difference(k_a, k_b):
    # 0/150 vs 15/150 (McNemar p = 6e-5) and 3/150 vs 15/150 (p = 0.004 paired as below):
    # both within the margin of the floor, and yet plainly different
    both = min(k_a, k_b)
    cells = (both, k_a - both, k_b - both, 150 - max(k_a, k_b))
    p = _mcnemar_p(cells[1], cells[2])
    paired = mcnemar_agreement(p, cells)
    assert p < 0.005 and paired.verdict == "disagrees"
    assert "within 0.10 of the floor" in wording.reason_text(
        paired
    ) and "but A and B differ" in wording.reason_text(paired)
    counts = mcnemar_range_agreement(k_a, k_b, 150)
    assert counts.verdict == "disagrees" and "but A and B differ" in wording.reason_text(counts)


def test_near_the_floor_nothing_but_a_significant_difference_is_decided():
    # not significant near the floor: undecided, both directions of the pair
    for cells in ((0, 1, 0, 149), (0, 0, 1, 149), (12, 3, 0, 135)):
        p = _mcnemar_p(cells[1], cells[2])
        assert p >= 0.05 and mcnemar_agreement(p, cells).verdict == "undecided"
    # the same discordant pairs (2 and 3 of 150) agree away from the floor; near it an
    # equivalence of two grafts that recover nothing tests nothing
    away = mcnemar_agreement(1.0, (70, 2, 3, 75))
    assert away.verdict == "agrees"
    near = mcnemar_agreement(1.0, (10, 2, 3, 135))
    assert near.verdict == "undecided" and "of the floor" in wording.reason_text(near)
    # a significant difference near the floor (0/150 vs 8/150, p = 0.008) disagrees
    p = _mcnemar_p(0, 8)
    assert mcnemar_agreement(p, (0, 0, 8, 142)).verdict == "disagrees"


def test_mcnemar_rule():
    # A ≈ B: the 90% Newcombe interval of A − B within ±δ
    close = mcnemar_agreement(1.0, (140, 2, 3, 5))
    assert close.verdict == "agrees" and close.hi_tost - close.lo_tost < 0.2
    lo, hi = newcombe_paired_interval(140, 2, 3, 5, 0.90)
    assert (close.lo_tost, close.hi_tost) == (lo, hi)
    assert mcnemar_agreement(0.0006, (100, 5, 20, 25)).verdict == "disagrees"
    # not significant at n = 50 is not equivalence: 6 and 2 discordant of 50
    small = mcnemar_agreement(0.29, (20, 6, 2, 22))
    assert small.verdict == "undecided"
    # per-seed differences widen the interval
    spread = mcnemar_agreement(1.0, (140, 2, 3, 5), seed_diffs=[-0.2, 0.0, 0.19])
    assert spread.lo_tost < close.lo_tost and spread.verdict == "undecided"
    with pytest.raises(GraftError, match="alpha"):
        mcnemar_agreement(0.5, (1, 1, 1, 1), alpha=5)
    with pytest.raises(GraftError, match="p-value"):
        mcnemar_agreement(1.5, (1, 1, 1, 1))


def test_rules_text_states_alpha_and_margin():
    text = rules_text()
    assert "α = 0.05" in text and "δ = 0.10" in text
    assert "90% interval" in text and "95% interval" in text and "wider than 0.20" in text
    assert "δ = 0.05" in rules_text(margin=0.05) and "wider than 0.10" in rules_text(margin=0.05)


@pytest.mark.parametrize(("k_a", "k_b", "n"), [(5, 3, 150), (0, 0, 50), (10, 0, 12), (30, 20, 40)])
def test_mcnemar_range_covers_every_pairing_of_the_counts(k_a, k_b, n):
    # brute force: every 2x2 table with these margins
    ps = []
    for both in range(n + 1):
        b, c = k_a - both, k_b - both
        if b >= 0 and c >= 0 and both + b + c <= n:
            ps.append(_mcnemar_p(b, c))
    low, high = mcnemar_p_range(k_a, k_b, n)
    assert low == pytest.approx(min(ps)) and high == pytest.approx(max(ps))


def test_mcnemar_range_verdicts():
    agrees = mcnemar_range_agreement(140, 138, 150)  # within ±0.10 for every pairing
    assert agrees.verdict == "agrees" and "every pairing" in wording.reason_text(agrees)
    assert agrees.p >= 0.5 and agrees.p_high == pytest.approx(_mcnemar_p(10, 12))
    assert mcnemar_range_agreement(20, 0, 50).verdict == "disagrees"  # p < 1e-4, any pairing
    # 100 and 98 of 150: equivalent for some pairings, not for others
    mixed = mcnemar_range_agreement(100, 98, 150)
    assert (
        mixed.verdict == "undecided"
        and "depends on how the hits pair up" in wording.reason_text(mixed)
    )
    # 24 and 23 of 50: no pairing shows equivalence by the exact test
    assert "neither test decides" in wording.reason_text(mcnemar_range_agreement(24, 23, 50))
    # 5 and 3 of 150 sit within the margin of the floor: nothing to compare
    assert "of the floor" in wording.reason_text(mcnemar_range_agreement(5, 3, 150))
    wide = mcnemar_range_agreement(8, 2, 50)
    assert wide.verdict == "undecided"
    assert wide.p < 0.05 <= wide.p_high


def _summary_rows(template="headline", group=""):
    values = {"PRE": 0.0, "SFT": 1.0, "LT": 0.7, "FE+LT": 0.98, "(FE+LT)^C": 0.02}
    return [
        {
            "group": group,
            "template": template,
            "graft": graft,
            "n": 50,
            "acc@5": v,
            "acc@5_lo": max(0.0, v - 0.1),
            "acc@5_hi": min(1.0, v + 0.1),
        }
        for graft, v in values.items()
    ]


def _contrast(a, b, hits_a, hits_b, b_only, c_only, p_holm, group="", interval="newcombe"):
    """A contrast row of 50 paired prompts: A hits ``hits_a``, B ``hits_b``, with ``b_only``
    and ``c_only`` discordant."""
    diff = (hits_a - hits_b) / 50
    return {
        "group": group,
        "template": "headline",
        "graft_a": a,
        "graft_b": b,
        "n": 50,
        "acc@5_a": hits_a / 50,
        "acc@5_b": hits_b / 50,
        "acc@5_diff": diff,
        "acc@5_diff_lo": diff - 0.05,
        "acc@5_diff_hi": diff + 0.05,
        "mcnemar_b": b_only,
        "mcnemar_c": c_only,
        "mcnemar_p_holm": p_holm,
        "interval": interval,
    }


def test_a_runs_saved_tables_are_checked_against_its_paper_model(tmp_path):
    pl.DataFrame(_summary_rows() + _summary_rows("qa")).write_csv(tmp_path / "position_summary.csv")
    pl.DataFrame([_contrast("FE+LT", "SFT", 49, 50, 0, 1, 1.0)]).write_csv(
        tmp_path / "position_contrasts.csv"
    )
    sets = [
        {**r, "graft": g, "group": "sft"}
        for r, g in zip(_summary_rows(), ["PRE", "SFT", "FFN", "O+FFN", "ATTN+O+FFN"], strict=True)
    ]
    pl.DataFrame(sets).write_csv(tmp_path / "component_summary.csv")
    # FFN 35/50 (the 0.7 row), O+FFN 49/50: stored as FFN vs O+FFN, on the paper's pair
    # (reversal) and on graft's (sft)
    pl.DataFrame(
        [
            _contrast("FFN", "O+FFN", 35, 49, 0, 14, 0.001, "reversal"),
            _contrast("FFN", "O+FFN", 35, 49, 0, 14, 0.001, "sft"),
        ]
    ).write_csv(tmp_path / "component_contrasts.csv")
    # a necessity table's rows mean other things and are never read
    pl.DataFrame(_summary_rows()).write_csv(tmp_path / "necessity_summary.csv")
    checks = {
        (c.number.experiment, c.number.graft, c.number.kind): c
        for c in check_run(read_results(tmp_path, "gemma3-270m", "D"))
    }
    lt = checks[("position", "LT", "value")]  # 35/50 against 0.53: p = 0.016
    assert lt.agreement.verdict == "disagrees" and lt.graft.startswith("LT 0.70")
    assert lt.agreement.p == pytest.approx(_binomial_p(35, 50, 0.53))
    assert "is wide" in wording.reason_text(lt.agreement)
    assert checks[("position", "SFT", "value")].agreement.verdict == "agrees"  # 50/50 vs 1.0
    fe_lt = checks[("position", "FE+LT", "approx")]  # 49 vs 50 of 50, Holm p = 1
    # Newcombe's 90% interval lies within ±0.10, but one discordant pair of 50 is too few
    # for the exact test
    assert (fe_lt.agreement.lo_tost, fe_lt.agreement.hi_tost) == newcombe_paired_interval(
        49, 0, 1, 0, 0.90
    )
    assert fe_lt.agreement.verdict == "undecided"
    assert "exact unconditional TOST p = 0.11 does not reject" in wording.reason_text(
        fe_lt.agreement
    )
    complement = checks[("position", "(FE+LT)^C", "approx")]  # no contrast: from the counts
    assert complement.graft == "(FE+LT)^C 1/50 vs PRE 0/50"
    # 1/50 vs 0/50: both within the margin of the floor, nothing to compare
    assert complement.agreement.verdict == "undecided" and "any pairing" in wording.test_text(
        complement.agreement
    )
    assert "of the floor" in wording.reason_text(complement.agreement)
    o = checks[("component", "O+FFN", "difference")]
    # FFN vs O+FFN flipped into O+FFN minus FFN: +0.28, the run's [+0.23, +0.33] widened
    # to Newcombe's; the paper's +0.29 lies inside, the 90% interval reaches past ±0.10
    newcombe = newcombe_paired_interval(35, 14, 0, 1, 0.95)
    assert o.graft == f"+0.28 [{newcombe.lo:+.2f}, {newcombe.hi:+.2f}]"
    assert (o.agreement.lo, o.agreement.hi) == (newcombe.lo, newcombe.hi)
    assert o.agreement.verdict == "undecided" and o.note == ""
    # on graft's pair only, the same numbers are another quantity: shown, no verdict
    pl.DataFrame([_contrast("FFN", "O+FFN", 35, 49, 0, 14, 0.001, "sft")]).write_csv(
        tmp_path / "component_contrasts.csv"
    )
    (other,) = [
        c
        for c in check_run(read_results(tmp_path, "gemma3-270m", "D"))
        if (c.number.graft, c.number.kind) == ("O+FFN", "difference")
    ]
    assert other.graft == o.graft and other.agreement is None
    assert other.note == (
        "no verdict: another quantity (graft's sft pair; the paper's number is on the "
        "reversal pair)"
    )
    assert ("hybrid", "FE ATTN + LT hybrid", "value") not in checks  # no hybrid run
    assert not [c for c in checks.values() if c.number.paper_model != "Gemma-1.1-2B"]
    # the same tables as a Llama-family model's: no Gemma number applies
    llama = check_run(read_results(tmp_path, "smollm2-135m"))
    assert {c.number.paper_model for c in llama} == {"Llama-3.2-1B"}


def test_replicated_runs_use_the_intervals_over_seeds(tmp_path):
    lt = _summary_rows()[2]  # LT
    seeds = [{**lt, "n_seeds": 1, "acc@5": v} for v in (0.52, 0.54, 0.53)]
    mean = {**lt, "n_seeds": 3, "acc@5": 0.53, "acc@5_lo": 0.40, "acc@5_hi": 0.61}
    mean["acc@5_per_seed"] = "[0.52, 0.54, 0.53]"
    pl.DataFrame([mean, *seeds]).write_csv(tmp_path / "position_summary.csv")
    (check,) = [
        c for c in check_run(read_results(tmp_path, "gemma3-270m")) if c.number.graft == "LT"
    ]
    # 90% interval: t over [0.52, 0.54, 0.53] widened to Wilson of 79/150 at 90%, within
    # 0.53 ± 0.10
    assert check.agreement.verdict == "agrees" and "over 3 seeds" in wording.test_text(
        check.agreement
    )
    assert (check.agreement.lo_tost, check.agreement.hi_tost) == seed_interval(
        [0.52, 0.54, 0.53], 79, 150, 0.90
    )
    # a table without per-seed values: its 95% interval stands in for the 90% one
    pl.DataFrame([{**mean, "acc@5_per_seed": None}, *seeds]).write_csv(
        tmp_path / "position_summary.csv"
    )
    (old,) = [c for c in check_run(read_results(tmp_path, "gemma3-270m")) if c.number.graft == "LT"]
    assert (old.agreement.lo_tost, old.agreement.hi_tost) == (0.40, 0.61)
    assert old.agreement.verdict == "undecided"  # [0.40, 0.61] reaches past 0.53 - 0.10


def test_the_committed_summaries_intervals_are_rebuilt_exactly():
    """The 95% interval over seeds that the rule rebuilds (to rebuild it at 90%) is the
    one graft's summaries report, for every committed mean row."""
    from graft.results.paper.agreement import _cell_rows, _hits, _per_seed, read_csv_table

    rows = 0
    for path in sorted(RESULTS.glob("*/*_summary.csv")):
        table = read_csv_table(path)
        if "acc@5_per_seed" not in table.columns:
            continue
        for row in table.filter(pl.col("n_seeds") > 1).iter_rows(named=True):
            k, n = _hits(_cell_rows(table, row["graft"], row["template"], row["group"]))
            lo, hi = seed_interval(_per_seed(row), k, n, 0.95)
            assert (lo, hi) == (pytest.approx(row["acc@5_lo"]), pytest.approx(row["acc@5_hi"]))
            rows += 1
    assert rows > 0


def test_read_results_needs_a_summary_and_a_model(tmp_path):
    with pytest.raises(GraftError, match="no summary"):
        read_results(tmp_path, "gemma3-270m")
    pl.DataFrame(_summary_rows()).write_csv(tmp_path / "position_summary.csv")
    with pytest.raises(GraftError, match="which model"):
        read_results(tmp_path)


@pytest.mark.parametrize(
    ("ffn", "o_ffn", "p_holm", "verdict"),
    [
        (0, 0, 1.0, "undecided"),  # both at the floor: A − B = 0 measures nothing
        (0, 2, 0.5, "undecided"),  # both within the margin of the floor, no difference found
        (50, 50, 1.0, "undecided"),  # both at the ceiling
        (0, 15, 6e-5, "disagrees"),  # near the floor, but the two differ: +0.10 vs +0.41
        (20, 80, 1e-6, "agrees"),  # away from the floor: +0.40, its interval within 0.41 ± 0.10
    ],
)
def test_a_difference_at_the_floor_is_undecided_unless_the_two_differ(
    tmp_path, ffn, o_ffn, p_holm, verdict
):
    """Llama's O+FFN − FFN = +0.41 (the reversal pair) against contrasts of n prompts."""
    n = 50 if ffn == 50 else 150
    rows = [
        {**r, "graft": g, "group": "reversal", "n": n}
        for r, g in zip(_summary_rows(), ["PRE", "SFT", "FFN", "O+FFN", "ATTN+O+FFN"], strict=True)
    ]
    pl.DataFrame(rows).write_csv(tmp_path / "component_summary.csv")
    diff = (o_ffn - ffn) / n
    contrast = {
        **_contrast("O+FFN", "FFN", 0, 0, o_ffn - ffn, 0, p_holm, "reversal"),
        "n": n,
        "acc@5_a": o_ffn / n,
        "acc@5_b": ffn / n,
        "acc@5_diff": diff,
        "acc@5_diff_lo": diff - 0.01,
        "acc@5_diff_hi": diff + 0.01,
    }
    pl.DataFrame([contrast]).write_csv(tmp_path / "component_contrasts.csv")
    (check,) = [
        c
        for c in check_run(read_results(tmp_path, "smollm2-135m"))
        if (c.number.graft, c.number.kind) == ("O+FFN", "difference")
    ]
    assert check.agreement.verdict == verdict, wording.reason_text(check.agreement)
    if verdict == "undecided":
        assert "floor" in wording.reason_text(check.agreement) or "ceiling" in wording.reason_text(
            check.agreement
        )
    if verdict == "disagrees":
        assert "but A and B differ" in wording.reason_text(check.agreement)


def test_seed_level_p_is_scipys_t_test_and_the_larger_test_decides_over_seeds():
    from scipy.stats import ttest_1samp

    from graft.results.stats.paired import over_seeds_p, seed_level_p

    # run A's FE+LT vs SFT per seed: -0.06 / -0.10 / -0.14 (headline, 50 prompts each)
    diffs = [-0.06, -0.10, -0.14]
    assert seed_level_p(diffs) == pytest.approx(ttest_1samp(diffs, 0.0).pvalue)
    assert seed_level_p(diffs) == pytest.approx(0.0494, abs=1e-4)
    assert seed_level_p([0.0, 0.0, 0.0]) == 1.0 and seed_level_p([0.1, 0.1]) == 0.0
    # the pooled McNemar (150 pairs, 3 prompts counted thrice) alone is far smaller
    assert over_seeds_p(0.0015, diffs) == pytest.approx(0.0494, abs=1e-4)
    # identical per-seed differences have no spread: the pooled test decides
    assert over_seeds_p(0.3, [0.02, 0.02, 0.02]) == 0.3
    assert over_seeds_p(0.0015, None) == over_seeds_p(0.0015, [0.1]) == 0.0015
    with pytest.raises(GraftError, match=">= 2 finite"):
        seed_level_p([0.1])


def _seeded_fig2(folder: Path, per_seed: tuple[float, float, float], complement: bool) -> None:
    """Run A's headline FE+LT vs SFT over 3 seeds x the same 50 prompts (pooled 3 and 18
    discordant of 150, FE+LT 122/150, SFT 137/150), with the per-seed FE+LT values
    ``per_seed`` (SFT 0.92 / 0.88 / 0.94), and (``complement``) Fig. 2's second claim."""
    sft = [0.92, 0.88, 0.94]

    def row(graft: str, mean: float, lo: float, hi: float, values: list[float]) -> dict:
        return {
            "group": "",
            "template": "headline",
            "graft": graft,
            "n": 50,
            "n_seeds": 3,
            "acc@5": mean,
            "acc@5_lo": lo,
            "acc@5_hi": hi,
            "acc@5_per_seed": str(values),
            "per_seed_of": "finetune_seed",
        }

    rows = []
    for graft, values in (("FE+LT", list(per_seed)), ("SFT", sft)):
        mean = sum(values) / 3
        rows.append(row(graft, mean, mean - 0.05, mean + 0.05, values))
    if complement:
        rows += [row(graft, 0.0, 0.0, 0.02, [0.0, 0.0, 0.0]) for graft in ("(FE+LT)^C", "PRE")]
    pl.DataFrame(rows).write_csv(folder / "position_summary.csv")
    contrast = {**_contrast("FE+LT", "SFT", 0, 0, 3, 18, 0.012), "n": 150}
    contrast.update({"acc@5_a": 122 / 150, "acc@5_b": 137 / 150, "acc@5_diff": -0.1})
    pl.DataFrame([contrast]).write_csv(folder / "position_contrasts.csv")


def _fe_lt(folder: Path):
    (check,) = [
        c
        for c in check_run(read_results(folder, "smollm2-135m", "A"))
        if (c.number.graft, c.number.kind) == ("FE+LT", "approx")
    ]
    return check.agreement


def test_seeds_sharing_prompts_need_the_seed_level_test_too(tmp_path):
    # pooled McNemar p = 0.0015 counts 50 prompts three times; per-seed differences
    # -0.06 / -0.10 / -0.14 give t p = 0.049: alone (a family of one) it still disagrees
    _seeded_fig2(tmp_path, (0.86, 0.78, 0.80), complement=False)
    alone = _fe_lt(tmp_path)
    assert alone.verdict == "disagrees" and alone.p == pytest.approx(0.0494, abs=1e-4)
    assert "seed-level t test (both must reject)" in wording.test_text(
        alone
    ) and "Holm" not in wording.test_text(alone)
    # per-seed differences that disagree in size: the seed-level test does not reject
    _seeded_fig2(tmp_path, (0.90, 0.68, 0.86), complement=False)
    spread = _fe_lt(tmp_path)
    assert spread.verdict == "undecided" and spread.p > 0.05


def test_holm_families_are_the_claims_of_one_figure_on_one_run(tmp_path):
    # with Fig. 2's second claim on the run, the family has two: p = 2 x 0.049 = 0.099
    _seeded_fig2(tmp_path, (0.86, 0.78, 0.80), complement=True)
    family = _fe_lt(tmp_path)
    assert family.verdict == "undecided" and family.p == pytest.approx(2 * 0.0494, abs=2e-4)
    assert "Holm over the 2 Fig. 2 claims on this run" in wording.test_text(family)
    # the stored contrast's Holm p (0.012, a family of whatever the command ran) is not read
    assert "0.012" not in wording.reason_text(family)
    # the same claim, seeds that agree closely: it survives the family
    _seeded_fig2(tmp_path, (0.82, 0.78, 0.84), complement=True)
    assert _fe_lt(tmp_path).verdict == "disagrees"
