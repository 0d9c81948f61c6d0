"""Paired tests of two grafts on the same examples: the exact McNemar test on hits
(statsmodels), paired and cluster (seed, then example) bootstraps of a continuous metric,
and Holm's adjustment (statsmodels).

The bootstraps are resampling loops of ours: ``scipy.stats.bootstrap`` resamples one level,
and a run of several finetune seeds needs two (seeds, then examples within each seed)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom, ttest_1samp, wilcoxon
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from graft.errors import StatsError
from graft.results.stats.intervals import check_level, newcombe_paired_interval

# Largest index matrix (resamples x examples) drawn at once; bounds bootstrap memory.
_MAX_BOOT_CELLS = 4_000_000


# ---------------------------------------------------------------------- paired hits
def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact (conditional) McNemar p-value for discordant counts ``b`` and ``c``.

    (statsmodels' ``mcnemar(exact=True)``: the two-sided binomial test of ``b`` successes in
    ``b + c`` trials at p = 1/2, doubling the smaller tail, capped at 1).
    """
    if int(b) != b or int(c) != c or b < 0 or c < 0:
        raise StatsError(f"discordant counts must be whole numbers >= 0, got b={b}, c={c}")
    if b + c == 0:
        return 1.0
    return float(mcnemar([[0, int(b)], [int(c), 0]], exact=True).pvalue)


def seed_level_p(diffs: Sequence[float]) -> float:
    """Two-sided p of the one-sample t test (scipy) that the per-seed paired differences
    A − B average zero: the seed is the unit, so prompts that every seed shares count once
    (inside each seed's difference), not once per seed as in a pooled table. Differences
    that are all equal give 1 when zero and 0 otherwise (no spread: the t statistic is
    infinite; pair it with a test over the prompts, as :func:`over_seeds_p` does).

    Raises:
        StatsError: fewer than two differences, or one not finite.
    """
    d = np.asarray(diffs, dtype=np.float64).reshape(-1)
    if d.size < 2 or not np.isfinite(d).all():
        raise StatsError(f"a seed-level test needs >= 2 finite differences, got {d.tolist()}")
    if np.ptp(d) < 1e-12:
        return 1.0 if abs(float(d.mean())) < 1e-12 else 0.0
    return float(ttest_1samp(d, 0.0).pvalue)


def over_seeds_p(prompts_p: float, diffs: Sequence[float] | None) -> float:
    """The two-sided p of "A and B differ" over finetune seeds that share their prompts:
    the larger of the paired test over the pooled prompts (``prompts_p``, e.g. the exact
    McNemar p) and the seed-level t test of the per-seed differences
    (:func:`seed_level_p`), an intersection-union test (a difference must show over the
    prompts and over the finetunes; its level is α). One seed (``diffs`` None or of one
    value): ``prompts_p`` itself."""
    if diffs is None or len(diffs) < 2:
        return float(prompts_p)
    return max(float(prompts_p), seed_level_p(diffs))


def signed_rank_p(diffs: Sequence[float] | np.ndarray) -> float:
    """Two-sided p of the Wilcoxon signed-rank test (scipy) that paired differences are
    symmetric about zero: exact for up to 50 differences without ties, else the normal
    approximation; zero differences are dropped (Wilcoxon's rule), and all zero gives 1.
    Rank-based, so a few extreme log-probs do not decide it, and with no resampling its
    smallest p falls with n (below 1e-25 for 150 differences of one sign).

    Raises:
        StatsError: a difference that is not finite, or none at all.
    """
    d = np.asarray(diffs, dtype=np.float64).reshape(-1)
    if d.size == 0 or not np.isfinite(d).all():
        raise StatsError("the signed-rank test needs >= 1 finite difference")
    if not np.any(d != 0):
        return 1.0
    return float(wilcoxon(d, zero_method="wilcox").pvalue)


#: Berger and Boos's γ: the nuisance parameter's confidence level is 1 - γ, and γ is added
#: to the p-value (so the test stays exact at its level).
BERGER_BOOS_GAMMA = 0.001
#: Discordance rates at which the unconditional tail is maximised (evenly spaced over the
#: rate's interval, its ends included).
_NUISANCE_GRID = 401


