"""Prose with numbers from ``results/``: the ``prose`` generator of the ``results-table``
markers (:mod:`benchmarks.results_tables`).

A document's result sentences live in a template, ``benchmarks/prose/NAME.md``, and the
document holds what it renders between ``<!-- results-table: prose NAME -->`` and the
closing marker, so ``python -m benchmarks.results_tables --check`` fails when a digit of the
text differs from the files (edit the template, not the text). A template starts with its
sources, one ``ALIAS = FOLDER [MODEL]`` line each, then a line ``---``, then the text, where
``{{ EXPRESSION }}`` or ``{{ EXPRESSION | FORMAT }}`` is replaced by the expression's value
(formatted with Python's ``format`` and FORMAT, e.g. ``.2f``, ``.0%``, ``,``; or ``num``, a
count as the tables write it; or ``sci``, a bound such as ``4.9e-4``). Expressions
are Python over these functions only (no builtins):

- ``val("A/position_summary", "acc@5", graft="FE+LT", template="headline", n_seeds=3)``:
  the column of the one row of ``A``'s ``position_summary.csv`` with these values
  (``layer=None`` matches an empty cell); ``row(...)`` the whole row as a dict;
- ``each(values, ".2f")``: ``0.86 / 0.78 / 0.80``; ``span(values, ".2f")``: ``0.06-0.82`` (one value where both ends read alike);
- ``seed_t(values_a, values_b)``: the seed-level t test p of the per-seed differences;
- ``check("A", "Fig. 2: FE+LT ≈ SFT")``: the README table's verdict on that run (an
  :class:`~graft.results.stats.verdict.Agreement`: ``.verdict``, ``.p``, ``.lo``, ...;
  its run needs a MODEL in the sources);
- ``p(x)``: a p-value as the tables write it (``p = 0.049``, ``p < 1e-4``);
- ``json("A/finetune_log_seed1")``: ``A``'s ``finetune_log_seed1.json`` as Python values
  (a donor's training log or own evaluation: ``json(...)["train_seconds_this_session"]``);
- ``pooled(rows("A/attribution_verify", unit="LT"))``: Pearson and sign agreement of
  attribution's estimates against the real grafts over those rows taken together
  (:func:`graft.results.pooled_agreement`: ``["pearson"]``, ``["sign_agreement"]``,
  ``["moving"]``, ``["cells"]``); ``pearson_ci(rows(...))``: its Pearson's 95% percentile
  bootstrap interval over the rows' prompts (:func:`graft.results.pearson_interval`,
  2,000 resamples, seed 0), a pair ``(low, high)``;
- ``paired(rows("A/..."), rows("B/..."), "prompt", "layer")``: the rows of two tables
  with the same keys, each with its twin: a list of ``(a, b)`` pairs in ``a``'s order;
- ``means(rows("A/attribution_estimates"), "estimate", "unit", "kind", "layer")``: the mean
  of a column per group of rows, one dict per group (its keys and the mean), in order of
  first appearance;
- ``min``, ``max``, ``len``, ``sum``, ``abs``, ``sorted``.
"""

from __future__ import annotations

import functools
import json
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks import paper_table
from benchmarks._graft_api import read_csv_table
from benchmarks.table_generators import ROOT, BlockError, generator, shown
from graft.results import (
    check_run,
    format_p,
    pearson_interval,
    pooled_agreement,
    read_results,
    seed_level_p,
)

__all__ = ["TEMPLATES", "render_template"]

TEMPLATES = ROOT / "benchmarks" / "prose"
PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.S)


