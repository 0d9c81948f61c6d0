"""The exact unconditional TOST of paired proportions (graft.results.stats.paired.paired_tost_p)
against brute-force enumeration: its tail formula, its size at the null's boundary, and the
small-n cases the asymptotic interval passed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graft.errors import GraftError
from graft.results.stats.paired import BERGER_BOOS_GAMMA, _upper_tail, paired_tost_p


def trinomial(n: int, p_b: float, p_c: float) -> dict[tuple[int, int], float]:
    """Every (b, c) of n pairs: only A with p_b, only B with p_c, else concordant."""
    rest = 1 - p_b - p_c
    return {
        (b, c): math.comb(n, b) * math.comb(n - b, c) * p_b**b * p_c**c * rest ** (n - b - c)
        for b in range(n + 1)
        for c in range(n + 1 - b)
    }


@pytest.mark.parametrize(("n", "d", "rate"), [(12, 0, 0.3), (12, -3, 0.5), (20, 2, 0.15)])
def test_the_tail_is_the_trinomial_sum(n, d, rate):
    delta = 0.1
    by_hand = sum(
        q
        for (b, c), q in trinomial(n, (rate - delta) / 2, (rate + delta) / 2).items()
        if b - c >= d
    )
    assert _upper_tail(d, n, np.array([rate]), delta)[0] == pytest.approx(by_hand, abs=1e-12)


@pytest.mark.slow  # 1,891 outcomes, one TOST each
def test_the_test_keeps_its_level_on_the_nulls_boundary():
    """P(TOST p < 0.05) <= 0.05 where the true difference is -0.2 or +0.2, at discordance
    rates from the smallest possible to all pairs (exact: every outcome of 60 pairs; a
    margin of 0.2, so that many outcomes show equivalence)."""
    n, delta, alpha = 60, 0.2, 0.05
    rejects = {
        (b, c): paired_tost_p(b, c, n, delta) < alpha
        for b in range(n + 1)
        for c in range(n + 1 - b)
    }
    assert sum(rejects.values()) >= 20  # the check is not vacuous: outcomes reject
    for rate in (0.2, 0.22, 0.3, 0.5, 0.7, 1.0):
        p_small, p_large = (rate - delta) / 2, (rate + delta) / 2
        for p_b, p_c in ((p_small, p_large), (p_large, p_small)):
            size = sum(q for cell, q in trinomial(n, p_b, p_c).items() if rejects[cell])
            assert size <= alpha + 1e-9, (rate, p_b, p_c, size)


def test_few_discordant_pairs_do_not_show_equivalence():
    # run G's FE FFN vs FE none: 6/50 vs 5/50, discordant 2 and 1; Newcombe's 90% upper
    # bound is 0.0972 < 0.10, the exact test: p = 0.16
    assert 0.1 < paired_tost_p(2, 1, 50, 0.1) < 0.2
    # a perfectly concordant 9/18 vs 9/18
    assert paired_tost_p(0, 0, 18, 0.1) > 0.25
    # with many pairs and few discordant, equivalence shows
    assert paired_tost_p(2, 3, 150, 0.1) < 0.01
    # no discordance this plausible lets the difference reach the margin: γ alone
    assert paired_tost_p(0, 0, 150, 0.1) == BERGER_BOOS_GAMMA
    # symmetric in A and B
    assert paired_tost_p(12, 10, 150, 0.1) == pytest.approx(paired_tost_p(10, 12, 150, 0.1))


@pytest.mark.parametrize(
    ("b", "c", "n", "margin"), [(-1, 0, 5, 0.1), (3, 3, 5, 0.1), (1, 1, 5, 1.5)]
)
def test_bad_input_is_a_graft_error(b, c, n, margin):
    with pytest.raises(GraftError):
        paired_tost_p(b, c, n, margin)
