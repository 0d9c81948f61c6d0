"""Print a run's summary as a markdown table: grafts x templates, acc@5 with its 95% CI.

A run of several replicates (finetune or data seeds) shows the mean over them with its
interval and, in parentheses, each replicate's value.

Run from the repository root: python -m benchmarks.summary_table RUN_FOLDER [METRIC] [GROUP]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from benchmarks.md_table import md_table
from graft.results import read_run_record

#: Templates in the order the tables show them; any other template follows, as it first
#: appears.
TEMPLATES = ("headline", "qa", "movie")


def template_order(frame: pl.DataFrame) -> list[str]:
    """The templates of ``frame``'s ``template`` column in the order the tables show them."""
    seen = list(dict.fromkeys(frame["template"]))
    return [t for t in TEMPLATES if t in seen] + [t for t in seen if t not in TEMPLATES]


def table(folder: Path, metric: str = "acc@5", group: str | None = None) -> str:
    """The table of the run folder ``folder`` (its ``summary.parquet``; grafts in the order
    of its ``config.json``)."""
    if not (folder / "summary.parquet").exists():
        nested = sorted(p.parent.name for p in folder.glob("*/summary.parquet"))
        hint = f" (its sub-runs: {', '.join(nested)})" if nested else ""
        raise SystemExit(f"error: no summary.parquet in {folder}{hint}")
    summary = pl.read_parquet(folder / "summary.parquet")
    order = read_run_record(folder).graft_names
    return markdown(summary, order, metric, group)


def markdown(
    summary: pl.DataFrame,
    order: Sequence[str] | None = None,
    metric: str = "acc@5",
    group: str | None = None,
) -> str:
    """A summary table (a run's ``summary.parquet``, or a ``results/`` folder's
    ``<experiment>_summary.csv`` as :func:`graft.results.paper.agreement.read_csv_table` reads it)
    as markdown: grafts (in ``order``, default: as they first appear) x templates, ``metric``
    with its 95% interval, of a run of several replicates the mean over them with each
    replicate's value in parentheses.

    Raises:
        ValueError: ``summary`` has no column ``metric``.
    """
    if metric not in summary.columns or f"{metric}_lo" not in summary.columns:
        raise ValueError(f"the summary has no metric {metric!r} (with its interval)")
    if group is not None:
        summary = summary.filter(pl.col("group") == group)
    replicated = "n_seeds" in summary.columns and (summary["n_seeds"] > 1).any()
    if replicated:
        summary = summary.filter(pl.col("n_seeds") > 1)
    present = list(dict.fromkeys(summary["graft"]))
    order = [g for g in (order or present) if g in set(present)]
    templates = template_order(summary)

    def cell(graft: str, template: str) -> str:
        row = summary.filter((pl.col("graft") == graft) & (pl.col("template") == template))
        return "—" if row.is_empty() else _cell(row, metric, replicated)

    body = ([graft, *(cell(graft, t) for t in templates)] for graft in order)
    return md_table(["graft", *templates], body, right=len(templates))


def _cell(row: pl.DataFrame, metric: str, replicated: bool) -> str:
    text = f"{row[metric][0]:.2f} [{row[metric + '_lo'][0]:.2f}, {row[metric + '_hi'][0]:.2f}]"
    if replicated:
        text += " (" + " / ".join(f"{v:.2f}" for v in row[metric + "_per_seed"][0]) + ")"
    return text


if __name__ == "__main__":
    args = sys.argv[1:]
    print(table(Path(args[0]), *(args[1:2] or ["acc@5"]), *(args[2:3] or [None])))
