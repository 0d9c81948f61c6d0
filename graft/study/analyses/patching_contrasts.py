"""Weights against patching, cell by cell, in a patching sweep
(:mod:`graft.study.analyses.patching_report`): the paired contrasts of the two methods with
the cells that test nothing labelled (:func:`method_contrasts`), and per unit and kind the
peak layer, the first layer at half the effect and the layers where they differ
(:func:`findings`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import polars as pl

from graft.results.compare import replicate_column
from graft.results.stats import paired_contrasts

#: One cell of the sweep: its direction, kind and unit, its layer (null for whole-depth).
CELL = ("direction", "kind", "unit", "layer")
EXAMPLE_KEY = ("template", "prompt_id")


def _differ(alpha: float) -> tuple[pl.Expr, pl.Expr]:
    """Whether the Holm-adjusted McNemar test and the log-prob test find a contrast's two
    methods differ at ``alpha`` (what ``decided_by`` and ``layers_differ`` both read)."""
    return pl.col("mcnemar_p_holm") < alpha, pl.col("target_logprob_p_holm") < alpha


def _cell_name(row: Mapping) -> str:
    layer = "all" if row["layer"] is None else row["layer"]
    return f"{row['direction']}|{row['kind']}|{row['unit']}|{layer}"


def method_contrasts(
    examples: pl.DataFrame,
    table: pl.DataFrame,
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
    flags: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Weights against patching in every cell both ran (A = patching, B = weights), with the
    cell columns in front, a ``status``: ``tested`` (in the Holm family), or
    ``identical by construction`` / ``sanity check`` (cells where the two must agree, or
    where patching copies the donor's whole stream: reported, not tested), and
    ``decided_by``: which Holm-adjusted test finds the two differ at ``alpha`` (``McNemar``
    on hit@5, ``log-prob`` (the signed-rank test), ``both`` or ``neither``). Identical by
    construction is decided per prompt (``flags``, :func:`sweep_flags`): a cell is labelled
    so only when every prompt is; where some are (FE at position 0 in one template, not in
    another), the cell is tested on the others, and ``n_identical`` counts those left out."""
    cells = examples.filter(pl.col("role") == "cell")
    schema = {"direction": pl.Utf8, "kind": pl.Utf8, "unit": pl.Utf8, "layer": pl.Int64}
    left_out = pl.DataFrame(schema={**schema, "n_identical": pl.UInt32})
    if flags is not None and flags.height:
        # cells identical by construction on some prompts only: test them on the others
        partial = table.filter((pl.col("identical") > 0) & (pl.col("identical") < 1))
        same = flags.filter(pl.col("identical") > 0).join(
            partial.select(CELL).unique(), on=CELL, how="semi", nulls_equal=True
        )
        same = same.select(*CELL, "template", "prompt_id").unique()
        left_out = same.group_by(CELL).agg(pl.len().alias("n_identical"))
        keys = [*CELL, "template", "prompt_id"]
        cells = cells.join(same, on=keys, how="anti", nulls_equal=True)
    named = cells.with_columns(
        pl.concat_str(
            [
                pl.col("direction"),
                pl.col("kind"),
                pl.col("unit"),
                pl.col("layer").cast(pl.Utf8).fill_null("all"),
                pl.col("method"),
            ],
            separator="|",
        ).alias("graft")
    )
    both = (
        table.group_by(CELL, maintain_order=True)
        .agg(
            pl.col("method").n_unique().alias("methods"),
            pl.col("identical").max(),
            pl.col("sanity").max(),
        )
        .filter(pl.col("methods") == 2)
    )
    status = (
        pl.when(pl.col("identical") >= 1)
        .then(pl.lit("identical by construction"))
        .when(pl.col("sanity") > 0)
        .then(pl.lit("sanity check"))
        .otherwise(pl.lit("tested"))
    )
    both = both.with_columns(status.alias("status"))
    named, seed_col = replicate_column(named)
    out = []
    for status_value, part in both.group_by("status", maintain_order=True):
        pairs = [
            (f"{_cell_name(r)}|patching", f"{_cell_name(r)}|weights")
            for r in part.iter_rows(named=True)
        ]
        got = paired_contrasts(
            named,
            pairs,
            hit="hit@5",
            score="target_logprob",
            by=[],
            example_key=EXAMPLE_KEY,
            seed_col=seed_col,
            n_boot=n_boot,
            seed=seed,
        )
        if got.is_empty():
            continue
        cell = pl.col("graft_a").str.split("|")
        out.append(
            got.select(
                cell.list.get(0).alias("direction"),
                cell.list.get(1).alias("kind"),
                cell.list.get(2).alias("unit"),
                pl.when(cell.list.get(3) == "all")
                .then(None)
                .otherwise(cell.list.get(3))
                .cast(pl.Int64)
                .alias("layer"),
                pl.lit(status_value[0]).alias("status"),
                pl.all().exclude("graft_a", "graft_b"),
            )
        )
    if not out:
        return pl.DataFrame()
    table = pl.concat(out, how="diagonal_relaxed")
    table = table.join(
        left_out.with_columns(pl.col("layer").cast(pl.Int64)), on=CELL, how="left", nulls_equal=True
    ).with_columns(pl.col("n_identical").fill_null(0).cast(pl.Int64))
    hits, logprob = _differ(alpha)
    decided = (
        pl.when(hits & logprob)
        .then(pl.lit("both"))
        .when(hits)
        .then(pl.lit("McNemar"))
        .when(logprob)
        .then(pl.lit("log-prob"))
        .otherwise(pl.lit("neither"))
    )
    return table.with_columns(decided.alias("decided_by"))


def findings(table: pl.DataFrame, contrasts: pl.DataFrame, alpha: float = 0.05) -> pl.DataFrame:
    """Per (direction, kind, unit) of the layer sweep and method: the layer of the largest
    effect and that effect, the first layer whose effect reaches 0.5, the mean effect over
    layers; and per cell the number of layers where weights and patching differ (tested,
    Holm-adjusted McNemar or log-prob p below ``alpha``), and in how many patching is the
    higher."""
    sweep = table.filter(pl.col("layer").is_not_null())
    rows = []
    for (direction, kind, unit, method), part in sweep.group_by(
        "direction", "kind", "unit", "method", maintain_order=True
    ):
        part = part.sort("layer")
        best = part.row(int(np.argmax(part["effect"].to_numpy())), named=True)
        reach = part.filter(pl.col("effect") >= 0.5)
        rows.append(
            {
                "direction": direction,
                "kind": kind,
                "unit": unit,
                "method": method,
                "peak_layer": best["layer"],
                "peak_effect": best["effect"],
                "first_layer_half": reach["layer"].min() if reach.height else None,
                "mean_effect": float(part["effect"].to_numpy().mean()),
            }
        )
    out = pl.DataFrame(rows)
    if contrasts.is_empty() or out.is_empty():
        return out
    tested = contrasts.filter(
        (pl.col("status") == "tested") & pl.col("layer").is_not_null()
    ).with_columns(
        pl.any_horizontal(*_differ(alpha)).alias("differ"),
        (pl.col("target_logprob_diff") > 0).alias("patching_higher"),
    )
    counts = tested.group_by("direction", "kind", "unit").agg(
        pl.col("differ").sum().alias("layers_differ"),
        (pl.col("differ") & pl.col("patching_higher")).sum().alias("layers_patching_higher"),
        pl.len().alias("layers_tested"),
    )
    return out.join(counts, on=["direction", "kind", "unit"], how="left")