class _Sources:
    """The aliases of a template and the files its expressions read."""

    def __init__(self, header: str, where: str) -> None:
        self.folders: dict[str, tuple[Path, str]] = {}
        self.read: list[Path] = []
        for number, line in enumerate(header.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            alias, sep, rest = line.partition("=")
            words = rest.split()
            if not sep or not alias.strip().isidentifier() or len(words) not in (1, 2):
                raise BlockError(f"{where}:{number}: a source is 'ALIAS = FOLDER [MODEL]'")
            folder = ROOT / words[0]
            if not folder.is_dir():
                raise BlockError(f"{where}:{number}: no folder {words[0]}")
            self.folders[alias.strip()] = (folder, words[1] if len(words) == 2 else "")

    def _folder(self, alias: str) -> tuple[Path, str]:
        if alias not in self.folders:
            raise BlockError(f"unknown source {alias!r}; known: {', '.join(self.folders)}")
        return self.folders[alias]

    def rows(self, table: str, **where: Any) -> list[dict]:
        alias, _, name = table.partition("/")
        path = self._folder(alias)[0] / f"{name}.csv"
        if not path.is_file():
            raise BlockError(f"no {shown(path)}")
        self.read.append(path)
        frame = _table(path, path.stat().st_mtime_ns)
        for column, value in where.items():
            if column not in frame.columns:
                raise BlockError(f"{shown(path)} has no column {column!r}")
            cell = pl.col(column)
            frame = frame.filter(cell.is_null() if value is None else cell == value)
        return list(frame.iter_rows(named=True))

    def row(self, table: str, **where: Any) -> dict:
        found = self.rows(table, **where)
        if len(found) != 1:
            raise BlockError(f"{len(found)} rows of {table} match {where}, not one")
        return found[0]

    def val(self, table: str, column: str, **where: Any) -> Any:
        found = self.row(table, **where)
        if column not in found:
            raise BlockError(f"{table} has no column {column!r}")
        return found[column]

    def json(self, name: str) -> Any:
        alias, _, stem = name.partition("/")
        path = self._folder(alias)[0] / f"{stem}.json"
        if not path.is_file():
            raise BlockError(f"no {shown(path)}")
        self.read.append(path)
        return json.loads(path.read_text(encoding="utf-8"))

    def check(self, alias: str, finding: str) -> Any:
        folder, model = self._folder(alias)
        if not model:
            raise BlockError(f"source {alias} needs a MODEL to be checked against the paper")
        self.read += sorted(folder.glob("*_summary.csv")) + sorted(folder.glob("*_contrasts.csv"))
        stamp = tuple((p.name, p.stat().st_mtime_ns) for p in sorted(folder.glob("*.csv")))
        for found in _checks(folder, model, alias, stamp):
            if paper_table.finding(found.number) == finding:
                return found.agreement
        raise BlockError(f"no check {finding!r} on {alias}")


@functools.lru_cache(maxsize=64)
def _table(path: Path, mtime: int) -> pl.DataFrame:
    """A results table, read once per version (a template reads some a dozen times)."""
    del mtime
    return read_csv_table(path)


@functools.lru_cache(maxsize=32)
def _checks(folder: Path, model: str, alias: str, stamp: tuple) -> list:
    """check_run of a folder, once per content (``stamp``: its tables' names and mtimes;
    the exact tests take seconds, and --check renders every template)."""
    del stamp
    return check_run(read_results(folder, model, alias))


def _format(value: Any, form: str) -> str:
    """``format(value, form)``, where ``num`` writes a count or rank as the tables do:
    thousands separated, a whole number without decimals (``30,435``, ``131,502.5``), and
    ``sci`` a small bound with two digits (``4.9e-4``)."""
    if form == "sci":  # a bound as the prose writes it: 4.9e-4
        mantissa, _, exponent = f"{value:.1e}".partition("e")
        return f"{mantissa}e{int(exponent)}"
    if form != "num":
        return format(value, form)
    if float(value) == int(value):
        return f"{int(value):,}"
    return f"{value:,.1f}"


def _each(values: Sequence[float], form: str = ".2f", sep: str = " / ") -> str:
    return sep.join(_format(v, form) for v in values)


def _span(values: Sequence[float], form: str = ".2f") -> str:
    low, high = _format(min(values), form), _format(max(values), form)
    return low if low == high else f"{low}-{high}"


def _wrapped(text: str, width: int = 92) -> str:
    """Each paragraph and bullet of ``text`` on lines of at most ``width`` characters
    (placeholders span template lines; the rendered text reads as written by hand); an
    indented code block stays as written, and blank lines between paragraphs stay."""
    out: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text.strip("\n")):
        if paragraph.startswith("    "):
            out.append(paragraph)
            continue
        lines = []
        for chunk in re.split(r"\n(?=- )", paragraph):
            bullet = chunk.startswith("- ")
            lines.append(
                textwrap.fill(
                    " ".join(chunk.split()),
                    width,
                    subsequent_indent="  " if bullet else "",
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )
        out.append("\n".join(lines))
    return "\n\n".join(out)


def _seed_t(a: Sequence[float], b: Sequence[float]) -> float:
    return seed_level_p([x - y for x, y in zip(a, b, strict=True)])


def _frame(cells: Sequence[dict], function: str) -> pl.DataFrame:
    """The rows a template hands to ``function`` as one table (none: the template's error)."""
    if not cells:
        raise BlockError(f"{function}() of no rows")
    return pl.DataFrame(list(cells), infer_schema_length=None)


def _pooled(cells: Sequence[dict]) -> dict:
    return pooled_agreement(_frame(cells, "pooled"))


def _pearson_ci(cells: Sequence[dict]) -> tuple[float, float]:
    return pearson_interval(_frame(cells, "pearson_ci"))


def _paired(a: Sequence[dict], b: Sequence[dict], *keys: str) -> list[tuple[dict, dict]]:
    ours = {tuple(row[k] for k in keys): row for row in b}
    missing = [row for row in a if tuple(row[k] for k in keys) not in ours]
    if missing or len(a) != len(b):
        raise BlockError(f"paired(): the rows differ in their {', '.join(keys)}")
    return [(row, ours[tuple(row[k] for k in keys)]) for row in a]


def _means(cells: Sequence[dict], column: str, *by: str) -> list[dict]:
    groups: dict[tuple, list[float]] = {}
    for cell in cells:
        groups.setdefault(tuple(cell[key] for key in by), []).append(cell[column])
    return [
        {**dict(zip(by, key, strict=True)), column: sum(values) / len(values)}
        for key, values in groups.items()
    ]


def render_template(path: Path) -> tuple[str, list[Path]]:
    """The text of the template at ``path`` with every placeholder replaced, and the
    folders of the files it read.

    Raises:
        BlockError: no template, no ``---`` line, an unknown source, an expression that
            fails or matches other than one row, a value without a format that is not text.
    """
    if not path.is_file():
        raise BlockError(f"no template {shown(path)}")
    header, sep, body = path.read_text(encoding="utf-8").partition("\n---\n")
    if not sep:
        raise BlockError(f"{shown(path)}: the sources end with a line '---'")
    sources = _Sources(header, shown(path))
    names = {
        "row": sources.row,
        "rows": sources.rows,
        "val": sources.val,
        "check": sources.check,
        "json": sources.json,
        "each": _each,
        "span": _span,
        "seed_t": _seed_t,
        "p": format_p,
        "pooled": _pooled,
        "pearson_ci": _pearson_ci,
        "paired": _paired,
        "means": _means,
        "min": min,
        "max": max,
        "len": len,
        "sum": sum,
        "abs": abs,
        "sorted": sorted,
    }

    def fill(match: re.Match) -> str:
        text = match.group(1).strip()
        expression, bar, form = text.rpartition(" | ") if " | " in text else (text, "", "")
        try:
            # globals, not locals: a comprehension's scope sees only globals
            value = eval(expression, {"__builtins__": {}, **names})  # noqa: S307  # our templates
            if bar:
                return _format(value, form.strip())
        except BlockError as err:
            raise BlockError(f"{shown(path)}: {{{{ {text} }}}}: {err}") from None
        except Exception as err:  # noqa: BLE001  # one line naming the placeholder
            raise BlockError(
                f"{shown(path)}: {{{{ {text} }}}}: {type(err).__name__}: {err}"
            ) from None
        if not isinstance(value, str | int):
            raise BlockError(f"{shown(path)}: {{{{ {text} }}}} gives {value!r}: add ' | FORMAT'")
        return str(value)

    # the folders, not each file: a line of sources a reader can take in
    return _wrapped(PLACEHOLDER.sub(fill, body)), list(
        dict.fromkeys(p.parent for p in sources.read)
    )


@generator(
    "prose",
    "prose NAME: the text of benchmarks/prose/NAME.md with its {{ placeholders }} filled "
    "from results/ (edit the template, not the text); inline=yes: the text alone, without "
    "the blank lines and the line naming its sources (a paragraph of the README's opening)",
    keywords=("inline",),
    edit=lambda positional: f"`benchmarks/prose/{positional[0]}.md`, not this text",
)
def _prose(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    if keywords.get("inline", "yes") != "yes":
        raise BlockError(f"inline takes yes, got {keywords['inline']!r}")
    if len(positional) != 1 or not re.fullmatch(r"[\w-]+", positional[0]):
        raise BlockError(f"prose takes one template NAME, got {positional or 'none'}")
    return render_template(TEMPLATES / f"{positional[0]}.md")
