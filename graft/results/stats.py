"""Intervals and paired tests for graft's result tables (numpy and polars only).

Every graft of a run scores the same test examples, so two grafts are compared pairwise,
example by example, rather than as two independent samples:

- a proportion (top-k accuracy of one graft): :func:`wilson_interval` or the exact
  :func:`clopper_pearson_interval`; both give an honest upper bound above 0 for 0/n;
- two grafts' hit@k on the same examples: :func:`paired_hits`, the exact (conditional)
  McNemar test on the discordant counts, with Newcombe's square-and-add interval (his
  method 10, 1998) for the difference in accuracy;
- a continuous per-example metric (log-prob, rank): :func:`paired_bootstrap`;
- one value per finetune seed: :func:`seed_summary` (mean with a Student-t interval over
  seeds) and :func:`cluster_bootstrap` (resample seeds, then examples within each seed);
- a family of tests: :func:`holm`;
- a run's table of contrasts: :func:`paired_contrasts`.

The binomial, beta and Student-t quantiles are computed here from the regularized
incomplete beta function (a continued fraction), so the module needs no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import NamedTuple

import numpy as np
import polars as pl

from graft.errors import StatsError

# Largest index matrix (resamples x examples) drawn at once; bounds bootstrap memory.
_MAX_BOOT_CELLS = 4_000_000
_CF_MAX_ITER = 100_000
_CF_EPS = 1e-16
_TINY = 1e-300


class Interval(NamedTuple):
    """A two-sided interval ``[lo, hi]``."""

    lo: float
    hi: float


# ----------------------------------------------------------------- special functions
def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise StatsError(f"level must lie strictly between 0 and 1 (e.g. 0.95), got {level}")


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _CF_MAX_ITER):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _CF_EPS:
            return h
    raise ArithmeticError(f"incomplete beta did not converge for a={a}, b={b}, x={x}")


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` for ``a, b > 0``."""
    if a <= 0 or b <= 0:
        raise StatsError(f"betainc needs a > 0 and b > 0, got a={a}, b={b}")
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    # The continued fraction converges fast for x < (a+1)/(a+b+2); use symmetry otherwise.
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def _invert_increasing(f: Callable[[float], float], target: float) -> float:
    """The x in [0, 1] with ``f(x) = target`` for an increasing ``f`` (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def beta_quantile(q: float, a: float, b: float) -> float:
    """The ``q``-quantile of the Beta(a, b) distribution."""
    if not 0.0 <= q <= 1.0:
        raise StatsError(f"quantile level must lie in [0, 1], got {q}")
    if q == 0.0:
        return 0.0
    if q == 1.0:
        return 1.0
    return _invert_increasing(lambda x: betainc(a, b, x), q)


def t_quantile(q: float, df: float) -> float:
    """The ``q``-quantile of Student's t distribution with ``df`` degrees of freedom."""
    if df <= 0:
        raise StatsError(f"degrees of freedom must be > 0, got {df}")
    if not 0.0 < q < 1.0:
        raise StatsError(f"quantile level must lie strictly between 0 and 1, got {q}")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    # P(T > t) = I_{df/(df+t^2)}(df/2, 1/2) / 2 for t >= 0.
    x = beta_quantile(2.0 * (1.0 - q), df / 2.0, 0.5)
    return math.sqrt(df * (1.0 - x) / x)


def normal_quantile(q: float) -> float:
    """The ``q``-quantile of the standard normal distribution."""
    if not 0.0 < q < 1.0:
        raise StatsError(f"quantile level must lie strictly between 0 and 1, got {q}")
    return NormalDist().inv_cdf(q)


# ------------------------------------------------------------------ one proportion
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
    _check_level(level)
    z = normal_quantile(0.5 + level / 2.0)
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return Interval(lo, hi)


def clopper_pearson_interval(k: int, n: int, level: float = 0.95) -> Interval:
    """Clopper-Pearson exact interval for a proportion ``k / n`` (beta quantiles).

    Args:
        k: successes.
        n: trials, at least 1.
        level: coverage, e.g. 0.95.
    """
    _check_counts(k, n)
    _check_level(level)
    alpha = 1.0 - level
    lo = 0.0 if k == 0 else beta_quantile(alpha / 2, k, n - k + 1)
    hi = 1.0 if k == n else beta_quantile(1 - alpha / 2, k + 1, n - k)
    return Interval(lo, hi)


