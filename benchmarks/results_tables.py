"""Write the result tables of README.md and docs/**/*.md from the ``results/`` folders.

Every table the documents show from a results folder sits between two markers::

    <!-- results-table: summary results/smollm2-cpu-seeds012 experiment=position -->
    (generated: the table, then the line naming the command that regenerates it)
    <!-- /results-table -->

Markers start their line (not indented, not inside a fenced code block). The opening marker
names a generator of :data:`GENERATORS` (:mod:`benchmarks.table_generators`) and its
arguments (split as a shell splits them: positional arguments, and ``key=value`` for the
generator's keywords).
Run from the repository root::

    python -m benchmarks.results_tables           # rewrite every block
    python -m benchmarks.results_tables --check   # exit 1 listing (with a diff) each block that differs
    python -m benchmarks.results_tables --list    # the generators and their arguments

Folders in markers are relative to the repository root. A bad marker (an unknown generator,
a marker never closed, a closing marker without an opening one, bad arguments, a missing
file) is one line naming the document and line, exit 2.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from benchmarks import (  # noqa: F401  # register their generators
    attribution_tables,
    prose,
    results_pages,
    run_tables,
)
from benchmarks._graft_api import GraftError
from benchmarks.table_generators import GENERATORS, ROOT, BlockError, Generator, shown

# the generators and the error as the tests import them from here
__all__ = [
    "COMMAND",
    "GENERATORS",
    "Block",
    "BlockError",
    "Difference",
    "check",
    "documents",
    "find_blocks",
    "main",
    "parse_spec",
    "regenerate",
    "render",
]

COMMAND = "python -m benchmarks.results_tables"
# markers start their line (an indented one is a code block's text, as is one inside a fence)
OPEN = re.compile(r"^<!--\s*results-table:(.*?)-->\s*$")
CLOSE = re.compile(r"^<!--\s*/results-table\s*-->\s*$")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
CLOSE_MARKER = "<!-- /results-table -->"


@dataclass
class Block:
    """One marked block of a document: the marker's line (1-based), its generator and
    arguments, and the lines between the markers (``start`` to ``end``, 0-based, end
    exclusive: ``end`` is the closing marker's line)."""

    path: Path
    line: int
    spec: str
    generator: Generator
    positional: list[str]
    keywords: dict[str, str]
    start: int
    end: int

    @property
    def where(self) -> str:
        return f"{shown(self.path)}:{self.line}"


def parse_spec(spec: str, where: str) -> tuple[Generator, list[str], dict[str, str]]:
    """The generator and arguments a marker's text names."""
    try:
        words = shlex.split(spec)
    except ValueError as err:
        raise BlockError(f"{where}: cannot read the marker's arguments ({err})") from None
    if not words:
        raise BlockError(f"{where}: the marker names no generator; known: {', '.join(GENERATORS)}")
    name, args = words[0], words[1:]
    if name not in GENERATORS:
        raise BlockError(
            f"{where}: unknown generator {name!r}; known: {', '.join(sorted(GENERATORS))}"
        )
    gen = GENERATORS[name]
    keywords, positional = {}, []
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key in gen.keywords:
            keywords[key] = value
        else:
            positional.append(arg)
    return gen, positional, keywords


def find_blocks(text: str, path: Path) -> list[Block]:
    """The marked blocks of the document ``text`` (at ``path``).

    Raises:
        BlockError: a marker opened inside another, never closed, or closed without one
            opened; an unknown generator or unreadable arguments.
    """
    blocks: list[Block] = []
    lines = text.splitlines()
    opened: tuple[int, str] | None = None
    fence: str | None = None
    for index, line in enumerate(lines):
        where = f"{shown(path)}:{index + 1}"
        mark = FENCE.match(line)
        if mark and opened is None:
            fence = None if fence == mark.group(1) else (fence or mark.group(1))
        if fence is not None:
            continue
        match = OPEN.match(line)
        if match:
            if opened is not None:
                raise BlockError(
                    f"{where}: a results-table marker inside the block opened at line "
                    f"{opened[0] + 1}; close that one first ({CLOSE_MARKER})"
                )
            opened = (index, match.group(1).strip())
        elif CLOSE.match(line):
            if opened is None:
                raise BlockError(f"{where}: {CLOSE_MARKER} without an opening marker")
            gen, positional, keywords = parse_spec(opened[1], f"{shown(path)}:{opened[0] + 1}")
            blocks.append(
                Block(
                    path, opened[0] + 1, opened[1], gen, positional, keywords, opened[0] + 1, index
                )
            )
            opened = None
    if opened is not None:
        raise BlockError(
            f"{shown(path)}:{opened[0] + 1}: results-table marker never closed (add "
            f"{CLOSE_MARKER} after its table)"
        )
    return blocks


def render(block: Block) -> list[str]:
    """The lines between ``block``'s markers: a blank line, the table, a blank line, the
    line naming its sources and the command that regenerates it, a blank line; with
    ``inline=yes`` (prose inside a paragraph run) the text alone, its marker naming what
    to edit."""
    try:
        table, sources = block.generator.make(block.positional, block.keywords)
    except BlockError as err:
        raise BlockError(f"{block.where}: {block.generator.name}: {err}") from None
    except (GraftError, OSError, pl.exceptions.PolarsError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BlockError(f"{block.where}: {block.generator.name}: {first}") from None
    if block.keywords.get("inline") == "yes":
        return table.splitlines()
    files = ", ".join(f"`{shown(p)}`" for p in dict.fromkeys(sources))
    edit = block.generator.edit
    what = edit(block.positional) if edit else "the marker above, not the table"
    source = f" from {files}" if files else ""
    note = f"*Generated{source} by `{COMMAND}`; edit {what}.*"
    return ["", *table.splitlines(), "", note, ""]


@dataclass
class Difference:
    block: Block
    old: list[str]
    new: list[str]

    def diff(self) -> str:
        name = f"{self.block.where} ({self.block.spec})"
        lines = difflib.unified_diff(
            self.old, self.new, f"{name} as written", f"{name} generated", lineterm=""
        )
        return "\n".join(lines)


def regenerate(path: Path) -> tuple[str, list[Difference]]:
    """``path``'s text with every block regenerated, and the blocks that changed."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    differences = []
    out: list[str] = []
    last = 0
    for block in find_blocks(text, path):
        old, new = lines[block.start : block.end], render(block)
        out += lines[last : block.start] + new
        last = block.end
        if old != new:
            differences.append(Difference(block, old, new))
    out += lines[last:]
    return "\n".join(out) + ("\n" if text.endswith("\n") else ""), differences


def documents(root: Path = ROOT) -> list[Path]:
    """The documents whose blocks are generated: README.md and docs/**/*.md (the results
    section's index and study pages among them: :mod:`benchmarks.results_pages`)."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def check(paths: Sequence[Path]) -> list[Difference]:
    """The blocks of ``paths`` that differ from what the generators write."""
    return [d for path in paths for d in regenerate(path)[1]]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    ap.add_argument(
        "files", nargs="*", type=Path, help="documents (default: README.md, docs/**/*.md)"
    )
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a block differs")
    ap.add_argument("--list", action="store_true", help="list the generators and their arguments")
    args = ap.parse_args(argv)
    if args.list:
        for gen in GENERATORS.values():
            print(gen.usage)
        return 0
    paths = [p if p.is_absolute() else Path.cwd() / p for p in args.files] or documents()
    try:
        results = [(path, *regenerate(path)) for path in paths]
    except (BlockError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    differences = [d for _, _, found in results for d in found]
    if args.check:
        for difference in differences:
            print(f"{difference.block.where}: differs from `{COMMAND}`'s ({difference.block.spec})")
            print(difference.diff())
        if differences:
            print(f"{len(differences)} block(s) differ; run `{COMMAND}` to rewrite them")
        return 1 if differences else 0
    for path, text, found in results:
        if found:
            path.write_text(text, encoding="utf-8")
            print(f"{shown(path)}: rewrote {len(found)} block(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
