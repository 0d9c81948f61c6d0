"""Redraw one committed figure from a summary CSV under ``results/`` (the run folders those
summaries came from are not committed): graft's figure code (graft.results.report), with
the paper's number beside graft's bar where its text states one.

Run from the repository root::

    python -m benchmarks.results_figures SUMMARY_CSV MODEL TEMPLATE OUT_PNG

SUMMARY_CSV is ``<experiment>_summary.csv`` (e.g.
``results/gemma3-cpu-seed0/position_summary.csv``), MODEL graft's model name that ran it,
TEMPLATE one of its templates; the acc@5 figure of that template is written to OUT_PNG.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import polars as pl

from graft.results import draw_summary_figures, read_csv_table
from graft.storage import atomic_path


def draw(summary_csv: Path, model: str, template: str, out: Path) -> Path:
    """Draw ``template``'s acc@5 figure of ``summary_csv`` into ``out`` (PNG)."""
    experiment = summary_csv.name.removesuffix("_summary.csv")
    summary = read_csv_table(summary_csv).filter(pl.col("template") == template)
    if summary.is_empty():
        raise SystemExit(f"error: no {template!r} rows in {summary_csv}")
    with tempfile.TemporaryDirectory() as tmp:
        (png,) = draw_summary_figures(summary, experiment, model, Path(tmp))
        with atomic_path(out) as target:
            shutil.copyfile(png, target)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(
            "usage: python -m benchmarks.results_figures SUMMARY_CSV MODEL TEMPLATE OUT_PNG",
            file=sys.stderr,
        )
        return 2
    print(f"figure: {draw(Path(argv[0]), argv[1], argv[2], Path(argv[3]))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
