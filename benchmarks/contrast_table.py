"""Print the key paired contrasts of several runs as one markdown table (acc@5 difference with
its interval, McNemar's Holm-adjusted p, mean target log-prob difference), per template.

Run from the repository root::

    python -m benchmarks.contrast_table "LABEL=FOLDER" ["LABEL=FOLDER" ...]

A FOLDER holds ``position_contrasts.csv`` and/or ``component_contrasts.csv`` (as under
``results/``; a necessity table's rows mean other things and are not read) or is a run folder
with ``contrasts.csv``; of a component run with several donor pairs, the ``sft`` pair.
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

from benchmarks.md_table import md_table
from graft.results import KEY_CONTRASTS

TEMPLATES = ("headline", "qa", "movie")


def contrast_files(folder: Path) -> list[Path]:
    """The contrast tables of ``folder`` the table reads."""
    names = ("contrasts.csv", "position_contrasts.csv", "component_contrasts.csv")
    files = [folder / n for n in names if (folder / n).is_file()]
    return files + sorted(folder.glob("*/contrasts.csv"))  # a component run's pairs


def _contrasts(folder: Path) -> pl.DataFrame:
    files = contrast_files(folder)
    if not files:
        raise SystemExit(f"error: no contrasts.csv in {folder}")
    table = pl.concat([pl.read_csv(f) for f in files], how="diagonal_relaxed")
    if "group" in table.columns:  # component runs: the SFT -> PRE pair, else their one pair
        sft = table.filter(pl.col("group").is_null() | pl.col("group").is_in(["", "sft"]))
        if sft.height or table["group"].n_unique() > 1:
            return sft
    return table


def _cell(row: dict) -> str:
    p = row["mcnemar_p_holm"]
    shown = "1" if p >= 0.995 else (f"{p:.2g}" if p >= 1e-4 else "<1e-4")
    return (
        f"{row['acc@5_diff']:+.2f} [{row['acc@5_diff_lo']:+.2f}, {row['acc@5_diff_hi']:+.2f}] "
        f"p={shown}; {row['target_logprob_diff']:+.1f} nats"
    )


def table(setups: list[tuple[str, Path]]) -> str:
    body = []
    for label, folder in setups:
        contrasts = _contrasts(folder)
        for a, b in KEY_CONTRASTS:
            rows = contrasts.filter((pl.col("graft_a") == a) & (pl.col("graft_b") == b))
            if rows.is_empty():
                continue
            cells = []
            for template in TEMPLATES:
                hit = rows.filter(pl.col("template") == template)
                cells.append("—" if hit.is_empty() else _cell(hit.row(0, named=True)))
            body.append([label, f"{a} vs {b}", *cells])
    return md_table(["setup", "contrast", *TEMPLATES], body)


def main(argv: list[str]) -> int:
    if not argv or any("=" not in a for a in argv):
        print('usage: python -m benchmarks.contrast_table "LABEL=FOLDER" ...', file=sys.stderr)
        return 2
    print(table([(a.split("=", 1)[0], Path(a.split("=", 1)[1])) for a in argv]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