# --------------------------------------------------------------- paired proportions
def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact (conditional) McNemar p-value for discordant counts ``b`` and ``c``.

    Equal to the two-sided binomial test of ``b`` successes in ``b + c`` trials at p = 1/2
    (doubling the smaller tail, capped at 1), computed in exact integer arithmetic.
    """
    if int(b) != b or int(c) != c or b < 0 or c < 0:
        raise StatsError(f"discordant counts must be whole numbers >= 0, got b={b}, c={c}")
    n, m = int(b + c), int(min(b, c))
    if n == 0 or b == c:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(m + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**n)))


def newcombe_paired_interval(
    n11: int, n10: int, n01: int, n00: int, level: float = 0.95
) -> Interval:
    """Newcombe's square-and-add interval (method 10) for ``p_A - p_B`` on paired data.

    Cells: ``n11`` both hit, ``n10`` only A hits, ``n01`` only B hits, ``n00`` neither. The
    Wilson intervals of the two marginal proportions are combined with the continuity-
    corrected correlation estimate of Newcombe (1998), as in R's contingencytables.

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
class PairedHits:
    """Two grafts' hits on the same examples.

    Args:
        n: examples.
        acc_a: accuracy of A.
        acc_b: accuracy of B.
        diff: ``acc_a - acc_b``.
        lo: lower bound of Newcombe's paired interval for ``diff``.
        hi: upper bound of that interval.
        both: examples both hit.
        b: examples only A hits (discordant).
        c: examples only B hits (discordant).
        neither: examples neither hits.
        p: two-sided exact McNemar p-value.
    """

    n: int
    acc_a: float
    acc_b: float
    diff: float
    lo: float
    hi: float
    both: int
    b: int
    c: int
    neither: int
    p: float


