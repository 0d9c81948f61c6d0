"""The named table makers of the ``results-table`` markers (:mod:`benchmarks.results_tables`):
``summary``, ``contrasts``, ``provenance``, ``paper``, ``across``, ``lens``, ``csv`` and ``speed``, each reading a results
folder and returning a markdown table and the files it read (``seeds``, ``metrics``,
``kinds`` and ``examples`` are in :mod:`benchmarks.run_tables`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import polars as pl

from benchmarks import contrast_table, provenance_table, summary_table
from benchmarks._graft_api import PROVENANCE_FILE, provenance_entries, read_csv_table
from benchmarks.md_table import md_table

ROOT = Path(__file__).resolve().parents[1]

_T = TypeVar("_T")


class BlockError(Exception):
    """A marker or its arguments are wrong, or its sources cannot be read: one line."""


@dataclass(frozen=True)
class Generator:
    """A named table maker: ``make(positional, keywords)`` returns the markdown table and
    the files it read (relative to the root, named under the table); ``edit(positional)``,
    where given, names what to edit instead of the generated text (default: the marker)."""

    name: str
    usage: str
    keywords: tuple[str, ...]
    make: Callable[[list[str], dict[str, str]], tuple[str, list[Path]]]
    edit: Callable[[list[str]], str] | None = None


GENERATORS: dict[str, Generator] = {}


def generator(
    name: str,
    usage: str,
    keywords: Sequence[str] = (),
    edit: Callable[[list[str]], str] | None = None,
) -> Callable:
    """Register the decorated function as the generator ``name``."""

    def register(make: Callable[[list[str], dict[str, str]], tuple[str, list[Path]]]):
        GENERATORS[name] = Generator(name, usage, tuple(keywords), make, edit)
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


def _one_file(name: str, positional: list[str], file: str) -> Path:
    """The file ``file`` of the one FOLDER ``name`` takes, present."""
    path = _one_folder(name, positional) / file
    if not path.is_file():
        raise BlockError(f"no {shown(path)}")
    return path


def _float_format(key: str, form: str) -> str:
    """``form`` (the value of the keyword ``key``), where it is a float format."""
    try:
        format(0.5, form)
    except ValueError:
        raise BlockError(f"{key}={form}: not a float format") from None
    return form


def _keyword(
    keywords: dict[str, str],
    key: str,
    parse: Callable[[str], _T],
    what: str,
    default: str | None = None,
) -> _T:
    """The keyword ``key`` (``default`` where it is not given) read by ``parse``; where it
    does not parse, one line naming it and ``what`` it should be."""
    text = keywords[key] if default is None else keywords.get(key, default)
    try:
        return parse(text)
    except ValueError:
        raise BlockError(f"{key}={text}: {what}") from None


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


def _files_in(positional: list[str], name: str) -> list[Path]:
    """The file ``name`` of each ``[LABEL=]FOLDER`` argument, every one present."""
    files = [folder / name for _, folder in _labelled(positional)]
    for file in files:
        if not file.is_file():
            raise BlockError(f"no {shown(file)}")
    return files


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
    experiment = keywords.get("experiment", "position")
    path = _one_file("summary", positional, f"{experiment}_summary.csv")
    folder = path.parent
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
            raise BlockError(f"no contrasts table in {shown(folder)}")
        files += found
    return contrast_table.table(setups), files


@generator(
    "provenance",
    "provenance [LABEL=]FOLDER ...: one row per experiment and benchmark published in each "
    "FOLDER: run | model, protocol, seeds | command | commit | machine, threads | date",
)
def _provenance(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    lines = list(provenance_table.HEADER)
    files = []
    for label, folder in _labelled(positional):
        if not (folder / PROVENANCE_FILE).is_file():
            raise BlockError(f"no {PROVENANCE_FILE} in {shown(folder)}")
        files.append(folder / PROVENANCE_FILE)
        lines += provenance_table.rows(label, folder)
    return "\n".join(lines), files


@generator(
    "paper",
    "paper LABEL=MODEL=FOLDER ... [margin=M] [others=no] [cells=short]: the paper's numbers "
    "beside graft's, from benchmarks.paper_table.paper_table_markdown(runs, margin, others, "
    "short) (others=no: without the rows on another quantity than the paper's; cells=short: "
    "each verdict with its deciding numbers, the rules in two sentences)",
    ("margin", "others", "cells"),
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
    margin = _keyword(keywords, "margin", float, "not a number") if "margin" in keywords else None
    others = keywords.get("others", "yes")
    if others not in ("yes", "no"):
        raise BlockError(f"others={others}: yes or no")
    cells = keywords.get("cells", "full")
    if cells not in ("full", "short"):
        raise BlockError(f"cells={cells}: full or short")
    files = sorted(p for _, _, f in runs for p in Path(f).glob("*.csv"))
    text = paper_table_markdown(runs, margin, others == "yes", cells == "short")
    return str(text).rstrip("\n"), files


@generator(
    "across",
    "across LABEL=FOLDER ... [experiment=position] [template=headline] [grafts=SFT,FE+LT] "
    "[finetune_seed=0] [metric=acc@5]: one finetune seed's numbers in several runs (other "
    "machines, thread counts, commits), one row per run with its machine and threads",
    ("experiment", "template", "grafts", "finetune_seed", "metric"),
)
def _across(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    experiment = keywords.get("experiment", "position")
    template = keywords.get("template", "headline")
    grafts = keywords.get("grafts", "SFT,FE+LT").split(",")
    metric = keywords.get("metric", "acc@5")
    seed = _keyword(keywords, "finetune_seed", int, "not a number", "0")
    body = []
    files = []
    for label, folder in _labelled(positional):
        path = folder / f"{experiment}_summary.csv"
        if not path.is_file():
            raise BlockError(f"no {shown(path)}")
        files += [path, folder / PROVENANCE_FILE]
        summary = read_csv_table(path).filter(pl.col("template") == template)
        seeds = summary["finetune_seed"].drop_nulls() if "finetune_seed" in summary.columns else []
        if len(seeds):
            summary = summary.filter(pl.col("finetune_seed").cast(pl.Int64) == seed)
        entry = dict(provenance_entries(folder)).get(experiment) or {}
        recorded = (entry.get("seeds") or {}).get("finetune_seeds") or [0]
        if not len(seeds) and list(recorded) != [seed]:
            raise BlockError(f"{shown(folder)} ran finetune seeds {recorded}, not {seed}")
        cells = [label, provenance_table.machine_cell(entry)]
        for graft in grafts:
            row = summary.filter(pl.col("graft") == graft)
            if row.height != 1:
                raise BlockError(f"{shown(path)}: no single {graft} row of {template}, seed {seed}")
            r = row.row(0, named=True)
            cells.append(f"{r[metric]:.2f} [{r[metric + '_lo']:.2f}, {r[metric + '_hi']:.2f}]")
        body.append(cells)
    head = ["run", "machine, threads", *(f"{g} {metric}" for g in grafts)]
    return md_table(head, body, right=len(grafts)), files


@generator(
    "lens",
    "lens FOLDER [position=LT] [layers=-1,27,28,29] [metric=median_rank] [grafts=A,B,...]: "
    "the logit lens of FOLDER/lens_summary.csv, grafts x layers (-1 = emb), each cell the "
    "metric on headline / qa / movie prompts",
    ("position", "layers", "metric", "grafts"),
)
def _lens(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    path = _one_file("lens", positional, "lens_summary.csv")
    position = keywords.get("position", "LT")
    metric = keywords.get("metric", "median_rank")
    layers = _keyword(
        keywords,
        "layers",
        lambda text: [int(x) for x in text.split(",")],
        "not whole numbers",
        "-1,27,28,29",
    )
    lens = read_csv_table(path).filter(pl.col("position") == position)
    if not lens.height or metric not in lens.columns:
        raise BlockError(f"{shown(path)} has no {metric} at {position}")
    order = keywords["grafts"].split(",") if "grafts" in keywords else None
    grafts = order or list(dict.fromkeys(lens["graft"]))
    seen = set(lens["template"])
    templates = [t for t in ("headline", "qa", "movie") if t in seen]
    names = ["emb" if layer < 0 else f"layer {layer}" for layer in layers]

    def value(graft: str, layer: int, template: str) -> str:
        row = lens.filter(
            (pl.col("graft") == graft)
            & (pl.col("template") == template)
            & (pl.col("layer") == layer)
        )
        if row.height != 1:
            raise BlockError(f"{shown(path)}: no {graft} row at layer {layer}, {template}")
        if metric == "median_rank":
            return f"{row[metric][0]:,.1f}".removesuffix(".0")
        return f"{row[metric][0]:,.4g}"

    def cell(graft: str, layer: int) -> str:
        return " / ".join(value(graft, layer, t) for t in templates)

    head = [f"graft ({' / '.join(templates)})", *names]
    body = ([graft, *(cell(graft, layer) for layer in layers)] for graft in grafts)
    return md_table(head, body, right=len(layers)), [path]


@generator(
    "csv",
    "csv FOLDER ... file=NAME.csv columns=A,B,... [headers=a,b,...] [format=.2f]: the named "
    "columns of each FOLDER's table, rows one after another (floats in FORMAT, by default 3 "
    "significant digits or e-notation below 0.01; empty cells as —)",
    ("file", "columns", "headers", "format"),
)
def _csv(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    if "file" not in keywords or "columns" not in keywords:
        raise BlockError("csv needs file= and columns=")
    files = _files_in(positional, keywords["file"])
    rows = pl.concat([pl.read_csv(f) for f in files], how="diagonal_relaxed")
    columns = keywords["columns"].split(",")
    if missing := [c for c in columns if c not in rows.columns]:
        raise BlockError(f"{keywords['file']} lacks the columns {', '.join(missing)}")
    headers = keywords["headers"].split(",") if "headers" in keywords else columns
    if len(headers) != len(columns):
        raise BlockError(f"{len(headers)} headers for {len(columns)} columns")

    form = keywords.get("format")
    if form:
        _float_format("format", form)

    def cell(value: object) -> str:
        if value is None:
            return "—"
        if isinstance(value, float) and form:
            return format(value, form)
        if isinstance(value, float):
            return f"{value:.1e}" if 0 < abs(value) < 0.01 else f"{value:,.3g}"
        return str(value)

    body = ([cell(v) for v in row] for row in rows.select(columns).iter_rows())
    return md_table(headers, body, right=len(columns) - 1), files


#: The columns of a benchmark's speed CSV (benchmarks.paper_scale --out) the table shows,
#: with the column holding each row's own goal where the CSV has one (a host-bound proxy's
#: goals are not the paper shapes').
SPEED_COLUMNS = (
    ("e1_engine_over_plain", "E1 mix (goal <= 1.1)", "goal_e1"),
    ("e3_engine_over_plain", "E3 mix (goal <= 0.4)", "goal_e3"),
    ("peak_over_bound", "peak / bound (goal <= 1)", None),
)
#: each column's pass/fail column in the CSV (a value that misses its goal is marked)
SPEED_PASSES = {
    "e1_engine_over_plain": "pass_e1",
    "e3_engine_over_plain": "pass_e3",
    "peak_over_bound": "pass_peak",
}


@generator(
    "speed",
    "speed FOLDER ... [file=paper_scale.csv]: per machine and shape, engine time over a "
    "plain forward (E1 and E3 mixes) and peak memory over its bound, dtypes side by side, "
    "from each FOLDER's benchmark CSV",
    ("file",),
)
def _speed(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    name = keywords.get("file", "paper_scale.csv")
    files = _files_in(positional, name)
    rows = pl.concat([pl.read_csv(f) for f in files], how="diagonal_relaxed")
    need = {"machine", "shape", "params", "dtype", *(c for c, _, _ in SPEED_COLUMNS)}
    if not need <= set(rows.columns):
        raise BlockError(f"{name} lacks the columns {', '.join(sorted(need - set(rows.columns)))}")
    own_goals = all(g in rows.columns for _, _, g in SPEED_COLUMNS if g)
    titles = [h.split(" (")[0] + " (goal)" if own_goals and g else h for _, h, g in SPEED_COLUMNS]
    head = ["machine", "shape", "dtype", *titles]
    body = []
    keys = ["machine", "shape", *(k for k in ("layers", "width") if k in rows.columns)]
    for (machine, shape, *_), part in rows.group_by(keys, maintain_order=True):
        size = f"{part['params'][0] / 1e9:.2f} B"
        if "width" in part.columns and part["width"][0] is not None:
            size = f"{part['layers'][0]} layers x d {part['width'][0]}, {size}"
        cells = [str(machine), f"{shape} ({size})", " / ".join(part["dtype"])]
        no_peak_goal = "pass_peak" in part.columns and part["pass_peak"].is_null().all()
        for column, _, goal in SPEED_COLUMNS:
            if column == "peak_over_bound" and no_peak_goal:  # a proxy: no memory goal
                cells.append("n/a")
                continue
            values = " / ".join(f"{v:.2f}" for v in part[column])
            if own_goals and goal:
                values += f" (<= {part[goal][0]:g})"
            passed = SPEED_PASSES[column]
            if passed in part.columns and (part[passed] == False).any():  # noqa: E712  # polars
                values += " **not met**"
            cells.append(values)
        body.append(cells)
    return md_table(head, body, right=len(SPEED_COLUMNS)), files


def shown(path: Path) -> str:
    """``path`` relative to the repository root, where it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
