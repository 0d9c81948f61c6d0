"""One verdict of graft against the paper as data (:class:`Agreement`: the verdict, the
rule that gave it, the test and its numbers), the settings (α, the margin δ, the widest
interval), and the decision from a two-sided test and an equivalence test (TOST) with the
width guard. The rules that feed it are :mod:`graft.results.stats.agreement` (one number)
and :mod:`graft.results.stats.paired_agreement` ("A ≈ B"); its words are
:mod:`graft.results.stats.wording`'s."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from graft.errors import StatsError
from graft.results.stats.intervals import Interval

__all__ = [
    "ALPHA",
    "MARGIN",
    "VERDICTS",
    "WIDTH_FACTOR",
    "Agreement",
    "Floor",
    "Reason",
    "TwoSided",
    "Verdict",
    "check_settings",
    "decide",
]

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

#: Why a verdict was given, one code per rule (the words are
#: :mod:`graft.results.stats.wording`'s):
#:
#: - ``floor``, ``ceiling``, ``near_floor``: both sides at the floor, the ceiling, or within
#:   δ of the floor (:attr:`Agreement.floor` holds the counts); undecided, unless the
#:   two-sided test of A against B rejects (then the verdict of the rule below stands, with
#:   the floor noted);
#: - ``too_wide``: graft's 95% interval is wider than the width limit (undecided);
#:   ``wide_but_different``: so, but the two-sided test rejects (disagrees);
#: - ``equivalent``: the TOST passes (agrees); ``different``: the two-sided test rejects
#:   (disagrees); ``exact_short``: the 90% interval lies within the margin, but the exact
#:   unconditional TOST does not reject (undecided); ``neither``: neither test decides;
#: - ``pairings_equivalent``, ``pairings_different``, ``pairings_too_wide``,
#:   ``pairings_neither``: the same for every pairing two hit counts allow;
#:   ``pairings_split``: the pairings disagree (undecided).
Reason = Literal[
    "floor",
    "ceiling",
    "near_floor",
    "too_wide",
    "wide_but_different",
    "equivalent",
    "different",
    "exact_short",
    "neither",
    "pairings_equivalent",
    "pairings_different",
    "pairings_too_wide",
    "pairings_neither",
    "pairings_split",
]

TestKind = Literal["binomial", "interval", "mcnemar", "mcnemar_pairings"]


@dataclass(frozen=True)
class TwoSided:
    """The two-sided test of a verdict and what it found.

    Args:
        kind: ``binomial`` (graft's k of n against the paper's proportion, exact),
            ``interval`` (the paper's value against graft's 95% interval), ``mcnemar``
            (A against B on their paired table, exact McNemar) or ``mcnemar_pairings``
            (the same over every pairing two hit counts allow).
        rejected: whether it rejects at α.
        value: the value tested (the paper's; None for A against B).
        side: where graft lies against ``value`` (``above``, ``below``) for ``binomial``;
            where ``value`` lies against graft's interval (``inside``, ``above``,
            ``below``) for ``interval``; "" otherwise.
        seeds: the finetune seeds whose per-seed differences the seed-level t test reads
            (McNemar over seeds: both tests must reject); 1 for one finetune.
        family: the Holm family its p is adjusted within, named ("" for none).
    """

    kind: TestKind
    rejected: bool
    value: float | None = None
    side: str = ""
    seeds: int = 1
    family: str = ""


@dataclass(frozen=True)
class Floor:
    """Where acc@5 cannot test a comparison: both sides at the floor (``floor``), the
    ceiling (``ceiling``) or within ``margin`` of the floor (``near_floor``).

    Args:
        kind: ``floor``, ``ceiling`` or ``near_floor``.
        k_a: A's hits.
        k_b: B's hits.
        n: the prompts (pooled over seeds).
        margin: the margin of ``near_floor``.
    """

    kind: Literal["floor", "ceiling", "near_floor"]
    k_a: int
    k_b: int
    n: int
    margin: float = 0.0


@dataclass(frozen=True)
class Agreement:
    """One verdict of graft against the paper, as data: the verdict, the rule that gave it,
    the test and the numbers. Its words come from one renderer,
    :mod:`graft.results.stats.wording` (``test_text``, ``reason_text``, ``short_text``), which
    imports this module and not the other way round.

    Args:
        verdict: ``"agrees"``, ``"disagrees"`` or ``"undecided"``.
        code: the rule that gave it (:data:`Reason`).
        two_sided: the two-sided test and what it found (:class:`TwoSided`).
        interval: the name of graft's interval (``interval``, ``interval over 3 seeds``,
            ``interval of A − B``, ...).
        signed: whether values are differences (written with a sign).
        width: the widest 95% interval that can be tested against the margin.
        floor: the floor or ceiling the two sides sit at, None elsewhere; with
            ``verdict`` "disagrees" the two-sided test found A and B different there.
        discordant: (only A, only B, n) of a paired table, where the exact unconditional
            TOST decides (``mcnemar``); None elsewhere.
        widened_to: for a difference against the paper: the run's own 95% interval that
            Newcombe's paired interval is widened to (e.g. ``cluster bootstrap``), "" for
            none.
        pairing_verdicts: the verdicts the pairings of two hit counts give
            (``pairings_split``), in :data:`VERDICTS` order; () elsewhere.
        p: the two-sided test's p-value (exact binomial; exact McNemar, over seeds with the
            seed-level t test, Holm-adjusted within ``two_sided.family``); the smallest
            over pairings for a range; None for an interval rule.
        p_high: the largest McNemar p-value over the pairings the hit counts allow (None
            unless the pairing is unknown).
        p_equivalence: the exact TOST p-value (statsmodels' ``binom_tost`` for one
            finetune; the exact unconditional TOST of a paired difference); None where the
            equivalence test reads the 90% interval alone.
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
    code: Reason
    two_sided: TwoSided
    interval: str = "interval"
    signed: bool = False
    width: float = WIDTH_FACTOR * MARGIN
    floor: Floor | None = None
    discordant: tuple[int, int, int] | None = None
    widened_to: str = ""
    pairing_verdicts: tuple[Verdict, ...] = ()
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
    two_sided: TwoSided,
    target: float,
    ci: Interval,
    ci_tost: Interval,
    interval: str,
    alpha: float,
    margin: float,
    width: float,
    signed: bool,
    equivalent: bool | None = None,
    exact_short: bool = False,
    discordant: tuple[int, int, int] | None = None,
    p: float | None = None,
    p_equivalence: float | None = None,
) -> Agreement:
    """The verdict from a two-sided test (``two_sided.rejected``) and the TOST
    (``equivalent``; by default: ``ci_tost`` within ``target`` ± ``margin``), with the width
    guard (``ci`` wider than ``width``: undecided unless the two-sided test rejects).
    ``exact_short``: the equivalence test given as ``equivalent`` is an exact one that
    fails although ``ci_tost`` lies within the margin (``exact_short``, undecided)."""
    base = Agreement(
        "undecided",
        "neither",
        two_sided,
        interval=interval,
        signed=signed,
        width=width,
        discordant=discordant,
        p=p,
        p_equivalence=p_equivalence,
        lo=ci.lo,
        hi=ci.hi,
        lo_tost=ci_tost.lo,
        hi_tost=ci_tost.hi,
        target=target,
        margin=margin,
        alpha=alpha,
    )
    rejected = two_sided.rejected
    if ci.hi - ci.lo > width + 1e-12:
        # too imprecise to agree; a significant difference still disagrees (the two-sided
        # test does not need a narrow interval to reject)
        if rejected:
            return replace(base, verdict="disagrees", code="wide_but_different")
        return replace(base, code="too_wide")
    inside = target - margin - 1e-12 <= ci_tost.lo and ci_tost.hi <= target + margin + 1e-12
    if inside if equivalent is None else equivalent:
        return replace(base, verdict="agrees", code="equivalent")
    if rejected:
        return replace(base, verdict="disagrees", code="different")
    if inside and exact_short:
        return replace(base, code="exact_short")
    return base
