"""Intervals: one proportion (Wilson, Clopper-Pearson: statsmodels), the difference of two
paired proportions (Newcombe's square-and-add on statsmodels' Wilson intervals), a mean
over finetune seeds (Student t: scipy), and the first two over seeds (the t interval widened
to the pooled one). Thin wrappers that check their input and say what is wrong in graft's
words."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy import stats as scipy_stats
from statsmodels.stats.proportion import proportion_confint

from graft.errors import StatsError


def check_level(level: float) -> None:
    """Refuse a coverage outside (0, 1)."""
    if not 0.0 < level < 1.0:
        raise StatsError(f"level must lie strictly between 0 and 1 (e.g. 0.95), got {level}")


class Interval(NamedTuple):
    """A two-sided interval ``[lo, hi]``."""

    lo: float
    hi: float


def _check_counts(k: int, n: int) -> None:
    if int(n) != n or int(k) != k or n < 1 or not 0 <= k <= n:
        raise StatsError(f"need whole counts with n >= 1 and 0 <= k <= n, got k={k}, n={n}")


def wilson_interval(k: int, n: int, level: float = 0.95) -> Interval:
    """Wilson score interval for a proportion ``k / n`` (no continuity correction).

    Args:
        k: successes (e.g. examples with the target in the top 5).
        n: trials (examples), at least 1.
        level: coverage, e.g. 0.95.
    """
    _check_counts(k, n)
    check_level(level)
    lo, hi = proportion_confint(int(k), int(n), alpha=1.0 - level, method="wilson")
    return Interval(0.0 if k == 0 else max(0.0, lo), 1.0 if k == n else min(1.0, hi))


def clopper_pearson_interval(k: int, n: int, level: float = 0.95) -> Interval:
    """Clopper-Pearson exact interval for a proportion ``k / n`` (beta quantiles).

    Args:
        k: successes.
        n: trials, at least 1.
        level: coverage, e.g. 0.95.
    """
    _check_counts(k, n)
    check_level(level)
    lo, hi = proportion_confint(int(k), int(n), alpha=1.0 - level, method="beta")
    return Interval(0.0 if k == 0 else float(lo), 1.0 if k == n else float(hi))


def newcombe_paired_interval(
    n11: int, n10: int, n01: int, n00: int, level: float = 0.95
) -> Interval:
    """Newcombe's square-and-add interval (method 10) for ``p_A - p_B`` on paired data.

    Cells: ``n11`` both hit, ``n10`` only A hits, ``n01`` only B hits, ``n00`` neither. The
    Wilson intervals of the two marginal proportions are combined with the continuity-
    corrected correlation estimate of Newcombe (1998), as in R's contingencytables. No
    Python library offers the paired form (statsmodels' ``confint_proportions_2indep``
    ``"newcomb"`` is for independent samples): this is the combination step alone, on
    statsmodels' Wilson intervals, tested against a published worked example.

    Args:
        n11: examples where both grafts hit.
        n10: examples where only A hits.
        n01: examples where only B hits.
        n00: examples where neither hits.
        level: coverage, e.g. 0.95.
    """
    cells = (n11, n10, n01, n00)
    if any(int(x) != x or x < 0 for x in cells) or sum(cells) < 1:
        raise StatsError(f"paired cells must be whole counts >= 0 with a total >= 1, got {cells}")
    n = n11 + n10 + n01 + n00
    row1, row0, col1, col0 = n11 + n10, n01 + n00, n11 + n01, n10 + n00
    p1, p2 = row1 / n, col1 / n
    l1, u1 = wilson_interval(row1, n, level)
    l2, u2 = wilson_interval(col1, n, level)
    phi = 0.0
    if min(row1, row0, col1, col0) > 0:
        cross = n11 * n00 - n10 * n01
        denom = math.sqrt(row1 * row0 * col1 * col0)
        if cross > n / 2:
            phi = (cross - n / 2) / denom
        elif cross < 0:
            phi = cross / denom
    d = p1 - p2
    lo = d - math.sqrt(max(0.0, (p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2)))
    hi = d + math.sqrt(max(0.0, (p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1)))
    return Interval(max(-1.0, lo), min(1.0, hi))


@dataclass(frozen=True)
class SeedSummary:
    """One metric over finetune seeds.

    Args:
        values: the per-seed values, in input order.
        n: number of seeds.
        mean: their mean.
        sd: their sample standard deviation (NaN for one seed).
        lo: lower bound of the Student-t interval ``mean -+ t * sd / sqrt(n)``
            (NaN for one seed: no between-seed interval exists).
        hi: upper bound of that interval.
        level: coverage of the interval.
    """

    values: tuple[float, ...]
    n: int
    mean: float
    sd: float
    lo: float
    hi: float
    level: float


def seed_summary(values: Sequence[float] | np.ndarray, level: float = 0.95) -> SeedSummary:
    """Mean over seeds with a Student-t interval on ``n - 1`` degrees of freedom.

    Args:
        values: one value per finetune (or data) seed, e.g. acc@5 of FE+LT per donor.
        level: coverage of the interval.
    """
    check_level(level)
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size == 0 or not np.isfinite(x).all():
        raise StatsError("seed_summary needs at least one finite value")
    mean = float(x.mean())
    if x.size == 1:
        return SeedSummary((mean,), 1, mean, math.nan, math.nan, math.nan, level)
    sd = float(x.std(ddof=1))
    half = float(scipy_stats.t.ppf(0.5 + level / 2.0, x.size - 1)) * sd / math.sqrt(x.size)
    return SeedSummary(tuple(map(float, x)), x.size, mean, sd, mean - half, mean + half, level)


def seed_interval(values: Sequence[float], k: int, n: int, level: float) -> Interval:
    """A proportion over finetune seeds, as :mod:`graft.results.over_seeds` reports it: the
    Student-t interval over the per-seed ``values`` widened to the Wilson interval of the
    pooled ``k`` hits of ``n`` prompts, clipped to [0, 1] (one seed: the Wilson interval)."""
    pooled = wilson_interval(k, n, level)
    if len(values) < 2:
        return pooled
    t = seed_summary(values, level)
    return Interval(max(0.0, min(t.lo, pooled.lo)), min(1.0, max(t.hi, pooled.hi)))


def paired_interval(
    cells: tuple[int, int, int, int], level: float, seed_diffs: Sequence[float] | None = None
) -> Interval:
    """A − B on paired hits: Newcombe's paired interval on the (pooled) table ``cells`` =
    (both hit, only A, only B, neither), widened with several seeds to the Student-t
    interval over the per-seed differences ``seed_diffs``, clipped to [-1, 1]."""
    newcombe = newcombe_paired_interval(*cells, level)
    if seed_diffs is None or len(seed_diffs) < 2:
        return newcombe
    t = seed_summary(seed_diffs, level)
    return Interval(max(-1.0, min(t.lo, newcombe.lo)), min(1.0, max(t.hi, newcombe.hi)))