def _bool_pair(
    a: Sequence[bool] | np.ndarray, b: Sequence[bool] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(a), np.asarray(b)
    if x.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise StatsError(
            f"need two non-empty 1-D arrays over the same examples, got shapes {x.shape}, {y.shape}"
        )
    if not (np.isin(x, (0, 1)).all() and np.isin(y, (0, 1)).all()):
        raise StatsError("hits must be booleans (or 0/1)")
    return x.astype(bool), y.astype(bool)


def paired_hits(
    hits_a: Sequence[bool] | np.ndarray, hits_b: Sequence[bool] | np.ndarray, level: float = 0.95
) -> PairedHits:
    """Exact McNemar test and Newcombe interval for two grafts' hit@k on the same examples.

    Args:
        hits_a: per-example hits of graft A.
        hits_b: per-example hits of graft B, in the same example order.
        level: coverage of the interval for the accuracy difference.
    """
    x, y = _bool_pair(hits_a, hits_b)
    both, b = int((x & y).sum()), int((x & ~y).sum())
    c, neither = int((~x & y).sum()), int((~x & ~y).sum())
    n = x.size
    lo, hi = newcombe_paired_interval(both, b, c, neither, level)
    acc_a, acc_b = (both + b) / n, (both + c) / n
    p = mcnemar_exact_p(b, c)
    return PairedHits(n, acc_a, acc_b, acc_a - acc_b, lo, hi, both, b, c, neither, p)


# ---------------------------------------------------------------------- bootstraps
@dataclass(frozen=True)
class BootstrapResult:
    """A bootstrap estimate of a mean (difference).

    Args:
        estimate: the statistic on the data.
        lo: lower percentile bound.
        hi: upper percentile bound.
        p: two-sided bootstrap p-value for "the statistic is 0" (see :func:`_sign_p`).
        n: examples (or, for the cluster bootstrap, examples summed over clusters).
        n_boot: resamples drawn.
    """

    estimate: float
    lo: float
    hi: float
    p: float
    n: int
    n_boot: int


def _resample_means(rng: np.random.Generator, x: np.ndarray, count: int) -> np.ndarray:
    """``count`` means of ``x`` resampled with replacement (chunked to bound memory)."""
    out = np.empty(count)
    chunk = max(1, _MAX_BOOT_CELLS // x.size)
    for start in range(0, count, chunk):
        stop = min(count, start + chunk)
        out[start:stop] = x[rng.integers(0, x.size, size=(stop - start, x.size))].mean(axis=1)
    return out


def _sign_p(draws: np.ndarray) -> float:
    """Two-sided p-value from the share of resampled statistics on either side of 0.

    ``2 * min(#(d <= 0) + 1, #(d >= 0) + 1) / (B + 1)``, capped at 1: the percentile
    interval at level 1 - p just reaches 0, so p < 1 - level exactly when that interval
    excludes 0 (up to resampling resolution). The +1 keeps p above 0.
    """
    b = draws.size
    low, high = int((draws <= 0).sum()), int((draws >= 0).sum())
    return min(1.0, 2.0 * (min(low, high) + 1) / (b + 1))


def _summarize_draws(estimate: float, draws: np.ndarray, level: float, n: int) -> BootstrapResult:
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(draws, [alpha, 1.0 - alpha])
    return BootstrapResult(float(estimate), float(lo), float(hi), _sign_p(draws), n, draws.size)


def _check_boot(n_boot: int, level: float) -> None:
    _check_level(level)
    if int(n_boot) != n_boot or n_boot < 1:
        raise StatsError(f"n_boot must be a whole number >= 1, got {n_boot}")


def paired_bootstrap(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> BootstrapResult:
    """Mean of ``a - b`` over paired examples, percentile interval and two-sided p-value.

    Examples are resampled with replacement, the pair (a_i, b_i) together. With few
    examples (a handful) the percentile interval is too narrow and the p-value too small:
    three differences of one sign give p = 2 / (n_boot + 1) whatever their size.

    Args:
        a: per-example values of graft A (log-prob of the target, rank, ...).
        b: the same examples' values under graft B, same order.
        n_boot: resamples.
        seed: seed of ``numpy.random.default_rng``; equal seeds give equal results.
        level: coverage of the percentile interval.
    """
    _check_boot(n_boot, level)
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise StatsError(
            f"need two non-empty 1-D arrays over the same examples, got shapes {x.shape}, {y.shape}"
        )
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise StatsError("paired values must be finite (no NaN or inf)")
    d = x - y
    draws = _resample_means(np.random.default_rng(seed), d, n_boot)
    return _summarize_draws(d.mean(), draws, level, d.size)


def cluster_bootstrap(
    clusters: Sequence[Sequence[float] | np.ndarray],
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> BootstrapResult:
    """Two-stage bootstrap of the mean over seeds of per-seed mean values.

    Each resample draws as many seeds as there are, with replacement, then for each drawn
    seed resamples its examples with replacement (independently when a seed is drawn
    twice). The statistic weighs every seed equally: the mean of the per-seed means. For
    a paired contrast pass per-seed arrays of per-example differences.

    Args:
        clusters: one 1-D array of per-example values per finetune seed.
        n_boot: resamples.
        seed: seed of ``numpy.random.default_rng``.
        level: coverage of the percentile interval.
    """
    _check_boot(n_boot, level)
    arrays = [np.asarray(v, dtype=np.float64) for v in clusters]
    if not arrays or any(v.ndim != 1 or v.size == 0 for v in arrays):
        raise StatsError("need at least one cluster, each a non-empty 1-D array of values")
    if not all(np.isfinite(v).all() for v in arrays):
        raise StatsError("cluster values must be finite (no NaN or inf)")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(arrays), size=(n_boot, len(arrays)))
    slot_means = np.empty(picks.shape)
    for s, values in enumerate(arrays):
        mask = picks == s
        slot_means[mask] = _resample_means(rng, values, int(mask.sum()))
    estimate = float(np.mean([v.mean() for v in arrays]))
    return _summarize_draws(estimate, slot_means.mean(axis=1), level, sum(v.size for v in arrays))


# ---------------------------------------------------------------------- seeds, Holm
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
    _check_level(level)
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size == 0 or not np.isfinite(x).all():
        raise StatsError("seed_summary needs at least one finite value")
    mean = float(x.mean())
    if x.size == 1:
        return SeedSummary((mean,), 1, mean, math.nan, math.nan, math.nan, level)
    sd = float(x.std(ddof=1))
    half = t_quantile(0.5 + level / 2.0, x.size - 1) * sd / math.sqrt(x.size)
    return SeedSummary(tuple(map(float, x)), x.size, mean, sd, mean - half, mean + half, level)


def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (as R's ``p.adjust(p, "holm")``).

    NaN entries stay NaN and do not count towards the family size.
    """
    p = np.asarray(p_values, dtype=np.float64).reshape(-1)
    finite = ~np.isnan(p)
    if ((p[finite] < 0) | (p[finite] > 1)).any():
        raise StatsError(f"p-values must lie in [0, 1], got {p[finite].tolist()}")
    out = np.full(p.shape, np.nan)
    vals = p[finite]
    m = vals.size
    if m == 0:
        return out
    order = np.argsort(vals, kind="stable")
    scaled = (m - np.arange(m)) * vals[order]
    adjusted = np.minimum(1.0, np.maximum.accumulate(scaled))
    result = np.empty(m)
    result[order] = adjusted
    out[finite] = result
    return out


# ------------------------------------------------------------------- contrast table
def _metric_name(hit: str) -> str:
    return "acc" + hit[len("hit") :] if hit.startswith("hit") else f"mean_{hit}"


def _pair_frame(
    cell: pl.DataFrame, a: str, b: str, keys: list[str], columns: list[str]
) -> pl.DataFrame:
    """Rows of examples both grafts scored, A's and B's values side by side."""
    left = cell.filter(pl.col("graft") == a).select(*keys, *columns)
    right = cell.filter(pl.col("graft") == b).select(*keys, *columns)
    return left.join(right, on=keys, how="inner", suffix="__b").sort(keys)


def _seed_groups(joined: pl.DataFrame, seed_col: str | None) -> list[np.ndarray]:
    """Row indices of each seed (one group of all rows without ``seed_col``)."""
    if seed_col is None:
        return [np.arange(joined.height)]
    seeds = joined[seed_col].to_numpy()
    return [np.flatnonzero(seeds == s) for s in np.unique(seeds)]


def _contrast_row(
    joined: pl.DataFrame, hit: str, score: str, seed_col: str | None, args: dict
) -> dict:
    """Statistics of one (cell, pair): see :func:`paired_contrasts` for the columns."""
    ha, hb = joined[hit].to_numpy(), joined[f"{hit}__b"].to_numpy()
    sa, sb = joined[score].to_numpy(), joined[f"{score}__b"].to_numpy()
    groups = _seed_groups(joined, seed_col)
    test = paired_hits(ha, hb, args["level"])
    boot_args = (args["n_boot"], args["seed"], args["level"])
    if seed_col is None:
        acc_lo, acc_hi = test.lo, test.hi
        boot = paired_bootstrap(sa, sb, *boot_args)
    else:
        hit_d = ha.astype(np.float64) - hb.astype(np.float64)
        hits = cluster_bootstrap([hit_d[g] for g in groups], *boot_args)
        acc_lo, acc_hi = hits.lo, hits.hi
        boot = cluster_bootstrap([(sa - sb)[g] for g in groups], *boot_args)

    def seed_mean(x: np.ndarray) -> float:
        # Every seed weighs the same, as in cluster_bootstrap.
        return float(np.mean([x[g].mean() for g in groups]))

    acc = _metric_name(hit)
    acc_a, acc_b = seed_mean(ha.astype(np.float64)), seed_mean(hb.astype(np.float64))
    return {
        "n": joined.height,
        "n_seeds": len(groups),
        f"{acc}_a": acc_a,
        f"{acc}_b": acc_b,
        f"{acc}_diff": acc_a - acc_b,
        f"{acc}_diff_lo": acc_lo,
        f"{acc}_diff_hi": acc_hi,
        "mcnemar_b": test.b,
        "mcnemar_c": test.c,
        "mcnemar_p": test.p,
        f"{score}_a": seed_mean(sa),
        f"{score}_b": seed_mean(sb),
        f"{score}_diff": boot.estimate,
        f"{score}_diff_lo": boot.lo,
        f"{score}_diff_hi": boot.hi,
        f"{score}_p": boot.p,
    }


def paired_contrasts(
    examples: pl.DataFrame,
    pairs: Sequence[tuple[str, str]],
    hit: str = "hit@5",
    score: str = "target_logprob",
    by: Sequence[str] | None = None,
    example_key: Sequence[str] = ("prompt_id",),
    seed_col: str | None = None,
    holm_by: Sequence[str] = (),
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> pl.DataFrame:
    """Paired contrasts "A vs B" of a run's grafts, per cell of ``by``.

    For each cell (default: each ``group`` and ``template`` of an ``examples.parquet``)
    and each pair whose two grafts both have rows there, the examples both grafts scored
    are matched on ``example_key`` (plus ``seed_col``). Accuracies are compared with the
    exact McNemar test and, for one seed, Newcombe's paired interval; ``score`` with a
    paired bootstrap. With ``seed_col`` (several finetune seeds), the McNemar counts pool
    every (seed, example) pair, which treats the donors as fixed, while both intervals and
    the ``score`` p-value come from :func:`cluster_bootstrap` over seeds, then examples.

    Args:
        examples: per-example rows with columns ``graft``, ``hit``, ``score``, the ``by``
            columns, ``example_key`` and ``seed_col``.
        pairs: ``(A, B)`` graft names; differences are A minus B.
        hit: boolean hit column, e.g. ``"hit@5"``; the output names it ``acc@5``.
        score: continuous per-example column, e.g. ``"target_logprob"``.
        by: cell columns; None means those of ``("group", "template")`` present.
        example_key: columns naming one example within a cell.
        seed_col: column naming the finetune seed when the table holds several donors.
        holm_by: columns whose values form separate Holm families; by default every row
            of the returned table is one family (one for McNemar, one for ``score``).
        level: coverage of every interval.
        n_boot: bootstrap resamples.
        seed: bootstrap seed (each contrast uses it, so results do not depend on order).

    Returns:
        One row per (cell, pair) with the ``by`` columns, ``graft_a``, ``graft_b``, ``n``
        (matched examples), ``n_seeds``, ``acc@k_a``, ``acc@k_b``, ``acc@k_diff``,
        ``acc@k_diff_lo``, ``acc@k_diff_hi``, ``mcnemar_b`` (A hits, B misses),
        ``mcnemar_c`` (B hits, A misses), ``mcnemar_p``, ``mcnemar_p_holm``,
        ``{score}_a``, ``{score}_b``, ``{score}_diff``, ``{score}_diff_lo``,
        ``{score}_diff_hi``, ``{score}_p``, ``{score}_p_holm`` and ``interval`` (the
        method of the accuracy interval).

    Raises:
        StatsError: a missing column, an unknown graft, or an example listed twice for one
            graft in a cell (several seeds without ``seed_col``).
    """
    by = [c for c in ("group", "template") if c in examples.columns] if by is None else list(by)
    keys = list(example_key) + ([seed_col] if seed_col else [])
    need = ["graft", hit, score, *by, *keys, *holm_by]
    missing = sorted({c for c in need if c not in examples.columns})
    if missing:
        raise StatsError(f"paired_contrasts: columns {missing} missing (have {examples.columns})")
    known = set(examples["graft"].unique().to_list())
    unknown = sorted({g for pair in pairs for g in pair} - known)
    if unknown:
        raise StatsError(f"grafts {unknown} are not in the table; it has {sorted(known)}")
    dup = examples.select("graft", *by, *keys).is_duplicated()
    if dup.any():
        hint = "" if seed_col else "; pass seed_col when the table holds several finetune seeds"
        raise StatsError(
            f"{int(dup.sum())} rows repeat a (graft, {', '.join(by + keys)}) key{hint}"
        )
    args = {"level": level, "n_boot": n_boot, "seed": seed}
    cells = examples.partition_by(by, maintain_order=True, as_dict=True) if by else {(): examples}
    rows = []
    for key, cell in cells.items():
        present = set(cell["graft"].unique().to_list())
        for a, b in pairs:
            if a not in present or b not in present:
                continue
            joined = _pair_frame(cell, a, b, keys, [hit, score])
            if joined.is_empty():
                continue
            row = dict(zip(by, key, strict=True)) | {"graft_a": a, "graft_b": b}
            rows.append(row | _contrast_row(joined, hit, score, seed_col, args))
    return _finish_table(rows, score, holm_by, seed_col)


def _finish_table(
    rows: list[dict], score: str, holm_by: Sequence[str], seed_col: str | None
) -> pl.DataFrame:
    """Add Holm-adjusted p-values per family and the interval method; keep row order."""
    if not rows:
        return pl.DataFrame()
    table = pl.DataFrame(rows).with_row_index("__row")
    families = table.partition_by(list(holm_by), maintain_order=True) if holm_by else [table]
    adjusted = [
        f.with_columns(
            pl.Series("mcnemar_p_holm", holm(f["mcnemar_p"].to_numpy())),
            pl.Series(f"{score}_p_holm", holm(f[f"{score}_p"].to_numpy())),
        )
        for f in families
    ]
    table = pl.concat(adjusted).sort("__row").drop("__row")
    front = [c for c in table.columns if not c.startswith(score)]
    method = "cluster-bootstrap" if seed_col else "newcombe"
    ordered = front + [c for c in table.columns if c.startswith(score)]
    return table.select(ordered).with_columns(interval=pl.lit(method))
