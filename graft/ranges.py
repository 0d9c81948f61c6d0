"""The allowed range of a numeric setting, checked in one place.

Each config dataclass (:class:`~graft.study.specs.presets.FinetuneConfig`,
:class:`~graft.study.specs.config.ExperimentConfig`, :class:`~graft.study.specs.config.DatasetConfig`,
:class:`~graft.remote.config.RemoteConfig`) names a :class:`Range` per numeric field and
refuses a value outside it with a one-line error naming the field; the command line builds
its option types from the same ranges (``experiments/options.py``), so the library and the
command line refuse the same values. ``nan`` and ``inf`` are outside every range.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: The largest seed numpy's and torch's generators take (``numpy.random.seed``: 0..2**32-1).
MAX_SEED = 2**32 - 1


def _number(x: float) -> str:
    """``x`` as written in a message: ``4294967295``, ``0.5``, ``1e-06``."""
    return str(x) if isinstance(x, int) else f"{x:g}"


@dataclass(frozen=True)
class Range:
    """Where a number may lie: ``low`` (excluded when ``low_open``) to ``high``, finite.

    Args:
        low: smallest allowed value (None: no lower bound).
        high: largest allowed value (None: no upper bound; ``inf`` is still refused).
        low_open: ``low`` itself is excluded (e.g. a learning rate > 0).
        integer: whole numbers only (``bool`` is refused).
        high_open: ``high`` itself is excluded (e.g. a fraction below 1).
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    integer: bool = False
    high_open: bool = False

    def _low_text(self) -> str | None:
        if self.low is None:
            return None
        if self.low == 0:
            return "positive" if self.low_open else ">= 0"
        return (
            f"greater than {_number(self.low)}"
            if self.low_open
            else f"at least {_number(self.low)}"
        )

    def _high_text(self) -> str:
        return f"{'below' if self.high_open else 'at most'} {_number(self.high or 0)}"

    def text(self) -> str:
        """The range in words, e.g. ``positive and at most 1``."""
        high = None if self.high is None else self._high_text()
        return " and ".join(t for t in (self._low_text(), high) if t) or "any finite number"

    def problem(self, name: str, value: Any) -> str | None:
        """A one-line message when ``value`` is outside the range (naming ``name``), else None."""
        kind = numbers.Integral if self.integer else numbers.Real
        finite = isinstance(value, kind) and not isinstance(value, bool)
        if not finite or not math.isfinite(value):
            what = "a whole number" if self.integer else "a finite number"
            return f"{name} must be {what} ({self.text()}), got {value!r}"
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return f"{name} must be {self._low_text()}, got {value!r}"
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return f"{name} must be {self._high_text()}, got {value!r}"
        return None


#: A seed numpy and torch accept.
SEED = Range(0, MAX_SEED, integer=True)
#: A count of at least one.
COUNT = Range(1, integer=True)


def first_problem(
    ranges: dict[str, Range], values: Any, skip: Iterable[str] = ()
) -> tuple[str, str] | None:
    """(field, message) of the first field of ``values`` (an object with those attributes)
    outside its range in ``ranges``; fields set to None and those in ``skip`` are not
    checked."""
    for name, allowed in ranges.items():
        value = getattr(values, name)
        problem = None if name in skip or value is None else allowed.problem(name, value)
        if problem:
            return name, problem
    return None
