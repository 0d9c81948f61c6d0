"""What a config field's flag is made of: the :class:`Flag` record of one flag, and the click
types and callbacks the flags use (finite float ranges, number ranges from the library's
:class:`~graft.ranges.Range`, comma-separated lists, seeds, devices, NAME=SOURCE pairs)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import click

from graft.core import SEED, Range


class _FieldDefault:
    def __repr__(self) -> str:
        return "FIELD_DEFAULT"


#: "Use the field's default" (the default of :attr:`Flag.default`).
FIELD_DEFAULT: Any = _FieldDefault()
DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass(frozen=True)
class Flag:
    """How one config field is given on the command line.

    Args:
        decl: the option's name, e.g. ``--rows-per-forward``.
        help: its help text.
        type: click type (range, choice, path); None lets click infer it from the default.
        default: the command line's default when it differs from the field's (e.g. None
            for "the preset's"); :data:`FIELD_DEFAULT` = the field's own default.
        extra: further ``click.option`` arguments (``is_flag``, ``multiple``, ``callback``,
            ``metavar``).
    """

    decl: str
    help: str
    type: Any = None
    default: Any = FIELD_DEFAULT
    extra: dict[str, Any] = field(default_factory=dict)


class FiniteFloatRange(click.FloatRange):
    """click's ``FloatRange`` that also refuses ``nan`` and ``inf`` (which it lets through
    where the range has no bound on that side)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def number_type(allowed: Range) -> click.ParamType:
    """The click type of a number in ``allowed`` (one of the config dataclasses' ranges), so
    the command line refuses what the library refuses, and ``--help`` shows the range."""
    kind = click.IntRange if allowed.integer else FiniteFloatRange
    return kind(allowed.low, allowed.high, min_open=allowed.low_open, max_open=allowed.high_open)


def csv_list(ctx, param, value):
    if value is None:
        return None
    items = tuple(item_list(ctx, param, value))
    if not items:
        raise click.BadParameter("give at least one comma-separated value")
    return items


def item_list(ctx, param, value: str) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]``; ``""`` -> ``[]``."""
    return [v.strip() for v in value.split(",") if v.strip()]


def seed_list(ctx, param, value):
    """``"0,1,2"`` -> ``(0, 1, 2)``: distinct seeds in :data:`~graft.ranges.SEED`'s
    range (None when not given)."""
    if value is None:
        return None
    items = item_list(ctx, param, value)
    if not items or not all(v.isdigit() and not SEED.problem("", int(v)) for v in items):
        raise click.BadParameter(
            f"{value!r}: give comma-separated whole numbers from 0 to {SEED.high}, e.g. 0,1,2"
        )
    seeds = tuple(int(v) for v in items)
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise click.BadParameter(f"seed {repeated[0]} is given twice; give each seed once")
    return seeds


def remote_mode_flag(ctx, param, value: bool) -> str:
    return "remote" if value else "local"


def name_sources(ctx, param, values) -> dict[str, str]:
    """``NAME=SOURCE`` words -> ``{name: source}``."""
    out = {}
    for item in values or ():
        name, sep, source = item.partition("=")
        if not sep or not name.strip() or not source.strip():
            raise click.BadParameter(f"{item!r}: write NAME=SOURCE, e.g. sft=/models/llama-sft")
        out[name.strip()] = source.strip()
    return out


class DeviceType(click.ParamType):
    """``cpu``, ``cuda``, ``cuda:N``: checked for its form when the option is parsed; whether
    this machine has it, when a run starts (a ``--dry-run`` plans a GPU job anywhere)."""

    name = "device"

    def convert(self, value, param, ctx):
        from graft.errors import DeviceError
        from graft.models import parse_device

        try:
            parse_device(value)
        except DeviceError as err:
            self.fail(str(err), param, ctx)
        return str(value)


class VerifyCount(click.ParamType):
    """``--verify``: a number of cells per prompt (0: none), or ``all`` (None)."""

    name = "K|all"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value is None:
            return value
        if str(value).strip().lower() == "all":
            return None
        try:
            count = int(value)
        except ValueError:
            count = -1
        if count < 0:
            self.fail(f"{value!r}: give a number of cells (0 or more) or 'all'", param, ctx)
        return count
