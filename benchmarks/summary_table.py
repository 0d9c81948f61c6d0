"""Print a run's summary as a markdown table: grafts x templates, acc@5 with its 95% CI.

A run of several replicates (finetune or data seeds) shows the mean over them with its
interval and, in parentheses, each replicate's value.

Run from the repository root: python -m benchmarks.summary_table RUN_FOLDER [METRIC] [GROUP]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl


def table(folder: Path, metric: str = "acc@5", group: str | None = None) -> str:
    if not (folder / "summary.parquet").exists():
        nested = sorted(p.parent.name for p in folder.glob("*/summary.parquet"))
        hint = f" (its sub-runs: {', '.join(nested)})" if nested else ""
        raise SystemExit(f"error: no summary.parquet in {folder}{hint}")
    summary = pl.read_parquet(folder / "summary.parquet")
    if group is not None:
        summary = summary.filter(pl.col("group") == group)
    replicated = "n_seeds" in summary.columns and (summary["n_seeds"] > 1).any()
    if replicated:
        summary = summary.filter(pl.col("n_seeds") > 1)
    config = json.loads((folder / "config.json").read_text())
    order = list(dict.fromkeys(g["name"] for g in config["grafts"]))
    order = [g for g in order if g in set(summary["graft"])]
    templates = [t for t in ("headline", "qa", "movie") if t in set(summary["template"])]
    lines = ["| graft | " + " | ".join(templates) + " |", "|---|" + "---:|" * len(templates)]
    for graft in order:
        cells = []
        for template in templates:
            row = summary.filter((pl.col("graft") == graft) & (pl.col("template") == template))
            cells.append("—" if row.is_empty() else _cell(row, metric, replicated))
        lines.append(f"| {graft} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(row: pl.DataFrame, metric: str, replicated: bool) -> str:
    text = f"{row[metric][0]:.2f} [{row[metric + '_lo'][0]:.2f}, {row[metric + '_hi'][0]:.2f}]"
    if replicated:
        text += " (" + " / ".join(f"{v:.2f}" for v in row[metric + "_per_seed"][0]) + ")"
    return text


if __name__ == "__main__":
    args = sys.argv[1:]
    print(table(Path(args[0]), *(args[1:2] or ["acc@5"]), *(args[2:3] or [None])))
