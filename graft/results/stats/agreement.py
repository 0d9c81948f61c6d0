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
  to the 90% t interval of the per-seed differences. A difference both tests find (graft
  significantly off the paper, but by less than δ) agrees: δ is the stated tolerance.
- **undecided**: otherwise; and always when both sides of an "≈" sit at the floor (no
  hits) or the ceiling (every hit), where acc@5 cannot show a difference, or both within
  the margin of the floor, where neither graft recovers the answer; and when graft's
  95% interval is wider than ``max_width`` (default 2δ: too imprecise to compare with the
  paper at ±δ) and the two-sided test does not reject (a significant difference disagrees
  however wide the interval).

Where only each graft's hit count is known (no paired table), :func:`mcnemar_range_agreement`
tries every pairing those counts allow and gives a verdict only when all give the same.

The margin :data:`MARGIN` is absolute, on acc@5 (0.10 = ten percentage points).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from scipy.stats import binomtest
from statsmodels.stats.proportion import binom_tost

from graft.errors import StatsError
from graft.results.stats.intervals import (
    Interval,
    clopper_pearson_interval,
    newcombe_paired_interval,
    seed_summary,
    wilson_interval,
)
from graft.results.stats.paired import mcnemar_exact_p

#: Significance level of every test (two-sided tests at ALPHA, TOST at ALPHA per side).
ALPHA = 0.05
#: Equivalence margin δ on acc@5, absolute: graft agrees with the paper when its
#: ``1 - 2 ALPHA`` interval lies within the paper's value ± MARGIN.
MARGIN = 0.10
#: A 95% interval wider than WIDTH_FACTOR × δ is too wide to agree (undecided) unless the
#: two-sided test rejects (disagrees: a significant difference needs no narrow interval).
WIDTH_FACTOR = 2.0

Verdict = Literal["agrees", "disagrees", "undecided"]
VERDICTS: tuple[Verdict, ...] = ("agrees", "disagrees", "undecided")


@dataclass(frozen=True)
class Agreement:
    """One verdict of graft against the paper.

    Args:
        verdict: ``"agrees"``, ``"disagrees"`` or ``"undecided"``.
        test: the tests used, in words (e.g. "exact binomial test, two-sided; exact
            binomial TOST, ±0.10").
        reason: why this verdict, in words, with its numbers.
        p: the two-sided test's p-value (exact binomial; exact McNemar, Holm-adjusted where
            the run's contrast is); the smallest over pairings for a range; None for an
            interval rule.
        p_high: the largest McNemar p-value over the pairings the hit counts allow (None
            unless the pairing is unknown).
        p_equivalence: the TOST p-value (statsmodels' ``binom_tost``) for one finetune;
            None where the equivalence test reads the 90% interval.
        lo: lower bound of graft's ``1 - alpha`` (95%) interval (over every pairing the
            counts allow: the lowest); None where not computed.
        hi: upper bound of that interval (over pairings: the highest).
        lo_tost: lower bound of graft's ``1 - 2 alpha`` (90%) interval, the TOST's.
        hi_tost: upper bound of that interval.
        target: the value graft is compared with (the paper's value; 0 for "A ≈ B").
        margin: the equivalence margin δ.
        alpha: the significance level.

    The property ``agrees`` is True, False or None for the three verdicts.
    """

    verdict: Verdict
    test: str
    reason: str
    p: float | None = None
    p_high: float | None = None
    p_equivalence: float | None = None
    lo: float | None = None
    hi: float | None = None
    lo_tost: float | None = None
    hi_tost: float | None = None
    target: float | None = None
    margin: float = MARGIN
    alpha: float = ALPHA

    @property
    def agrees(self) -> bool | None:
        """True (agrees), False (disagrees), None (undecided)."""
        return {"agrees": True, "disagrees": False, "undecided": None}[self.verdict]


