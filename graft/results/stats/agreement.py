"""Whether a graft result agrees with a number the paper states: three verdicts, each from
two tests of scipy or statsmodels (no statistics of our own beyond combining intervals).

- **disagrees**: a two-sided test at ``alpha`` rejects "graft = paper": for one finetune,
  scipy's exact binomial test of graft's k/n against the paper's proportion; over several
  finetunes, or for a difference of two grafts, the paper's value outside graft's
  ``1 - alpha`` (95%) interval; for "A ≈ B", the paired exact McNemar test (a run's
  Holm-adjusted contrast) significant.
- **agrees**: an equivalence test (TOST) at ``alpha`` with margin ``margin`` (δ) passes,
  i.e. graft's ``1 - 2 alpha`` (90%) interval lies within ``[paper - δ, paper + δ]``: for
  one finetune, statsmodels' exact ``binom_tost`` (dual to the 90% Clopper-Pearson
  interval); over seeds, the 90% t interval over seeds widened to the pooled 90% Wilson
  interval (the construction of :mod:`graft.results.over_seeds`); for a difference or
  "A ≈ B" (paper value 0), the 90% Newcombe paired interval of A − B, widened over seeds
  to the 90% t interval of the per-seed differences, and the exact unconditional TOST of
  the paired difference (:func:`graft.results.stats.paired.paired_tost_p`), which the
  asymptotic interval alone passes where discordant pairs are few. A difference both tests find (graft
  significantly off the paper, but by less than δ) agrees: δ is the stated tolerance.
- **undecided**: otherwise; and when both sides of an "≈" or of a difference sit at the
  floor (no hits) or the ceiling (every hit), where acc@5 cannot show a difference, or
  both within the margin of the floor, where neither graft recovers the answer, unless
  the McNemar test of A against B rejects (a significant difference is a disagreement
  wherever it lies; an agreement there is never given); and when graft's
  95% interval is wider than ``max_width`` (default 2δ: too imprecise to compare with the
  paper at ±δ) and the two-sided test does not reject (a significant difference disagrees
  however wide the interval).

The rules for one number are here; "A ≈ B" is :mod:`graft.results.stats.paired_agreement`'s
(where only each graft's hit count is known, no paired table, :func:`mcnemar_range_agreement`
tries every pairing those counts allow and gives a verdict only when all give the same), the
verdict and its decision :mod:`graft.results.stats.verdict`'s.

The margin :data:`MARGIN` is absolute, on acc@5 (0.10 = ten percentage points).
"""

from __future__ import annotations

from collections.abc import Sequence

from scipy.stats import binomtest
from statsmodels.stats.proportion import binom_tost

from graft.errors import StatsError
from graft.results.stats.intervals import (
    Interval,
    clopper_pearson_interval,
    seed_interval,
    wilson_interval,
)
from graft.results.stats.paired_agreement import (
    mcnemar_agreement,
    mcnemar_p_range,
    mcnemar_range_agreement,
)
from graft.results.stats.verdict import (
    ALPHA,
    MARGIN,
    VERDICTS,
    Agreement,
    TwoSided,
    check_settings,
    decide,
)
from graft.results.stats.wording import pct

# the rules and the verdict as benchmarks.paper_table and the tests import them from here
__all__ = [
    "ALPHA",
    "MARGIN",
    "VERDICTS",
    "Agreement",
    "binomial_agreement",
    "interval_agreement",
    "mcnemar_agreement",
    "mcnemar_p_range",
    "mcnemar_range_agreement",
    "rules_summary",
    "rules_text",
    "seed_interval",
    "seeds_agreement",
]


def rules_text(alpha: float = ALPHA, margin: float = MARGIN, max_width: float | None = None) -> str:
    """The rules in words, for a table's caption."""
    width = check_settings(alpha, margin, max_width)
    two, tost = pct(1 - alpha), pct(1 - 2 * alpha)
    return (
        f"Three verdicts, at α = {alpha:g} with an equivalence margin δ = {margin:.2f} on acc@5 "
        f"(absolute). **disagrees**: a two-sided test rejects graft = paper (one finetune: the "
        f"exact binomial test; over seeds or for a difference: the paper's value outside "
        f'graft\'s {two} interval; "A ≈ B": the exact McNemar test (without a paired table: '
        f"for every pairing the two hit counts allow), over finetune seeds with the t test of "
        f"the per-seed differences, both rejecting (the seeds share their prompts: a pooled "
        f"table alone counts each prompt once per seed), Holm-adjusted over the claims of one "
        f"figure on one run). "
        f"**agrees**: the equivalence test passes (TOST, α per side): graft's {tost} interval "
        f"lies within the paper's value ± δ (one finetune: the exact binomial TOST; "
        f'"A ≈ B": the {tost} paired Newcombe interval of A − B within ±δ and the exact '
        f"unconditional TOST of the paired difference rejecting at α, its nuisance rate "
        f"bounded as Berger and Boos do); a significant difference smaller than δ still "
        f"agrees. **undecided**: neither; always when both "
        f'sides of an "≈" or of a difference sit at the floor (no hits) or the ceiling (every '
        f"hit), where acc@5 cannot show a difference, or both within δ of the floor, where "
        f"neither recovers the answer, unless the McNemar test finds that the two differ (then "
        f"a disagreement stands, nothing else); when the verdict depends on how two hit "
        f"counts pair up; and when graft's {two} interval is wider than {width:.2f} (too "
        f"imprecise to compare at ±δ) and the two-sided test does not reject. A number of "
        f"another pair of donors than the paper's is shown with no verdict. "
        f"Intervals over seeds: the t interval over the per-seed values widened to the pooled "
        f"Wilson interval; of a paired difference: Newcombe's interval on the pooled 2x2 table "
        f"widened to the t interval over the per-seed differences (at {two}, also to the "
        f"run's own interval)."
    )


