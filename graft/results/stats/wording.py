"""The words of a verdict: one renderer for :class:`~graft.results.stats.verdict.Agreement`,
which holds only data (the verdict, the rule that gave it, the test, the numbers).

- :func:`test_text`: the tests, named (``exact binomial test, two-sided; exact binomial
  TOST, ±0.10``);
- :func:`reason_text`: why, in a sentence with its numbers (the full tables);
- :func:`short_text`: the deciding numbers in a phrase of at most ~150 characters (the
  README's cells; the full reason one link away).

Numbers are written as the tables write them: :func:`format_p`, :func:`span_text`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the words read the verdict; the verdict imports no words
    from graft.results.stats.verdict import Agreement, Floor

__all__ = [
    "floor_text",
    "format_p",
    "pct",
    "reason_text",
    "short_text",
    "span_text",
    "test_text",
    "test_words",
]

EVERY_PAIRING = "for every pairing of the hit counts"


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


def _num(value: float | None) -> float:
    """A number the rule that gave the verdict computed (None only where it did not)."""
    if value is None:
        raise ValueError("the rule did not compute the number its words need")  # programming error
    return value


def _value(value: float, signed: bool) -> str:
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def _around(a: Agreement) -> str:
    return f"{_value(float(a.target or 0.0), a.signed)} ± {a.margin:.2f}"


def _within(a: Agreement) -> str:
    """The equivalence region in a short phrase: ``±0.10`` around 0, else ``0.53 ± 0.10``."""
    return f"±{a.margin:.2f}" if a.signed and not a.target else _around(a)


def test_words(seeds: int, family: str = "", pairings: bool = False) -> str:
    """How the two-sided test of "A ≈ B" is named: exact McNemar, over several ``seeds``
    with the seed-level t test, over every pairing of the hit counts (``pairings``),
    Holm-adjusted within ``family`` (named) where there is one."""
    return (
        "exact McNemar"
        + (" and seed-level t test (both must reject)" if seeds > 1 else "")
        + (", any pairing of the hit counts" if pairings else "")
        + (f", Holm over {family}" if family else "")
    )


def floor_text(floor: Floor) -> str:
    """Why acc@5 cannot test the comparison, with the two hit counts."""
    counts = f"({floor.k_a}/{floor.n} and {floor.k_b}/{floor.n})"
    if floor.kind == "near_floor":
        return (
            f"both within {floor.margin:.2f} of the floor {counts}: neither graft recovers the "
            "answer, so comparing the two tests nothing"
        )
    return f"both at the {floor.kind} {counts}: acc@5 cannot show a difference here"


def test_text(a: Agreement) -> str:
    """The tests of ``a``, in words."""
    test, margin = a.two_sided, f"±{a.margin:.2f}"
    if test.kind == "binomial":
        return f"exact binomial test, two-sided; exact binomial TOST, {margin}"
    if test.kind == "interval":
        text = f"paper's value against graft's {pct(1 - a.alpha)} {a.interval}; TOST, {margin}"
        if a.widened_to:
            how = "Newcombe's paired interval" + (
                ", widened to the t over seeds" if test.seeds > 1 else ""
            )
            text += f"; {how}, and to the run's own 95% {a.widened_to}"
        return text
    if test.kind == "mcnemar":
        words = test_words(test.seeds, test.family)
        return f"{words}; TOST on A − B, {margin} (interval and exact unconditional)"
    return f"{test_words(test.seeds, test.family, pairings=True)}; TOST on A − B, {margin}"


def _rejection(a: Agreement) -> str:
    """What the two-sided test found, in words."""
    test = a.two_sided
    if test.kind == "binomial":
        p = format_p(_num(a.p))
        if test.rejected:
            return f"graft significantly {test.side} {test.value:.2f} (exact binomial {p})"
        return f"{test.value:.2f} not rejected (exact binomial {p})"
    if test.kind == "interval":
        span = span_text(_num(a.lo), _num(a.hi), a.signed)
        value = _value(float(test.value or 0.0), a.signed)
        return f"{value} {test.side} graft's {pct(1 - a.alpha)} {a.interval} {span}"
    p = f"{test_words(test.seeds, test.family)} {format_p(_num(a.p))}"
    return f"significantly different ({p})" if test.rejected else f"no significant difference ({p})"


def _pairings_p(a: Agreement) -> str:
    low, high = _num(a.p), _num(a.p_high if a.p_high is not None else a.p)
    return f"two-sided {format_p(low)}" if low == high else f"p = {low:.2g} to {high:.2g}"


def _exact_tost(a: Agreement) -> str:
    return f"exact unconditional TOST {format_p(_num(a.p_equivalence))}"


def _rule_text(a: Agreement) -> str:
    """The reason of the rule that gave ``a`` (before any floor note)."""
    two, tost = pct(1 - a.alpha), pct(1 - 2 * a.alpha)
    margin = f"±{a.margin:.2f}"
    tost_span = (
        f"graft's {tost} {a.interval} {span_text(_num(a.lo_tost), _num(a.hi_tost), a.signed)}"
    )
    code = a.code
    if code == "too_wide":
        return (
            f"graft's {two} {a.interval} {span_text(_num(a.lo), _num(a.hi), a.signed)} is too wide to "
            f"test against {margin} (wider than {a.width:.2f})"
        )
    if code == "wide_but_different":
        return f"{_rejection(a)}; graft's {two} {a.interval} {span_text(_num(a.lo), _num(a.hi), a.signed)} is wide"
    if code == "equivalent":
        exact = ""
        if a.two_sided.kind == "binomial":
            exact = f" (TOST {format_p(_num(a.p_equivalence))})"
        elif a.two_sided.kind == "mcnemar":
            exact = f" and the {_exact_tost(a)}"
        text = f"{tost_span} lies within {_around(a)}{exact}"
        if a.two_sided.rejected:
            text += f"; {_rejection(a)}, but by less than the margin"
        return text
    if code == "different":
        return _rejection(a)
    if code == "exact_short":
        b, c, n = a.discordant or (0, 0, 0)
        return (
            f"neither test decides: {_rejection(a)}; graft's {tost} interval of A − B lies "
            f"within {margin}, but the {_exact_tost(a)} does not reject (with {b} and {c} "
            f"discordant of {n}, the asymptotic interval is not enough)"
        )
    if code == "neither":
        return (
            f"neither test decides: {_rejection(a)}, and {tost_span} reaches outside {_around(a)}"
        )
    tost_ab = f"graft's {tost} interval of A − B"
    envelope = f"[{_num(a.lo_tost):+.2f}, {_num(a.hi_tost):+.2f}]"  # over every pairing
    if code == "pairings_equivalent":
        return (
            f"{EVERY_PAIRING}, {tost_ab} lies within {margin} (all within {envelope}; "
            f"{_pairings_p(a)})"
        )
    if code == "pairings_different":
        return f"significantly different {EVERY_PAIRING} ({_pairings_p(a)})"
    if code == "pairings_too_wide":
        return (
            f"graft's {two} interval of A − B is too wide to test against {margin} "
            f"{EVERY_PAIRING} (up to [{a.lo:+.2f}, {a.hi:+.2f}]; wider than {a.width:.2f})"
        )
    if code == "pairings_neither":
        return (
            f"neither test decides {EVERY_PAIRING}: {_pairings_p(a)}, and {tost_ab} reaches "
            f"outside {margin} (up to {envelope})"
        )
    if code == "pairings_split":
        return (
            f"the verdict depends on how the hits pair up ({' or '.join(a.pairing_verdicts)}; "
            f"{_pairings_p(a)}); the paired examples would decide"
        )
    raise ValueError(f"no words for the rule {code!r}")  # programming error


def reason_text(a: Agreement) -> str:
    """Why ``a`` has its verdict, in a sentence with its numbers."""
    if a.floor is not None and a.verdict != "disagrees":
        return floor_text(a.floor)
    text = _rule_text(a)
    if a.floor is not None:  # a difference the two-sided test finds, on the floor
        return f"{text} ({floor_text(a.floor).split(':')[0]}, but A and B differ)"
    return text


def short_text(a: Agreement) -> str:
    """The deciding numbers of ``a`` in a short phrase (a table cell; the verdict word
    itself is the caller's)."""
    code, test = a.code, a.two_sided
    if a.floor is not None and a.verdict != "disagrees":
        f = a.floor
        where = {"floor": "at the floor", "ceiling": "at the ceiling"}.get(
            f.kind, f"within {f.margin:.2f} of the floor"
        )
        return f"both {where} ({f.k_a}/{f.n}, {f.k_b}/{f.n}): acc@5 cannot compare them"
    tost = pct(1 - 2 * a.alpha)
    if code in ("too_wide", "pairings_too_wide"):
        span = span_text(_num(a.lo), _num(a.hi), a.signed)
        return f"{pct(1 - a.alpha)} interval {span} too wide for ±{a.margin:.2f}"
    if code in ("equivalent", "pairings_equivalent"):
        span = span_text(_num(a.lo_tost), _num(a.hi_tost), a.signed)
        return f"{tost} interval {span} within {_within(a)}"
    if code == "pairings_split":
        return "depends on how the hits pair up"
    if test.kind == "interval":
        found = _rejection(a).replace("graft's ", "")
    elif test.kind == "binomial":
        found = f"exact binomial {format_p(_num(a.p))}"
    else:
        p = _pairings_p(a).removeprefix("two-sided ") if code.startswith("pairings") else None
        found = (
            f"McNemar{' and seed-level t test' if test.seeds > 1 else ''} "
            f"{p or format_p(_num(a.p))}" + (" (Holm)" if test.family else "")
        )
    if code in ("different", "wide_but_different", "pairings_different"):
        if test.kind == "binomial":
            found = f"graft {test.side} {test.value:.2f} ({found})"
        elif test.kind != "interval":
            found = f"A and B differ ({found})"
        return found + (" at the floor" if a.floor is not None else "")
    if code == "exact_short":
        b, c, n = a.discordant or (0, 0, 0)
        return f"{found}; exact TOST {format_p(_num(a.p_equivalence))} ({b}, {c} discordant of {n})"
    span = span_text(_num(a.lo_tost), _num(a.hi_tost), a.signed)
    return f"{found}; {tost} interval {span} not within {_within(a)}"