def format_p(p: float, relation: str = "=") -> str:
    """``p = 0.016`` for a table: ``1`` near 1, two significant digits, ``p < 1e-4``
    below (``relation``: ``=``, ``>=`` or ``<=``)."""
    if p < 1e-4 and relation != ">=":
        return "p < 1e-4"
    if p >= 0.995:
        return "p = 1"
    return f"p {relation} {p:.2g}"


def _pct(level: float) -> str:
    return f"{100 * level:g}%"


def _span(lo: float, hi: float, signed: bool) -> str:
    return f"[{lo:+.2f}, {hi:+.2f}]" if signed else f"[{lo:.2f}, {hi:.2f}]"


def _around(target: float, margin: float, signed: bool) -> str:
    return f"{target:+.2f} ± {margin:.2f}" if signed else f"{target:.2f} ± {margin:.2f}"


def _check(alpha: float, margin: float, max_width: float | None) -> float:
    """Check the settings; the width limit (default WIDTH_FACTOR × margin)."""
    if not 0.0 < alpha < 0.5:
        raise StatsError(f"alpha must lie strictly between 0 and 0.5 (e.g. 0.05), got {alpha}")
    if not 0.0 < margin < 1.0:
        raise StatsError(f"the margin must lie strictly between 0 and 1 (e.g. 0.1), got {margin}")
    width = WIDTH_FACTOR * margin if max_width is None else max_width
    if width <= 0:
        raise StatsError(f"the largest interval width must be > 0, got {width}")
    return width


def rules_text(alpha: float = ALPHA, margin: float = MARGIN, max_width: float | None = None) -> str:
    """The rules in words, for a table's caption."""
    width = _check(alpha, margin, max_width)
    two, tost = _pct(1 - alpha), _pct(1 - 2 * alpha)
    return (
        f"Three verdicts, at α = {alpha:g} with an equivalence margin δ = {margin:.2f} on acc@5 "
        f"(absolute). **disagrees**: a two-sided test rejects graft = paper (one finetune: the "
        f"exact binomial test; over seeds or for a difference: the paper's value outside "
        f'graft\'s {two} interval; "A ≈ B": the Holm-adjusted exact McNemar test, or, without '
        f"a paired table, the exact McNemar test for every pairing the two hit counts allow). "
        f"**agrees**: the equivalence test passes (TOST, α per side): graft's {tost} interval "
        f"lies within the paper's value ± δ (one finetune: the exact binomial TOST; "
        f'"A ≈ B": the {tost} paired Newcombe interval of A − B within ±δ); a significant '
        f"difference smaller than δ still agrees. **undecided**: neither; always when both "
        f'sides of an "≈" sit at the floor (no hits) or the ceiling (every hit), where acc@5 '
        f"cannot show a difference, or both within δ of the floor, where neither recovers "
        f"the answer, or when the verdict depends on how two hit counts pair "
        f"up; and when graft's {two} interval is wider than {width:.2f} (too imprecise to "
        f"compare at ±δ) and the two-sided test does not reject. "
        f"Intervals over seeds: the t interval over the per-seed values widened to the pooled "
        f"Wilson interval; of a paired difference: Newcombe's interval on the pooled 2x2 table "
        f"widened to the t interval over the per-seed differences (at {two}, also to the "
        f"run's own interval)."
    )


# ---------------------------------------------------------------------- intervals
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