def rules_summary(alpha: float = ALPHA, margin: float = MARGIN) -> str:
    """The rules in two sentences, for a short table's caption (the full rules:
    :func:`rules_text`)."""
    return (
        f"α = {alpha:g}, margin δ = {margin:.2f} on acc@5 (absolute). **agrees**: an "
        f"equivalence test (TOST) puts graft within the paper's value ± δ; **disagrees**: a "
        f'two-sided test rejects graft = paper (for "A ≈ B": McNemar, over seeds with a '
        f"seed-level t test, Holm within one figure); **undecided**: neither, or acc@5 cannot "
        f"test it (both at the floor or ceiling, an interval too wide)."
    )


def _tost_p(k: int, n: int, low: float, high: float) -> float:
    """statsmodels' exact binomial TOST p for ``low < p < high``; a side whose null region
    lies outside [0, 1] (``low < 0``, ``high > 1``) is rejected outright (p = 0)."""
    p, p_low, p_high = binom_tost(k, n, max(low, 0.0), min(high, 1.0))
    if low >= 0 and high <= 1:
        return float(p)
    return float(max(0.0 if low < 0 else p_low, 0.0 if high > 1 else p_high))


def binomial_agreement(
    k: int,
    n: int,
    paper: float,
    alpha: float = ALPHA,
    margin: float = MARGIN,
    max_width: float | None = None,
) -> Agreement:
    """graft's ``k`` hits of ``n`` (one finetune) against the paper's proportion ``paper``.

    Disagrees: scipy's exact two-sided binomial test rejects ``paper`` at ``alpha``. Agrees:
    statsmodels' exact ``binom_tost`` on ``paper`` ± ``margin`` has p < ``alpha`` (its 90%
    Clopper-Pearson interval lies within). Undecided otherwise, and when graft's 95% Wilson
    interval (the summaries') is wider than ``max_width`` (default 2 × margin)."""
    width = check_settings(alpha, margin, max_width)
    if not 0 <= paper <= 1:
        raise StatsError(f"the paper's proportion must lie in [0, 1], got {paper}")
    if int(k) != k or int(n) != n or not 0 <= k <= n or n < 1:
        raise StatsError(f"need whole counts 0 <= k <= n, n >= 1; got k={k}, n={n}")
    k, n = int(k), int(n)
    p = float(binomtest(k, n, paper).pvalue)
    p_eq = _tost_p(k, n, paper - margin, paper + margin)
    side = "above" if k / n > paper else "below"
    return decide(
        two_sided=TwoSided("binomial", p < alpha, paper, side),
        target=paper,
        ci=wilson_interval(k, n, 1 - alpha),
        ci_tost=clopper_pearson_interval(k, n, 1 - 2 * alpha),
        interval="interval",
        alpha=alpha,
        margin=margin,
        width=width,
        signed=False,
        equivalent=p_eq < alpha,
        p=p,
        p_equivalence=p_eq,
    )


def interval_agreement(
    paper: float,
    ci: tuple[float, float],
    ci_tost: tuple[float, float],
    name: str = "interval",
    alpha: float = ALPHA,
    margin: float = MARGIN,
    max_width: float | None = None,
    signed: bool = True,
) -> Agreement:
    """The paper's value against graft's intervals: ``ci`` at ``1 - alpha`` (disagrees when
    the paper's value lies outside) and ``ci_tost`` at ``1 - 2 alpha`` (agrees when it lies
    within ``paper`` ± ``margin``); ``name`` names the interval in the reason."""
    width = check_settings(alpha, margin, max_width)
    for lo, hi in (ci, ci_tost):
        if lo > hi:
            raise StatsError(f"interval bounds reversed: [{lo}, {hi}]")
    lo, hi = ci
    where = "inside" if lo <= paper <= hi else ("above" if paper > hi else "below")
    return decide(
        two_sided=TwoSided("interval", where != "inside", paper, where),
        target=paper,
        ci=Interval(lo, hi),
        ci_tost=Interval(*ci_tost),
        interval=name,
        alpha=alpha,
        margin=margin,
        width=width,
        signed=signed,
    )


def seeds_agreement(
    values: Sequence[float],
    k: int,
    n: int,
    paper: float,
    alpha: float = ALPHA,
    margin: float = MARGIN,
    max_width: float | None = None,
) -> Agreement:
    """A proportion over several finetunes (per-seed ``values``, ``k`` hits of ``n``
    prompts pooled) against the paper's ``paper``: :func:`interval_agreement` on
    :func:`seed_interval` at 95% and 90%."""
    check_settings(alpha, margin, max_width)
    name = f"interval over {len(values)} seeds"
    return interval_agreement(
        paper,
        seed_interval(values, k, n, 1 - alpha),
        seed_interval(values, k, n, 1 - 2 * alpha),
        name,
        alpha,
        margin,
        max_width,
        signed=False,
    )
