""" "A ≈ B", a paper claim that two grafts score alike, tested on paired hits: the exact
McNemar test against the paired (Newcombe) interval of A − B, from a run's paired table or,
without one, over every pairing the two hit counts allow (a verdict only when all give it);
and the floor and ceiling where acc@5 cannot test it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from graft.errors import StatsError
from graft.results.stats.intervals import paired_interval
from graft.results.stats.paired import mcnemar_exact_p, over_seeds_p, paired_tost_p
from graft.results.stats.verdict import (
    ALPHA,
    MARGIN,
    VERDICTS,
    Agreement,
    Floor,
    TwoSided,
    check_settings,
    decide,
)


def floor_or_ceiling(k_a: int, k_b: int, n: int, margin: float = 0.0) -> Floor | None:
    """Where acc@5 cannot test "A ≈ B" (or A − B against a value), or None: both at the
    floor or the ceiling (no difference can show), or both within ``margin`` of the floor
    (neither graft recovers the answer, so their equivalence says nothing about what each
    adds). Near the ceiling an "≈" stays testable: a graft that falls short of a donor at
    the ceiling shows. The guard only keeps a verdict from being read off the floor: a
    difference that the two-sided test finds (0/150 against 15/150) is decided as anywhere
    else (:func:`guarded`)."""
    if k_a == k_b == 0:
        return Floor("floor", k_a, k_b, n)
    if k_a == k_b == n:
        return Floor("ceiling", k_a, k_b, n)
    if max(k_a, k_b) <= margin * n:
        return Floor("near_floor", k_a, k_b, n, margin)
    return None


def guarded(floor: Floor | None, rejected: bool, decision: Agreement) -> Agreement:
    """``decision`` under the floor and ceiling guard. Where the sides sit at the floor or
    the ceiling (``floor`` not None) only a disagreement backed by the two-sided test of A
    against B (``rejected``) stands, the floor noted; anything else there is undecided,
    for the floor's reason (an equivalence of two grafts that recover nothing tests
    nothing)."""
    if floor is None:
        return decision
    if rejected and decision.verdict == "disagrees":
        return replace(decision, floor=floor)
    return replace(decision, verdict="undecided", code=floor.kind, floor=floor)


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
    family: str = "",
) -> Agreement:
    """ "A ≈ B" on paired hits: ``p`` is the two-sided exact McNemar p of A against B (over
    seeds the larger of it and the seed-level t test; Holm-adjusted within ``family``,
    named, where there is one; disagrees when p < ``alpha``); ``cells`` = (both hit, only
    A, only B, neither) give the paired interval of A − B
    (:func:`~graft.results.stats.intervals.paired_interval`, with ``seed_diffs`` the
    per-seed differences). Agrees when its 90% version lies within ±``margin`` and the exact
    unconditional TOST (:func:`~graft.results.stats.paired.paired_tost_p`) rejects both
    one-sided nulls at ``alpha``: Newcombe's interval is asymptotic, and with few discordant
    pairs it passes where an exact test does not (2 and 1 discordant of 50)."""
    width = check_settings(alpha, margin, max_width)
    if not 0 <= p <= 1:
        raise StatsError(f"a p-value lies in [0, 1], got {p}")
    both, b, c, neither = cells = _cells(*cells)
    n = sum(cells)
    seeds = len(seed_diffs) if seed_diffs is not None else 1
    ci_tost = paired_interval(cells, 1 - 2 * alpha, seed_diffs)
    inside = -margin - 1e-12 <= ci_tost.lo and ci_tost.hi <= margin + 1e-12
    p_exact = paired_tost_p(b, c, n, margin)
    decision = decide(
        two_sided=TwoSided("mcnemar", p < alpha, seeds=seeds, family=family),
        target=0.0,
        ci=paired_interval(cells, 1 - alpha, seed_diffs),
        ci_tost=ci_tost,
        interval="interval of A − B" + (" (Newcombe, widened over seeds)" if seeds > 1 else ""),
        alpha=alpha,
        margin=margin,
        width=width,
        signed=True,
        equivalent=inside and p_exact < alpha,
        exact_short=True,
        discordant=(b, c, n),
        p=p,
        p_equivalence=p_exact,
    )
    return guarded(floor_or_ceiling(both + b, both + c, n, margin), p < alpha, decision)


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
    adjust: Callable[[float], float] | None = None,
    family: str = "",
) -> Agreement:
    """ "A ≈ B" from the two grafts' hit counts alone (their pairing unknown): the rule of
    :func:`mcnemar_agreement` for every paired table the counts allow; a verdict when every
    pairing gives it, else undecided. Each pairing's p is the exact McNemar p, over seeds
    the larger of it and the seed-level t test (:func:`~graft.results.stats.paired.
    over_seeds_p`), then ``adjust``-ed (e.g. Holm within the question's ``family``, named in
    the test's words)."""
    width = check_settings(alpha, margin, max_width)
    _check_counts(k_a, k_b, n)
    k_a, k_b, n = int(k_a), int(k_b), int(n)
    seeds = len(seed_diffs) if seed_diffs is not None else 1
    floor = floor_or_ceiling(k_a, k_b, n, margin)
    adjusted = adjust or (lambda p: p)
    verdicts = [
        mcnemar_agreement(
            adjusted(over_seeds_p(mcnemar_exact_p(k_a - x, k_b - x), seed_diffs)),
            (x, k_a - x, k_b - x, n - k_a - k_b + x),
            alpha,
            margin,
            width,
            seed_diffs,
        )
        for x in _pairings(k_a, k_b, n)
    ]
    ps = [float(v.p) for v in verdicts if v.p is not None]

    def bound(name: str, pick: Callable[[list[float]], float]) -> float:
        return pick([float(getattr(v, name)) for v in verdicts])

    kinds = {v.verdict for v in verdicts}
    base = Agreement(
        "undecided",
        "pairings_neither",
        TwoSided("mcnemar_pairings", kinds == {"disagrees"}, seeds=seeds, family=family),
        interval="interval of A − B",
        signed=True,
        width=width,
        p=min(ps),
        p_high=max(ps),
        lo=bound("lo", min),
        hi=bound("hi", max),
        lo_tost=bound("lo_tost", min),
        hi_tost=bound("hi_tost", max),
        target=0.0,
        margin=margin,
        alpha=alpha,
    )
    if floor is not None and kinds == {"undecided"}:
        return replace(base, code=floor.kind, floor=floor)
    if kinds == {"agrees"}:
        return replace(base, verdict="agrees", code="pairings_equivalent")
    if kinds == {"disagrees"}:
        return guarded(floor, True, replace(base, verdict="disagrees", code="pairings_different"))
    if kinds == {"undecided"}:
        wide = all(v.code == "too_wide" for v in verdicts)
        return replace(base, code="pairings_too_wide" if wide else "pairings_neither")
    order = tuple(v for v in VERDICTS if v in kinds)
    return replace(base, code="pairings_split", pairing_verdicts=order)