# ---------------------------------------------------------------------- the decision
def _decide(
    *,
    test: str,
    target: float,
    ci: Interval,
    ci_tost: Interval,
    name: str,
    rejected: bool,
    rejection: str,
    alpha: float,
    margin: float,
    width: float,
    signed: bool,
    equivalent: bool | None = None,
    equivalence: str = "",
    stuck: str = "",
    p: float | None = None,
    p_high: float | None = None,
    p_equivalence: float | None = None,
) -> Agreement:
    """The verdict from a two-sided test (``rejected``, said by ``rejection``) and the TOST
    (``equivalent``; by default: ``ci_tost`` within ``target`` ± ``margin``), with the two
    guards (``stuck``: floor or ceiling; ``ci`` wider than ``width``)."""
    base = Agreement(
        "undecided",
        test,
        "",
        p=p,
        p_high=p_high,
        p_equivalence=p_equivalence,
        lo=ci.lo,
        hi=ci.hi,
        lo_tost=ci_tost.lo,
        hi_tost=ci_tost.hi,
        target=target,
        margin=margin,
        alpha=alpha,
    )
    two, tost = _pct(1 - alpha), _pct(1 - 2 * alpha)
    if stuck:
        return replace(base, reason=stuck)
    low, high = target - margin, target + margin
    if ci.hi - ci.lo > width + 1e-12:
        # too imprecise to agree; a significant difference still disagrees (the two-sided
        # test does not need a narrow interval to reject)
        if rejected:
            reason = f"{rejection}; graft's {two} {name} {_span(ci.lo, ci.hi, signed)} is wide"
            return replace(base, verdict="disagrees", reason=reason)
        reason = (
            f"graft's {two} {name} {_span(ci.lo, ci.hi, signed)} is too wide to test "
            f"against ±{margin:.2f} (wider than {width:.2f})"
        )
        return replace(base, reason=reason)
    inside = low - 1e-12 <= ci_tost.lo and ci_tost.hi <= high + 1e-12
    equivalent = inside if equivalent is None else equivalent
    around = _around(target, margin, signed)
    tost_span = f"graft's {tost} {name} {_span(ci_tost.lo, ci_tost.hi, signed)}"
    if equivalent:
        reason = f"{tost_span} lies within {around}{equivalence}"
        if rejected:
            reason += f"; {rejection}, but by less than the margin"
        return replace(base, verdict="agrees", reason=reason)
    if rejected:
        return replace(base, verdict="disagrees", reason=rejection)
    reason = f"neither test decides: {rejection}, and {tost_span} reaches outside {around}"
    return replace(base, reason=reason)


