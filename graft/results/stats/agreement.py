"""Whether a graft result agrees with a number the paper states: three rules, each a test
from scipy or statsmodels (no statistics of our own).

- a proportion of one finetune, k hits of n prompts, against the paper's p:
  :func:`binomial_agreement`, scipy's exact two-sided binomial test; agrees when p >= alpha;
- a proportion over several finetunes, or a difference of two grafts, against the paper's
  value: :func:`interval_agreement`, agrees when the paper's value lies inside graft's 95%
  interval (the run's own interval: a t interval over seeds widened to the pooled Wilson
  interval, Newcombe's paired interval, a cluster bootstrap);
- an "A ≈ B" statement: :func:`mcnemar_agreement`, agrees when the paired exact McNemar test
  of A against B is not significant (p >= alpha); where only each graft's hit count is known
  (no paired table), :func:`mcnemar_p_range` bounds the McNemar p over every pairing those
  counts allow, and the verdict is given only when the whole range lies on one side of alpha.

"Agrees" for the last rule is the absence of a significant difference on n prompts, not a
proof of equality.
"""

from __future__ import annotations

from dataclasses import dataclass

from scipy.stats import binomtest

from graft.errors import StatsError
from graft.results.stats.paired import mcnemar_exact_p

ALPHA = 0.05


@dataclass(frozen=True)
class Agreement:
    """One verdict of graft against the paper.

    Args:
        agrees: True or False; None where the data at hand cannot decide.
        test: the test used, in words (e.g. "exact binomial test, two-sided").
        p: the test's p-value (the smaller and larger bound for a range; None for an
            interval rule).
        p_high: the larger bound of a p range (None unless the pairing is unknown).
        detail: the verdict in a few words, with its numbers.
    """

    agrees: bool | None
    test: str
    p: float | None
    p_high: float | None
    detail: str


def format_p(p: float, relation: str = "=") -> str:
    """``p = 0.016`` for a table: ``1`` near 1, two significant digits, ``p < 1e-4``
    below (``relation``: ``=``, ``>=`` or ``<=``)."""
    if p < 1e-4 and relation != ">=":
        return "p < 1e-4"
    if p >= 0.995:
        return "p = 1"
    return f"p {relation} {p:.2g}"


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise StatsError(f"alpha must lie strictly between 0 and 1 (e.g. 0.05), got {alpha}")


def binomial_agreement(k: int, n: int, paper: float, alpha: float = ALPHA) -> Agreement:
    """graft's ``k`` hits of ``n`` against the paper's proportion ``paper``: scipy's exact
    two-sided binomial test (``scipy.stats.binomtest``); agrees when p >= ``alpha``."""
    _check_alpha(alpha)
    if not 0 <= paper <= 1:
        raise StatsError(f"the paper's proportion must lie in [0, 1], got {paper}")
    if int(k) != k or int(n) != n or not 0 <= k <= n or n < 1:
        raise StatsError(f"need whole counts 0 <= k <= n, n >= 1; got k={k}, n={n}")
    p = float(binomtest(int(k), int(n), paper).pvalue)
    side = "above" if k / n > paper else "below"
    verdict = "not significantly different" if p >= alpha else f"graft significantly {side}"
    return Agreement(
        p >= alpha,
        "exact binomial test, two-sided",
        p,
        None,
        f"{verdict} (exact binomial {format_p(p)})",
    )


def interval_agreement(
    paper: float, lo: float, hi: float, interval: str = "95% interval"
) -> Agreement:
    """The paper's value against graft's interval ``[lo, hi]``: agrees when it lies inside
    (``interval`` names the interval for the verdict)."""
    if lo > hi:
        raise StatsError(f"interval bounds reversed: [{lo}, {hi}]")
    inside = lo <= paper <= hi
    where = "inside" if inside else ("above" if paper > hi else "below")
    return Agreement(
        inside,
        f"paper's value inside graft's {interval}",
        None,
        None,
        f"{paper:+.2f} {where} graft's {interval} [{lo:+.2f}, {hi:+.2f}]",
    )


def mcnemar_agreement(p: float, alpha: float = ALPHA, test: str = "exact McNemar") -> Agreement:
    """ "A ≈ B" from a paired exact McNemar p-value of A against B (e.g. a run's
    Holm-adjusted contrast): agrees when p >= ``alpha``."""
    _check_alpha(alpha)
    if not 0 <= p <= 1:
        raise StatsError(f"a p-value lies in [0, 1], got {p}")
    verdict = "not significantly different" if p >= alpha else "significantly different"
    return Agreement(p >= alpha, test, p, None, f"{verdict} ({test} {format_p(p)})")


def mcnemar_p_range(k_a: int, k_b: int, n: int) -> tuple[float, float]:
    """The smallest and largest exact McNemar p-value over every paired table of ``n``
    examples in which A hits ``k_a`` and B hits ``k_b`` (both hit x examples, for every x
    the margins allow; discordant counts ``k_a - x`` and ``k_b - x``)."""
    if any(int(v) != v for v in (k_a, k_b, n)) or not (0 <= k_a <= n and 0 <= k_b <= n):
        raise StatsError(f"need whole counts 0 <= k_a, k_b <= n; got {k_a}, {k_b}, {n}")
    both = range(max(0, k_a + k_b - n), min(k_a, k_b) + 1)
    ps = [mcnemar_exact_p(k_a - x, k_b - x) for x in both]
    return min(ps), max(ps)


def mcnemar_range_agreement(k_a: int, k_b: int, n: int, alpha: float = ALPHA) -> Agreement:
    """ "A ≈ B" from the two grafts' hit counts alone (their pairing unknown): agrees when
    the exact McNemar test is not significant for any pairing the counts allow, disagrees
    when it is significant for every one, and is undecided (None) otherwise."""
    _check_alpha(alpha)
    low, high = mcnemar_p_range(k_a, k_b, n)
    test = "exact McNemar, any pairing of the hit counts"
    if low >= alpha:
        return Agreement(
            True,
            test,
            low,
            high,
            f"not significantly different (McNemar {format_p(low, '>=')} for every pairing)",
        )
    if high < alpha:
        return Agreement(
            False,
            test,
            low,
            high,
            f"significantly different (McNemar {format_p(high, '<=')} for every pairing)",
        )
    return Agreement(
        None,
        test,
        low,
        high,
        f"undecided without the paired examples (McNemar {format_p(low)} to {high:.2g})",
    )
