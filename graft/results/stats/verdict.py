"""One verdict of graft against the paper (:class:`Agreement`): the settings (α, the margin
δ, the widest interval), how numbers are worded, and the decision from a two-sided test and
an equivalence test (TOST) with its two guards. The rules that feed it are
:mod:`graft.results.stats.agreement` (one number) and
:mod:`graft.results.stats.paired_agreement` ("A ≈ B")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from graft.errors import StatsError
from graft.results.stats.intervals import Interval

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


def pct(level: float) -> str:
    """A coverage in percent: ``95%``."""
    return f"{100 * level:g}%"


def span_text(lo: float, hi: float, signed: bool) -> str:
    """An interval in words: ``[0.40, 0.60]`` (``signed``: ``[-0.10, +0.05]``)."""
    return f"[{lo:+.2f}, {hi:+.2f}]" if signed else f"[{lo:.2f}, {hi:.2f}]"


def _around(target: float, margin: float, signed: bool) -> str:
    return f"{target:+.2f} ± {margin:.2f}" if signed else f"{target:.2f} ± {margin:.2f}"


def check_settings(alpha: float, margin: float, max_width: float | None) -> float:
    """Check the settings; the width limit (default WIDTH_FACTOR × margin)."""
    if not 0.0 < alpha < 0.5:
        raise StatsError(f"alpha must lie strictly between 0 and 0.5 (e.g. 0.05), got {alpha}")
    if not 0.0 < margin < 1.0:
        raise StatsError(f"the margin must lie strictly between 0 and 1 (e.g. 0.1), got {margin}")
    width = WIDTH_FACTOR * margin if max_width is None else max_width
    if width <= 0:
        raise StatsError(f"the largest interval width must be > 0, got {width}")
    return width


def decide(
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
    shortfall: str = "",
    stuck: str = "",
    p: float | None = None,
    p_high: float | None = None,
    p_equivalence: float | None = None,
) -> Agreement:
    """The verdict from a two-sided test (``rejected``, said by ``rejection``) and the TOST
    (``equivalent``; by default: ``ci_tost`` within ``target`` ± ``margin``), with the two
    guards (``stuck``: floor or ceiling; ``ci`` wider than ``width``). ``shortfall`` says why
    an equivalence test given as ``equivalent`` fails although ``ci_tost`` lies within the
    margin (the reason of that undecided verdict)."""
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
    two, tost = pct(1 - alpha), pct(1 - 2 * alpha)
    if stuck:
        return replace(base, reason=stuck)
    low, high = target - margin, target + margin
    if ci.hi - ci.lo > width + 1e-12:
        # too imprecise to agree; a significant difference still disagrees (the two-sided
        # test does not need a narrow interval to reject)
        if rejected:
            reason = f"{rejection}; graft's {two} {name} {span_text(ci.lo, ci.hi, signed)} is wide"
            return replace(base, verdict="disagrees", reason=reason)
        reason = (
            f"graft's {two} {name} {span_text(ci.lo, ci.hi, signed)} is too wide to test "
            f"against ±{margin:.2f} (wider than {width:.2f})"
        )
        return replace(base, reason=reason)
    inside = low - 1e-12 <= ci_tost.lo and ci_tost.hi <= high + 1e-12
    equivalent = inside if equivalent is None else equivalent
    around = _around(target, margin, signed)
    tost_span = f"graft's {tost} {name} {span_text(ci_tost.lo, ci_tost.hi, signed)}"
    if equivalent:
        reason = f"{tost_span} lies within {around}{equivalence}"
        if rejected:
            reason += f"; {rejection}, but by less than the margin"
        return replace(base, verdict="agrees", reason=reason)
    if rejected:
        return replace(base, verdict="disagrees", reason=rejection)
    if inside and shortfall:
        return replace(base, reason=f"neither test decides: {rejection}; {shortfall}")
    reason = f"neither test decides: {rejection}, and {tost_span} reaches outside {around}"
    return replace(base, reason=reason)