# ---------------------------------------------------------------------- the rules
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
    width = _check(alpha, margin, max_width)
    if not 0 <= paper <= 1:
        raise StatsError(f"the paper's proportion must lie in [0, 1], got {paper}")
    if int(k) != k or int(n) != n or not 0 <= k <= n or n < 1:
        raise StatsError(f"need whole counts 0 <= k <= n, n >= 1; got k={k}, n={n}")
    k, n = int(k), int(n)
    p = float(binomtest(k, n, paper).pvalue)
    p_eq = _tost_p(k, n, paper - margin, paper + margin)
    side = "above" if k / n > paper else "below"
    if p < alpha:
        rejection = f"graft significantly {side} {paper:.2f} (exact binomial {format_p(p)})"
    else:
        rejection = f"{paper:.2f} not rejected (exact binomial {format_p(p)})"
    return _decide(
        test=f"exact binomial test, two-sided; exact binomial TOST, ±{margin:.2f}",
        target=paper,
        ci=wilson_interval(k, n, 1 - alpha),
        ci_tost=clopper_pearson_interval(k, n, 1 - 2 * alpha),
        name="interval",
        rejected=p < alpha,
        rejection=rejection,
        alpha=alpha,
        margin=margin,
        width=width,
        signed=False,
        equivalent=p_eq < alpha,
        equivalence=f" (TOST {format_p(p_eq)})",
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
    width = _check(alpha, margin, max_width)
    for lo, hi in (ci, ci_tost):
        if lo > hi:
            raise StatsError(f"interval bounds reversed: [{lo}, {hi}]")
    lo, hi = ci
    where = "inside" if lo <= paper <= hi else ("above" if paper > hi else "below")
    value = f"{paper:+.2f}" if signed else f"{paper:.2f}"
    return _decide(
        test=f"paper's value against graft's {_pct(1 - alpha)} {name}; TOST, ±{margin:.2f}",
        target=paper,
        ci=Interval(lo, hi),
        ci_tost=Interval(*ci_tost),
        name=name,
        rejected=where != "inside",
        rejection=f"{value} {where} graft's {_pct(1 - alpha)} {name} {_span(lo, hi, signed)}",
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
    _check(alpha, margin, max_width)
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


def _stuck(k_a: int, k_b: int, n: int, margin: float = 0.0) -> str:
    """Why acc@5 cannot test "A ≈ B" here, or "": both at the floor or the ceiling (no
    difference can show), or both within ``margin`` of the floor (neither graft recovers
    the answer, so their equivalence says nothing about what each adds). Near the ceiling
    an "≈" stays testable: a graft that falls short of a donor at the ceiling shows."""
    counts = f"({k_a}/{n} and {k_b}/{n})"
    if k_a == k_b == 0:
        return f"both at the floor {counts}: acc@5 cannot show a difference here"
    if k_a == k_b == n:
        return f"both at the ceiling {counts}: acc@5 cannot show a difference here"
    if max(k_a, k_b) <= margin * n:
        return (
            f"both within {margin:.2f} of the floor {counts}: neither graft recovers the "
            "answer, so their equivalence tests nothing"
        )
    return ""


def _cells(both: int, b: int, c: int, neither: int) -> tuple[int, int, int, int]:
    cells = (both, b, c, neither)
    if any(int(x) != x or x < 0 for x in cells) or sum(cells) < 1:
        raise StatsError(f"paired cells must be whole counts >= 0 with a total >= 1, got {cells}")
    return int(both), int(b), int(c), int(neither)


def mcnemar_agreement(
    p: float,
    cells: tuple[int, int, int, int],
    alpha: float = ALPHA,
    margin: float = MARGIN,
    max_width: float | None = None,
    seed_diffs: Sequence[float] | None = None,
    test: str = "exact McNemar",
) -> Agreement:
    """ "A ≈ B" on paired hits: ``p`` is the two-sided exact McNemar p of A against B (e.g.
    a run's Holm-adjusted contrast; disagrees when p < ``alpha``); ``cells`` = (both hit,
    only A, only B, neither) give the paired interval of A − B (:func:`paired_interval`,
    with ``seed_diffs`` the per-seed differences; agrees when its 90% version lies within
    ±``margin``)."""
    width = _check(alpha, margin, max_width)
    if not 0 <= p <= 1:
        raise StatsError(f"a p-value lies in [0, 1], got {p}")
    both, b, c, neither = cells = _cells(*cells)
    n = sum(cells)
    several = seed_diffs is not None and len(seed_diffs) > 1
    rejection = (
        f"significantly different ({test} {format_p(p)})"
        if p < alpha
        else f"no significant difference ({test} {format_p(p)})"
    )
    return _decide(
        test=f"{test}; TOST on A − B, ±{margin:.2f}",
        target=0.0,
        ci=paired_interval(cells, 1 - alpha, seed_diffs),
        ci_tost=paired_interval(cells, 1 - 2 * alpha, seed_diffs),
        name="interval of A − B" + (" (Newcombe, widened over seeds)" if several else ""),
        rejected=p < alpha,
        rejection=rejection,
        alpha=alpha,
        margin=margin,
        width=width,
        signed=True,
        stuck=_stuck(both + b, both + c, n, margin),
        p=p,
    )


def mcnemar_p_range(k_a: int, k_b: int, n: int) -> tuple[float, float]:
    """The smallest and largest exact McNemar p-value over every paired table of ``n``
    examples in which A hits ``k_a`` and B hits ``k_b`` (both hit x examples, for every x
    the margins allow; discordant counts ``k_a - x`` and ``k_b - x``)."""
    _check_counts(k_a, k_b, n)
    ps = [mcnemar_exact_p(k_a - x, k_b - x) for x in _pairings(k_a, k_b, n)]
    return min(ps), max(ps)


def _check_counts(k_a: int, k_b: int, n: int) -> None:
    if any(int(v) != v for v in (k_a, k_b, n)) or not (0 <= k_a <= n and 0 <= k_b <= n):
        raise StatsError(f"need whole counts 0 <= k_a, k_b <= n; got {k_a}, {k_b}, {n}")
    if n < 1:
        raise StatsError(f"need n >= 1 examples, got {n}")


def _pairings(k_a: int, k_b: int, n: int) -> range:
    """Every count of examples both hit that the margins allow."""
    return range(max(0, k_a + k_b - n), min(k_a, k_b) + 1)


def mcnemar_range_agreement(
    k_a: int,
    k_b: int,
    n: int,
    alpha: float = ALPHA,
    margin: float = MARGIN,
    max_width: float | None = None,
    seed_diffs: Sequence[float] | None = None,
) -> Agreement:
    """ "A ≈ B" from the two grafts' hit counts alone (their pairing unknown): the rule of
    :func:`mcnemar_agreement` (exact McNemar, not adjusted) for every paired table the
    counts allow; a verdict when every pairing gives it, else undecided."""
    width = _check(alpha, margin, max_width)
    _check_counts(k_a, k_b, n)
    k_a, k_b, n = int(k_a), int(k_b), int(n)
    test = "exact McNemar, any pairing of the hit counts"
    stuck = _stuck(k_a, k_b, n, margin)
    verdicts = [
        mcnemar_agreement(
            mcnemar_exact_p(k_a - x, k_b - x),
            (x, k_a - x, k_b - x, n - k_a - k_b + x),
            alpha,
            margin,
            width,
            seed_diffs,
        )
        for x in _pairings(k_a, k_b, n)
    ]
    ps = [float(v.p) for v in verdicts if v.p is not None]
    low, high = min(ps), max(ps)

    def bound(name: str, pick: Callable[[list[float]], float]) -> float:
        return pick([float(getattr(v, name)) for v in verdicts])

    base = Agreement(
        "undecided",
        f"{test}; TOST on A − B, ±{margin:.2f}",
        "",
        p=low,
        p_high=high,
        lo=bound("lo", min),
        hi=bound("hi", max),
        lo_tost=bound("lo_tost", min),
        hi_tost=bound("hi_tost", max),
        target=0.0,
        margin=margin,
        alpha=alpha,
    )
    if stuck:
        return replace(base, reason=f"{stuck}: acc@5 cannot show a difference here")
    kinds = {v.verdict for v in verdicts}
    mcnemar = f"McNemar {format_p(low)}" if low == high else f"McNemar p = {low:.2g} to {high:.2g}"
    every = "for every pairing of the hit counts"
    tost = f"graft's {_pct(1 - 2 * alpha)} interval of A − B"
    tost_env = f"[{base.lo_tost:+.2f}, {base.hi_tost:+.2f}]"
    if kinds == {"agrees"}:
        reason = f"{every}, {tost} lies within ±{margin:.2f} (all within {tost_env}; {mcnemar})"
        return replace(base, verdict="agrees", reason=reason)
    if kinds == {"disagrees"}:
        reason = f"significantly different {every} ({mcnemar})"
        return replace(base, verdict="disagrees", reason=reason)
    if kinds == {"undecided"}:
        if all("too wide" in v.reason for v in verdicts):
            reason = (
                f"graft's {_pct(1 - alpha)} interval of A − B is too wide to test against "
                f"±{margin:.2f} {every} (up to [{base.lo:+.2f}, {base.hi:+.2f}]; wider than "
                f"{width:.2f})"
            )
        else:
            reason = (
                f"neither test decides {every}: {mcnemar}, and {tost} reaches outside "
                f"±{margin:.2f} (up to {tost_env})"
            )
        return replace(base, reason=reason)
    order = [v for v in VERDICTS if v in kinds]
    reason = (
        f"the verdict depends on how the hits pair up ({' or '.join(order)}; {mcnemar}); "
        "the paired examples would decide"
    )
    return replace(base, reason=reason)
