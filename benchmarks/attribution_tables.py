"""The tables of a published ``graft-exp attribution`` run (``attribution_summary.csv``,
``attribution_multicell_summary.csv``) and of ``benchmarks.attribution_cost``, as markers of
:mod:`benchmarks.results_tables` draw them."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from benchmarks._graft_api import read_csv_table, reported_interval
from benchmarks.md_table import md_table
from benchmarks.table_generators import BlockError, _one_file, generator, shown


def _number(value, form: str = ".3f") -> str:
    return "—" if value is None else format(float(value), form)


@generator(
    "attribution",
    "attribution FOLDER: estimated vs real single-cell grafts per position unit and module "
    "kind (cells, Pearson and its 95% bootstrap interval over prompts, sign agreement over "
    "the cells that move the target, top-5 overlap, whether Pearson and sign agreement both "
    "reach 0.95), from FOLDER/attribution_summary.csv and attribution_verify.csv",
)
def _attribution(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    path = _one_file("attribution", positional, "attribution_summary.csv")
    summary = read_csv_table(path)
    if "pearson" not in summary.columns:
        raise BlockError(f"{shown(path)} has no real grafts: run the attribution with --verify all")
    verify_path = path.with_name("attribution_verify.csv")
    verify = read_csv_table(verify_path)
    body = []
    for row in summary.iter_rows(named=True):
        bar = {True: "yes", False: "**no**", None: "—"}[row["meets_bar"]]
        body.append(
            [
                row["unit"],
                row["kind"],
                str(row["verified"]),
                _number(row["pearson"]),
                _interval(verify, row),
                f"{_number(row['sign_agreement'], '.2f')} ({row['moving']})",
                _number(row["top_k_overlap"], ".2f"),
                bar,
            ]
        )
    head = ["unit", "kind", "cells", "Pearson", "95% interval over prompts"]
    head += ["sign agreement (moving cells)", "top-5 overlap", "point >= 0.95"]
    return md_table(head, body, right=5), [path, verify_path]


def _interval(verify: pl.DataFrame, row: dict) -> str:
    """The Pearson's percentile bootstrap interval over the prompts of ``row``'s verified
    cells (:func:`graft.results.reported_interval`), or a dash where it gives none."""
    cells = verify.filter(pl.col("kind") == row["kind"])
    if row["unit"] != "all":
        cells = cells.filter(pl.col("unit") == row["unit"])
    interval = reported_interval(cells)
    return "—" if interval is None else "{:.3f}-{:.3f}".format(*interval)


@generator(
    "attribution-multicell",
    "attribution-multicell FOLDER: multi-cell grafts (each whole layer, FE / LT / FE+LT in "
    "every layer) against the sum of their cells' estimates, from "
    "FOLDER/attribution_multicell_summary.csv",
)
def _multicell(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    path = _one_file("attribution-multicell", positional, "attribution_multicell_summary.csv")
    body = [
        [
            "one whole layer (`ALL:l:attn,mlp`)"
            if row["set"] == "layer"
            else f"`{row['set']}:all:attn,mlp`",
            str(row["grafts"]),
            _number(row["mean_estimate"], "+.3f"),
            _number(row["mean_real"], "+.3f"),
            _number(row["mean_abs_error"]),
            _number(row["median_relative_error"], ".2f"),
            _number(row["pearson"]),
            _number(row["sign_agreement"], ".2f"),
        ]
        for row in read_csv_table(path).iter_rows(named=True)
    ]
    head = ["graft", "grafts", "mean estimate", "mean real", "mean abs. error"]
    head += ["median relative error", "Pearson", "sign agreement"]
    return md_table(head, body, right=7), [path]


@generator(
    "attribution-cost",
    "attribution-cost FOLDER: attribution of every cell against real grafts of every cell "
    "(the sweep from each cell's layer on, and a forward a cell scaled from a sample), from "
    "FOLDER/attribution_cost.csv",
)
def _cost(positional: list[str], keywords: dict[str, str]) -> tuple[str, list[Path]]:
    path = _one_file("attribution-cost", positional, "attribution_cost.csv")
    body = [
        [
            str(row["model"]),
            f"{row['prompts']} x {row['cells_per_prompt']}",
            f"{float(row['attribution_s']):.1f} s ({row['attribution_forwards']} forwards)",
            f"{float(row['real_sweep_s']):.1f} s ({float(row['sweep_ratio']):.0f}x)",
            f"{float(row['real_all_cells_s_scaled']):.0f} s (from {row['real_sample_cells']} "
            f"cells, {float(row['real_per_cell_s']):.3f} s each; {float(row['ratio']):.0f}x)",
        ]
        for row in read_csv_table(path).iter_rows(named=True)
    ]
    head = ["model", "prompts x cells", "attribution, every cell"]
    head += ["real sweep, each cell from its layer", "real grafts, a forward a cell"]
    return md_table(head, body), [path]
