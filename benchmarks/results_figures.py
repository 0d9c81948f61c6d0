"""Redraw one committed figure from a CSV under ``results/`` (the run folders those tables
came from are not committed): graft's figure code (graft.results.report), with the paper's
number beside graft's bar where its text states one; or an attribution run's map.

Run from the repository root::

    python -m benchmarks.results_figures SUMMARY_CSV MODEL TEMPLATE OUT_PNG
    python -m benchmarks.results_figures ATTRIBUTION_ESTIMATES_CSV OUT_PNG

SUMMARY_CSV is ``<experiment>_summary.csv`` (e.g.
``results/gemma3-cpu-seed0/position_summary.csv``), MODEL graft's model name that ran it,
TEMPLATE one of its templates; the acc@5 figure of that template is written to OUT_PNG.
ATTRIBUTION_ESTIMATES_CSV is a published ``graft-exp attribution`` run's
``attribution_estimates.csv``: its map (graft.results.attribution_map, the estimate per
unit:kind and layer averaged over prompts, as the run drew ``figures/attribution_map.png``)
is written to OUT_PNG.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import polars as pl

from graft.results import (
    PROVENANCE_FILE,
    attribution_map,
    draw_summary_figures,
    read_csv_table,
    save_figure,
)
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


def draw_attribution(estimates_csv: Path, out: Path) -> Path:
    """Draw the attribution map of a published run's ``attribution_estimates.csv`` into
    ``out`` (PNG), measured as its command says (``--measure logit``, else log-prob)."""
    if not estimates_csv.is_file():
        raise SystemExit(
            f"error: no {estimates_csv}: give a results folder's attribution_estimates.csv"
        )
    provenance = estimates_csv.parent / PROVENANCE_FILE
    command = ""
    if provenance.is_file():
        entry = json.loads(provenance.read_text(encoding="utf-8"))["experiments"].get("attribution")
        command = (entry or {}).get("command", "")
    metric = "logit" if "--measure logit" in command else "logprob"
    figure = attribution_map(read_csv_table(estimates_csv), metric)
    with tempfile.TemporaryDirectory() as tmp:
        save_figure(figure, Path(tmp), "map")
        with atomic_path(out) as target:
            shutil.copyfile(Path(tmp) / "map.png", target)
    return out


def main(argv: list[str]) -> int:
    if len(argv) == 2 and Path(argv[0]).name == "attribution_estimates.csv":
        print(f"figure: {draw_attribution(Path(argv[0]), Path(argv[1]))}")
        return 0
    if len(argv) != 4:
        print(
            "usage: python -m benchmarks.results_figures SUMMARY_CSV MODEL TEMPLATE OUT_PNG\n"
            "       python -m benchmarks.results_figures ATTRIBUTION_ESTIMATES_CSV OUT_PNG",
            file=sys.stderr,
        )
        return 2
    print(f"figure: {draw(Path(argv[0]), argv[1], argv[2], Path(argv[3]))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
