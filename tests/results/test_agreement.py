"""Agreement with the paper's numbers: the three rules against hand computations
(graft.results.stats.agreement), and the checks of a run's saved tables
(graft.results.agreement)."""

from __future__ import annotations

import math

import polars as pl
import pytest

from graft.errors import GraftError
from graft.results.agreement import check_run, read_results
from graft.results.stats.agreement import (
    binomial_agreement,
    interval_agreement,
    mcnemar_agreement,
    mcnemar_p_range,
    mcnemar_range_agreement,
)


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
    assert result.agrees is (result.p >= 0.05)
    assert result.test == "exact binomial test, two-sided"


def test_binomial_rule_verdicts():
    assert binomial_agreement(35, 50, 0.53).agrees is False  # 0.70 vs 0.53: p = 0.016
    assert "above" in binomial_agreement(35, 50, 0.53).detail
    assert binomial_agreement(6, 50, 0.53).agrees is False
    assert "below" in binomial_agreement(6, 50, 0.53).detail
    assert binomial_agreement(27, 50, 0.53).agrees is True
    assert binomial_agreement(49, 50, 1.0).agrees is False  # 1.0 admits no miss
    with pytest.raises(GraftError, match="0 <= k <= n"):
        binomial_agreement(51, 50, 0.5)
    with pytest.raises(GraftError, match="proportion"):
        binomial_agreement(5, 50, 53)


def test_interval_rule():
    assert interval_agreement(0.29, -0.07, 0.07).agrees is False
    assert "above" in interval_agreement(0.29, -0.07, 0.07).detail
    assert interval_agreement(0.0, -0.07, 0.07).agrees is True
    assert interval_agreement(0.07, -0.07, 0.07).agrees is True  # the bounds are inside
    with pytest.raises(GraftError, match="reversed"):
        interval_agreement(0.1, 0.2, 0.1)


def test_mcnemar_rule():
    assert mcnemar_agreement(0.2).agrees is True
    assert mcnemar_agreement(0.0006).agrees is False
    assert mcnemar_agreement(0.04, alpha=0.01).agrees is True
    with pytest.raises(GraftError, match="alpha"):
        mcnemar_agreement(0.5, alpha=5)


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
    assert mcnemar_range_agreement(5, 3, 150).agrees is True  # p >= 0.73 whatever the pairing
    assert mcnemar_range_agreement(20, 0, 50).agrees is False  # significant for every pairing
    undecided = mcnemar_range_agreement(8, 2, 50)  # 6 of 6 discordant vs 8 and 2
    assert undecided.agrees is None and "undecided" in undecided.detail
    assert undecided.p < 0.05 <= undecided.p_high


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


def _contrast(a, b, diff, p_holm, group="", interval="newcombe"):
    return {
        "group": group,
        "template": "headline",
        "graft_a": a,
        "graft_b": b,
        "n": 50,
        "acc@5_a": 0.5,
        "acc@5_b": 0.5,
        "acc@5_diff": diff,
        "acc@5_diff_lo": diff - 0.05,
        "acc@5_diff_hi": diff + 0.05,
        "mcnemar_p_holm": p_holm,
        "interval": interval,
    }


def test_a_runs_saved_tables_are_checked_against_its_paper_model(tmp_path):
    pl.DataFrame(_summary_rows() + _summary_rows("qa")).write_csv(tmp_path / "position_summary.csv")
    pl.DataFrame([_contrast("FE+LT", "SFT", -0.02, 1.0)]).write_csv(
        tmp_path / "position_contrasts.csv"
    )
    sets = [
        {**r, "graft": g, "group": "sft"}
        for r, g in zip(_summary_rows(), ["PRE", "SFT", "FFN", "O+FFN", "ATTN+O+FFN"], strict=True)
    ]
    pl.DataFrame(sets).write_csv(tmp_path / "component_summary.csv")
    pl.DataFrame([_contrast("FFN", "O+FFN", -0.02, 1.0, "sft")]).write_csv(
        tmp_path / "component_contrasts.csv"
    )
    # a necessity table's rows mean other things and are never read
    pl.DataFrame(_summary_rows()).write_csv(tmp_path / "necessity_summary.csv")
    checks = {
        (c.number.experiment, c.number.graft, c.number.kind): c
        for c in check_run(read_results(tmp_path, "gemma3-270m", "D"))
    }
    lt = checks[("position", "LT", "value")]
    assert lt.agreement.agrees is False and lt.graft.startswith("LT 0.70")
    assert lt.agreement.p == pytest.approx(_binomial_p(35, 50, 0.53))
    assert checks[("position", "SFT", "value")].agreement.agrees is True
    assert checks[("position", "FE+LT", "approx")].agreement.agrees is True  # Holm p = 1
    complement = checks[("position", "(FE+LT)^C", "approx")]  # no contrast: from the counts
    assert complement.graft == "(FE+LT)^C 1/50 vs PRE 0/50"
    assert complement.agreement.agrees is True and "every pairing" in complement.agreement.detail
    o = checks[("component", "O+FFN", "difference")]
    # FFN vs O+FFN flipped into O+FFN minus FFN: +0.02 [-0.03, +0.07]; 0.29 lies above
    assert o.graft == "+0.02 [-0.03, +0.07]" and o.agreement.agrees is False
    assert o.note == "graft's sft pair; the paper's is the reversal pair"
    assert ("hybrid", "FE ATTN + LT hybrid", "value") not in checks  # no hybrid run
    assert not [c for c in checks.values() if c.number.paper_model != "Gemma-1.1-2B"]
    # the same tables as a Llama-family model's: no Gemma number applies
    llama = check_run(read_results(tmp_path, "smollm2-135m"))
    assert {c.number.paper_model for c in llama} == {"Llama-3.2-1B"}


def test_replicated_runs_use_the_interval_over_seeds(tmp_path):
    mean = {**_summary_rows()[2], "n_seeds": 3, "acc@5_lo": 0.5, "acc@5_hi": 0.9}
    seeds = [{**_summary_rows()[2], "n_seeds": 1} for _ in range(3)]
    pl.DataFrame([mean, *seeds]).write_csv(tmp_path / "position_summary.csv")
    (lt,) = [c for c in check_run(read_results(tmp_path, "gemma3-270m")) if c.number.graft == "LT"]
    assert lt.agreement.agrees is True and "over 3 seeds" in lt.agreement.test


def test_read_results_needs_a_summary_and_a_model(tmp_path):
    with pytest.raises(GraftError, match="no summary"):
        read_results(tmp_path, "gemma3-270m")
    pl.DataFrame(_summary_rows()).write_csv(tmp_path / "position_summary.csv")
    with pytest.raises(GraftError, match="which model"):
        read_results(tmp_path)