def _upper_tail(d: int, n: int, rate: np.ndarray, delta: float) -> np.ndarray:
    """P(B - C >= d) for each discordance rate s in ``rate`` when B, C are the discordant
    counts of ``n`` pairs with P(only A) - P(only B) = -``delta``: given m = B + C ~
    Binomial(n, s), B ~ Binomial(m, (s - delta) / (2 s))."""
    m = np.arange(n + 1)
    only_a = np.clip((rate - delta) / (2 * rate), 0.0, 1.0)[:, None]
    weights = binom.pmf(m[None, :], n, rate[:, None])
    need = np.ceil((m[None, :] + d) / 2)  # B >= (m + d) / 2
    tails = binom.sf(need - 1, m[None, :], only_a)
    return np.asarray((weights * tails).sum(axis=1))


def paired_tost_p(b: int, c: int, n: int, margin: float) -> float:
    """Exact unconditional TOST p-value of |P(A) - P(B)| < ``margin`` on ``n`` paired
    examples with ``b`` and ``c`` discordant (only A, only B hit).

    Each one-sided null (difference <= -margin, >= +margin) is tested with the difference of
    the discordant counts, its p-value maximised over the nuisance parameter, the discordance
    rate, within the rate's 1 - γ Clopper-Pearson interval, plus γ (Berger and Boos 1994;
    γ = ``BERGER_BOOS_GAMMA``). Exact at any n: where discordant pairs are few, the paired
    Newcombe interval is not (its coverage is asymptotic). The TOST p is the larger of the
    two one-sided p-values.
    """
    if any(int(v) != v or v < 0 for v in (b, c, n)) or b + c > n or n < 1:
        raise StatsError(f"need whole counts b, c >= 0 with b + c <= n >= 1; got {b}, {c}, {n}")
    if not 0.0 < margin < 1.0:
        raise StatsError(f"the margin must lie strictly between 0 and 1, got {margin}")
    b, c, n = int(b), int(c), int(n)
    lo, hi = proportion_confint(b + c, n, alpha=BERGER_BOOS_GAMMA, method="beta")
    # on either null's boundary the discordance rate is at least the margin
    lo = max(float(lo), margin)
    if hi < lo:
        return BERGER_BOOS_GAMMA  # no rate this plausible lets |difference| reach the margin
    rate = np.linspace(lo, float(hi), _NUISANCE_GRID)
    below = _upper_tail(b - c, n, rate, margin).max()  # null: difference <= -margin
    above = _upper_tail(c - b, n, rate, margin).max()  # null: difference >= +margin
    return float(min(1.0, max(below, above) + BERGER_BOOS_GAMMA))


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


def _paired_arrays(
    a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, dtype: type | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``a`` and ``b`` as arrays, checked to be 1-D, non-empty and of one length."""
    x, y = np.asarray(a, dtype=dtype), np.asarray(b, dtype=dtype)
    if x.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise StatsError(
            f"need two non-empty 1-D arrays over the same examples, got shapes {x.shape}, {y.shape}"
        )
    return x, y


def _bool_pair(
    a: Sequence[bool] | np.ndarray, b: Sequence[bool] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    x, y = _paired_arrays(a, b)
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
    check_level(level)
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
    x, y = _paired_arrays(a, b, np.float64)
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


# ---------------------------------------------------------------------- multiple tests
def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (as R's ``p.adjust(p, "holm")``).

    NaN entries stay NaN and do not count towards the family size.
    """
    p = np.asarray(p_values, dtype=np.float64).reshape(-1)
    finite = ~np.isnan(p)
    if ((p[finite] < 0) | (p[finite] > 1)).any():
        raise StatsError(f"p-values must lie in [0, 1], got {p[finite].tolist()}")
    out = np.full(p.shape, np.nan)
    if finite.any():
        out[finite] = multipletests(p[finite], method="holm")[1]
    return out
