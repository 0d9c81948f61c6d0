"""Write the result tables of README.md and docs/*.md from the ``results/`` folders.

Every table the documents show from a results folder sits between two markers::

    <!-- results-table: summary results/smollm2-cpu-seeds012 experiment=position -->
    (generated: the table, then the line naming the command that regenerates it)
    <!-- /results-table -->

Markers start their line (not indented, not inside a fenced code block). The opening marker
names a generator of :data:`GENERATORS` and its arguments (split as a
shell splits them: positional arguments, and ``key=value`` for the generator's keywords).
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from benchmarks import contrast_table, summary_table
from benchmarks._graft_api import (
    PROVENANCE_FILE,
    GraftError,
    machine_label,
    provenance_entries,
    read_csv_table,
)

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python -m benchmarks.results_tables"
# markers start their line (an indented one is a code block's text, as is one inside a fence)
OPEN = re.compile(r"^<!--\s*results-table:(.*?)-->\s*$")
CLOSE = re.compile(r"^<!--\s*/results-table\s*-->\s*$")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
CLOSE_MARKER = "<!-- /results-table -->"


class BlockError(Exception):
    """A marker or its arguments are wrong, or its sources cannot be read: one line."""


# --------------------------------------------------------------------------- generators


@dataclass(frozen=True)
class Generator:
    """A named table maker: ``make(positional, keywords)`` returns the markdown table and
    the files it read (relative to the root, named under the table)."""

    name: str
    usage: str
    keywords: tuple[str, ...]
    make: Callable[[list[str], dict[str, str]], tuple[str, list[Path]]]


GENERATORS: dict[str, Generator] = {}


def generator(name: str, usage: str, keywords: Sequence[str] = ()) -> Callable:
    """Register the decorated function as the generator ``name``."""

    def register(make: Callable[[list[str], dict[str, str]], tuple[str, list[Path]]]):
        GENERATORS[name] = Generator(name, usage, tuple(keywords), make)
        return make

    return register


def _folder(text: str) -> Path:
    folder = ROOT / text
    if not folder.is_dir():
        raise BlockError(f"no folder {text}")
    return folder


def _one_folder(name: str, positional: list[str]) -> Path:
    if len(positional) != 1:
        raise BlockError(f"{name} takes one FOLDER, got {positional or 'none'}")
    return _folder(positional[0])


def _labelled(items: list[str]) -> list[tuple[str, Path]]:
    """``LABEL=FOLDER`` or ``FOLDER`` (labelled by its name) arguments."""
    if not items:
        raise BlockError("no FOLDER given")
    pairs = []
    for item in items:
        label, _, folder = item.rpartition("=")
        path = _folder(folder)
        pairs.append((label or path.name, path))
    return pairs


def _experiment_order(folder: Path, experiment: str) -> list[str] | None:
    """The grafts of ``experiment`` in run order, where ``folder``'s provenance records them."""
    for name, entry in provenance_entries(folder):
        if name == experiment and entry.get("grafts"):
            return [str(g) for g in entry["grafts"]]
    return None


