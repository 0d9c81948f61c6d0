"""Quantiles of the beta, Student-t and normal distributions, from the regularized incomplete
beta function (a continued fraction), so graft's statistics need no scipy."""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist

from graft.errors import StatsError

_CF_MAX_ITER = 100_000
_CF_EPS = 1e-16
_TINY = 1e-300


def check_level(level: float) -> None:
    """Raise :class:`~graft.errors.StatsError` unless ``0 < level < 1``."""
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
