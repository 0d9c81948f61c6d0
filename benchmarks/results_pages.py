"""The results section of the documentation: one page per study under ``docs/results/``,
and its index, generated from the ``results/`` folders (markers of
:mod:`benchmarks.results_tables`).

A study page is ``docs/results/NAME.md``: its title, then a ``study`` block naming the
folders of ``results/`` it reads, then its tables and prose, each between markers. Two
generators make the parts that tie the pages to the folders:

- ``study FOLDER ...``: the page's runs, one row per experiment or benchmark each folder's
  ``provenance.json`` records (the command that made it, the commit, the machine, the
  date). It must name exactly the folders the page's other markers read (prose templates
  included): a table added from a new folder without its run is an error.
- ``studies``: the index's table, one row per study page (its title, its folders, the
  commands that made them). Every folder of ``results/`` must be read by a study page, and
  every study page must have its ``study`` block: a folder published without a page, or a
  page without its runs, is an error.

Both are checked, with every other block, by ``python -m benchmarks.results_tables --check``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from benchmarks import provenance_table
from benchmarks._graft_api import provenance_entries
from benchmarks.md_table import escaped, md_row
from benchmarks.table_generators import ROOT, BlockError, generator, shown

__all__ = ["PAGES", "RESULTS", "page_folders", "study_pages"]

PAGES = ROOT / "docs" / "results"
RESULTS = ROOT / "results"
PROVENANCE_FILE = "provenance.json"
STUDY_HEADER = (
    "| folder | run | command | machine, threads | date |",
    "|---|---|---|---|---|",
)


def _folders_in(words: list[str]) -> list[str]:
    """The ``results/...`` folders named by a marker's words (``A=results/x``,
    ``LABEL=MODEL=results/x`` and ``"label=results/x"`` forms included)."""
    found = []
    for word in words:
        for part in word.split("="):
            if part.startswith("results/"):
                found.append(part.rstrip("/"))
    return found


def _template_folders(name: str) -> list[str]:
    """The folders a prose template (``benchmarks/prose/NAME.md``) reads."""
    path = ROOT / "benchmarks" / "prose" / f"{name}.md"
    header = path.read_text(encoding="utf-8").split("\n---\n", 1)[0]
    found = []
    for line in header.splitlines():
        alias, sep, rest = line.partition("=")
        if sep and not line.lstrip().startswith("#") and rest.split():
            found += _folders_in([rest.split()[0]])
    return found


OPEN = re.compile(r"^<!--\s*results-table:(.*?)-->\s*$")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")


def _markers(path: Path) -> list[list[str]]:
    """The words of every opening marker of ``path`` (outside fenced code), as
    :func:`benchmarks.results_tables.find_blocks` reads them (it validates them; this only
    lists their folders, and importing it here would make a cycle)."""
    found, fence = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        mark = FENCE.match(line)
        if mark:
            fence = None if fence == mark.group(1) else (fence or mark.group(1))
        if fence is not None:
            continue
        match = OPEN.match(line)
        if match:
            try:
                words = shlex.split(match.group(1))
            except ValueError as err:
                raise BlockError(
                    f"{shown(path)}: cannot read a marker's arguments ({err})"
                ) from None
            if words:
                found.append(words)
    return found


def page_folders(path: Path) -> tuple[list[str] | None, list[str]]:
    """The folders ``path``'s ``study`` block names (None: no block) and the folders its
    other blocks read, each in order of first appearance."""
    named: list[str] | None = None
    read: list[str] = []
    for name, *words in _markers(path):
        if name == "study":
            named = _folders_in(words)
        elif name == "prose" and words:
            read += _template_folders(words[0])
        else:
            read += _folders_in(words)
    return named, list(dict.fromkeys(read))


def study_pages() -> list[Path]:
    """The study pages: ``docs/results/*.md`` but the index."""
    return sorted(p for p in PAGES.glob("*.md") if p.name != "index.md")


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    raise BlockError(f"{shown(path)} has no '# ' title")


@generator(
    "study",
    "study FOLDER ...: a study page's runs, one row per experiment and benchmark each "
    "FOLDER's provenance.json records: folder | run | command | machine, threads | date "
    "(FOLDERs: exactly those the page's other markers read; none: the page reads no folder)",
)
def _study(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    del keywords
    if not positional:
        return (
            "This page's numbers come from no folder of `results/`: the text gives the command "
            "that measured them, and no file of the measurement is kept. Earlier measurements "
            "are in [results/HISTORY.md](../../results/HISTORY.md).",
            [],
        )
    lines = [
        "The folders of `results/` this page reads, and what made each (its `provenance.json`):",
        "",
        *STUDY_HEADER,
    ]
    files = []
    for name in positional:
        folder = ROOT / name
        if not (folder / PROVENANCE_FILE).is_file():
            raise BlockError(f"no {PROVENANCE_FILE} in {name}")
        files.append(folder / PROVENANCE_FILE)
        for run, entry in provenance_entries(folder):
            command = f"`{entry['command']}`" if entry.get("command") else "not recorded"
            cells = [
                f"`{name}`",
                run,
                command,
                provenance_table.machine_cell(entry),
                provenance_table._date(entry),
            ]
            lines.append(md_row(escaped(c) for c in cells))
    return "\n".join(lines), files


@generator(
    "studies",
    "studies: the results index's table, one row per page of docs/results/ (study | folders "
    "| commands); fails if a folder of results/ is on no page, or a page's study block does "
    "not name exactly the folders the page reads",
)
def _studies(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    del keywords
    if positional:
        raise BlockError("studies takes no arguments")
    lines = ["| study | results folders | commands |", "|---|---|---|"]
    sources: list[Path] = []
    covered: set[str] = set()
    for page in study_pages():
        named, read = page_folders(page)
        if named is None:
            raise BlockError(
                f"{shown(page)} has no study block (<!-- results-table: study FOLDER ... --> "
                "under its title)"
            )
        if sorted(set(named)) != sorted(read):
            missing, extra = sorted(set(read) - set(named)), sorted(set(named) - set(read))
            raise BlockError(
                f"{shown(page)}'s study block must name the folders the page reads"
                + (f"; add {' '.join(missing)}" if missing else "")
                + (f"; remove {' '.join(extra)}" if extra else "")
            )
        covered.update(named)
        commands = []
        for name in named:
            sources.append(ROOT / name / PROVENANCE_FILE)
            commands += [
                entry.get("command") or "not recorded"
                for _, entry in provenance_entries(ROOT / name)
            ]
        link = f"[{escaped(_title(page))}]({page.name})"
        folders = ", ".join(f"`{n}`" for n in named) or "none"
        shown_commands = "<br>".join(f"`{escaped(c)}`" for c in dict.fromkeys(commands)) or "—"
        lines.append(f"| {link} | {folders} | {shown_commands} |")
    published = sorted(f"results/{p.name}" for p in RESULTS.iterdir() if p.is_dir())
    orphans = [name for name in published if name not in covered]
    if orphans:
        raise BlockError(
            f"{', '.join(orphans)}: on no page of docs/results/ (a study page's markers must "
            "read every published folder)"
        )
    return "\n".join(lines), sources


def marker(folders: list[str]) -> str:
    """The ``study`` marker that names ``folders``."""
    return " ".join(["<!-- results-table: study", *(shlex.quote(f) for f in folders), "-->"])