@generator(
    "summary",
    "summary FOLDER [experiment=position] [metric=acc@5] [group=G] [grafts=A,B,...]: grafts x "
    "templates, the metric with its 95% interval from FOLDER/<experiment>_summary.csv; of "
    "several replicates their mean with each one's value in parentheses",
    ("experiment", "metric", "group", "grafts"),
)
def _summary(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    folder = _one_folder("summary", positional)
    experiment = keywords.get("experiment", "position")
    path = folder / f"{experiment}_summary.csv"
    if not path.is_file():
        raise BlockError(f"no {_shown(path)}")
    summary = read_csv_table(path)
    group = keywords.get("group")
    groups = sorted(set(summary["group"])) if "group" in summary.columns else []
    if group is None and len(groups) > 1:
        raise BlockError(f"{path.name} holds the groups {', '.join(groups)}: name one (group=)")
    order = keywords["grafts"].split(",") if "grafts" in keywords else None
    order = order or _experiment_order(folder, experiment)
    try:
        table = summary_table.markdown(summary, order, keywords.get("metric", "acc@5"), group)
    except ValueError as err:
        raise BlockError(f"{path.name}: {err}") from None
    return table, [path]


@generator(
    "contrasts",
    "contrasts [LABEL=]FOLDER ...: the key paired contrasts (acc@5 difference with its "
    "interval, Holm-adjusted McNemar p, target log-prob difference) per template, from each "
    "FOLDER's position and component contrasts",
)
def _contrasts(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    setups = _labelled(positional)
    files = []
    for _, folder in setups:
        found = contrast_table.contrast_files(folder)
        if not found:
            raise BlockError(f"no contrasts table in {_shown(folder)}")
        files += found
    return contrast_table.table(setups), files


def _seeds(entry: dict) -> str:
    seeds = entry.get("seeds") or {}
    parts = []
    if seeds.get("finetune_seeds"):
        parts.append("finetune seeds " + ", ".join(map(str, seeds["finetune_seeds"])))
    if seeds.get("data_seeds"):
        parts.append("data seeds " + ", ".join(map(str, seeds["data_seeds"])))
    elif "data_seed" in seeds:
        parts.append(f"data seed {seeds['data_seed']}")
    if "seed" in seeds:
        parts.append(f"seed {seeds['seed']}")
    if seeds.get("control"):
        parts.append("control donors")
    return ", ".join(parts)


def _presets(entry: dict) -> str:
    records = (entry.get("finetuned_models") or {}).values()
    names = sorted({str((r.get("config") or {}).get("name")) for r in records if r})
    return f"`{'`/`'.join(names)}` preset" if names else ""


def _setup(entry: dict) -> str:
    if entry.get("kind") == "benchmark":
        settings = entry.get("settings") or {}
        return ", ".join(f"{k} {v}" for k, v in settings.items()) or "—"
    protocol = entry.get("protocol") or "graft"
    parts = [
        str(entry.get("model")),
        f"{'the paper' if protocol == 'paper' else protocol}'s protocol",
        _presets(entry),
        _seeds(entry),
        f"n = {entry['n']}" if entry.get("n") is not None else "n = all",
    ]
    return ", ".join(p for p in parts if p)


def _commit(entry: dict) -> str:
    commit = entry.get("git_commit")
    if not commit:
        return "unknown"
    return f"`{commit[:12]}`" + (" (dirty)" if entry.get("git_dirty") else "")


def _machine(entry: dict) -> str:
    machine = entry.get("machine")
    if not isinstance(machine, dict):
        return "unknown"
    return f"{machine_label(machine)}, {machine.get('torch_threads')} threads"


def _date(entry: dict) -> str:
    created = str(entry.get("created") or "unknown")[:10]
    resumed = sorted({str(r.get("time", ""))[:10] for r in entry.get("resumes") or []} - {""})
    return created + (f" (resumed {', '.join(resumed)})" if resumed else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


@generator(
    "provenance",
    "provenance [LABEL=]FOLDER ...: one row per experiment and benchmark published in each "
    "FOLDER: run | model, protocol, seeds | command | commit | machine, threads | date",
)
def _provenance(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    lines = [
        "| run | model, protocol, seeds | command | commit | machine, threads | date |",
        "|---|---|---|---|---|---|",
    ]
    files = []
    for label, folder in _labelled(positional):
        if not (folder / PROVENANCE_FILE).is_file():
            raise BlockError(f"no {PROVENANCE_FILE} in {_shown(folder)}")
        files.append(folder / PROVENANCE_FILE)
        for name, entry in provenance_entries(folder):
            missing = entry.get("missing") or []
            note = f" (not recorded: {', '.join(missing)})" if missing else ""
            command = f"`{entry.get('command')}`" if entry.get("command") else "unknown"
            cells = [
                f"{label}: {name}",
                _setup(entry) + note,
                command,
                _commit(entry),
                _machine(entry),
                _date(entry),
            ]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines), files


@generator(
    "paper",
    "paper LABEL=MODEL=FOLDER ... [margin=M]: the paper's numbers beside graft's, from "
    "benchmarks.paper_table.paper_table_markdown(runs, margin)",
    ("margin",),
)
def _paper(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    try:
        from benchmarks.paper_table import paper_table_markdown  # type: ignore[attr-defined]
    except ImportError:
        raise BlockError(
            "benchmarks.paper_table has no paper_table_markdown(runs, margin) yet"
        ) from None
    runs = []
    for item in positional:
        parts = item.split("=", 2)
        if len(parts) != 3:
            raise BlockError(f"paper takes LABEL=MODEL=FOLDER arguments, got {item!r}")
        runs.append((parts[0], parts[1], str(_folder(parts[2]))))
    if not runs:
        raise BlockError("paper takes one LABEL=MODEL=FOLDER or more")
    margin = keywords.get("margin")
    try:
        value = None if margin is None else float(margin)
    except ValueError:
        raise BlockError(f"margin={margin}: not a number") from None
    files = sorted(p for _, _, f in runs for p in Path(f).glob("*.csv"))
    return str(paper_table_markdown(runs, value)).rstrip("\n"), files


#: The columns of a benchmark's speed CSV (benchmarks.paper_scale --out) the table shows.
SPEED_COLUMNS = (
    ("e1_engine_over_plain", "E1 mix (goal <= 1.1)"),
    ("e3_engine_over_plain", "E3 mix (goal <= 0.4)"),
    ("peak_over_bound", "peak / bound (goal <= 1)"),
)


@generator(
    "speed",
    "speed FOLDER ... [file=paper_scale.csv]: per machine and shape, engine time over a "
    "plain forward (E1 and E3 mixes) and peak memory over its bound, dtypes side by side, "
    "from each FOLDER's benchmark CSV",
    ("file",),
)
def _speed(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    name = keywords.get("file", "paper_scale.csv")
    files = [folder / name for _, folder in _labelled(positional)]
    for file in files:
        if not file.is_file():
            raise BlockError(f"no {_shown(file)}")
    rows = pl.concat([pl.read_csv(f) for f in files], how="diagonal_relaxed")
    need = {"machine", "shape", "params", "dtype", *(c for c, _ in SPEED_COLUMNS)}
    if not need <= set(rows.columns):
        raise BlockError(f"{name} lacks the columns {', '.join(sorted(need - set(rows.columns)))}")
    head = ["machine", "shape", "dtype", *(h for _, h in SPEED_COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * len(SPEED_COLUMNS)]
    for (machine, shape), part in rows.group_by(["machine", "shape"], maintain_order=True):
        cells = [str(machine), f"{shape} ({part['params'][0] / 1e9:.2f} B)"]
        cells.append(" / ".join(part["dtype"]))
        cells += [" / ".join(f"{v:.2f}" for v in part[c]) for c, _ in SPEED_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), files


# --------------------------------------------------------------------------- markers


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
        return f"{_shown(self.path)}:{self.line}"


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


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
        where = f"{_shown(path)}:{index + 1}"
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
            gen, positional, keywords = parse_spec(opened[1], f"{_shown(path)}:{opened[0] + 1}")
            blocks.append(
                Block(
                    path, opened[0] + 1, opened[1], gen, positional, keywords, opened[0] + 1, index
                )
            )
            opened = None
    if opened is not None:
        raise BlockError(
            f"{_shown(path)}:{opened[0] + 1}: results-table marker never closed (add "
            f"{CLOSE_MARKER} after its table)"
        )
    return blocks


def render(block: Block) -> list[str]:
    """The lines between ``block``'s markers: a blank line, the table, a blank line, the
    line naming its sources and the command that regenerates it, a blank line."""
    try:
        table, sources = block.generator.make(block.positional, block.keywords)
    except BlockError as err:
        raise BlockError(f"{block.where}: {block.generator.name}: {err}") from None
    except (GraftError, OSError, pl.exceptions.PolarsError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BlockError(f"{block.where}: {block.generator.name}: {first}") from None
    files = ", ".join(f"`{_shown(p)}`" for p in dict.fromkeys(sources))
    note = f"*Generated from {files} by `{COMMAND}`; edit the marker above, not the table.*"
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
    """The documents whose blocks are generated: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def check(paths: Sequence[Path]) -> list[Difference]:
    """The blocks of ``paths`` that differ from what the generators write."""
    return [d for path in paths for d in regenerate(path)[1]]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, help="documents (default: README.md, docs/*.md)")
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
            print(f"{_shown(path)}: rewrote {len(found)} block(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
