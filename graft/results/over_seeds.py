"""Summaries over replicates (finetune and data seeds): per group, the mean over seeds with a
Student-t interval between seeds (widened to the pooled interval where that is wider), and
each seed's own value, in a fixed order."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from graft.results.stats import seed_summary, wilson_interval

#: The columns naming a run's replicate (its data seed and finetune seed) in its examples
#: and summary tables.
REPLICATE_COLUMNS: tuple[str, ...] = ("data_seed", "finetune_seed")


def seed_ci_text(n_seeds: int, ci: float = 0.95) -> str:
    """What the interval of a mean over ``n_seeds`` replicates is, for tables and footnotes."""
    return (
        f"{100 * ci:g}% t interval over {n_seeds} replicates (their values' mean and "
        f"sd, {n_seeds - 1} df), widened to the pooled within-replicate interval"
    )


def _is_proportion(stat: str) -> bool:
    return stat.startswith("acc@") or stat == "name_exact"


def _within_interval(group: pl.DataFrame, stat: str, mean: float, ci: float):
    """The interval of the pooled mean from the prompts alone: Wilson on every replicate's
    prompts together for a proportion, else the replicates' mean half-width / sqrt(count).

    Replicates that agree give a t interval of width 0 (three seeds at 1/50 each: [0.02,
    0.02]); this keeps the uncertainty of the prompts sampled."""
    if _is_proportion(stat) and "n" in group.columns:
        n = group["n"].cast(pl.Int64).to_numpy()
        k = int(round(float((group[stat].cast(pl.Float64).to_numpy() * n).sum())))
        return wilson_interval(k, int(n.sum()), ci)
    if {f"{stat}_lo", f"{stat}_hi"} <= set(group.columns):
        widths = (group[f"{stat}_hi"] - group[f"{stat}_lo"]).cast(pl.Float64).to_numpy()
        if np.isfinite(widths).all():
            half = float(widths.mean()) / 2 / math.sqrt(group.height)
            return mean - half, mean + half
    return mean, mean


def _value_bounds(stat: str) -> tuple[float, float]:
    """The range a statistic can take (a t interval is clipped to it)."""
    if stat.startswith("acc@") or stat in ("name_exact", "mean_prob"):
        return 0.0, 1.0
    if "rank" in stat:
        return 0.0, math.inf
    if "logprob" in stat:
        return -math.inf, 0.0
    return -math.inf, math.inf


def _mean_row(
    group: pl.DataFrame, stats: Sequence[str], seed_cols: Sequence[str], ci: float
) -> dict[str, Any]:
    """The mean-over-replicates row of one group's per-replicate rows (sorted by seed)."""
    row: dict[str, Any] = dict.fromkeys(seed_cols)
    row["n"] = int(group["n"].to_numpy().max())
    row["n_seeds"] = group.height
    labels = zip(*(group[c].to_list() for c in seed_cols), strict=True)
    row["per_seed_of"] = ",".join(
        "-".join(f"{c[0]}{v}" for c, v in zip(seed_cols, label, strict=True)) for label in labels
    )
    for stat in stats:
        values = group[stat].cast(pl.Float64).to_numpy()
        if np.isfinite(values).all():
            summary = seed_summary(values, ci)
            low, high = _value_bounds(stat)
            w_lo, w_hi = _within_interval(group, stat, summary.mean, ci)
            lo, hi = min(summary.lo, w_lo), max(summary.hi, w_hi)
            mean, lo, hi = summary.mean, max(low, lo), min(high, hi)
        else:
            mean = lo = hi = math.nan
        row[stat], row[f"{stat}_lo"], row[f"{stat}_hi"] = mean, lo, hi
        row[f"{stat}_per_seed"] = values.tolist()
        row[f"{stat}_ci_method"] = seed_ci_text(group.height, ci)
    if "n_dropped" in group.columns:
        row["n_dropped"] = int(group["n_dropped"].to_numpy().max())
        reasons = [r for r in dict.fromkeys(group["dropped_reasons"].to_list()) if r]
        row["dropped_reasons"] = " | ".join(reasons)
    return row


def summarize_over_seeds(
    per_seed: pl.DataFrame,
    by: Sequence[str] = ("group", "template", "graft"),
    seed_cols: Sequence[str] = REPLICATE_COLUMNS,
    ci: float = 0.95,
) -> pl.DataFrame:
    """Per-replicate summary rows plus, for each ``by`` group of several replicates, the mean
    over them with a between-replicate interval.

    Every replicate (a donor finetuned with one seed, on one data seed's facts) is one draw
    of the finetune, so the mean row's interval is the Student-t interval of the
    per-replicate values (:func:`graft.results.stats.seed_summary`), widened where needed to
    the pooled interval over prompts (Wilson on all replicates' prompts for accuracies), and
    clipped to the range the statistic can take: it covers finetune-to-finetune spread and
    the prompts sampled, while each per-replicate row keeps its own interval over prompts.

    Args:
        per_seed: rows of :func:`summarize` grouped by ``by`` and ``seed_cols``.
        by: the columns of one result (graft, template, ...).
        seed_cols: the columns naming a replicate.
        ci: coverage of the interval.

    Returns:
        ``per_seed`` unchanged when no group has several replicates. Otherwise ``per_seed``
        with ``n_seeds`` = 1, and one more row per group of several replicates: the
        ``seed_cols`` null, ``n`` (prompts per replicate, the largest), ``n_seeds``,
        ``per_seed_of`` (the replicates, ``d<data seed>-f<finetune seed>``, comma-separated),
        for each statistic ``s`` with an interval: ``s`` (the mean), ``s_lo``, ``s_hi``,
        ``s_per_seed`` (the replicates' values, in ``per_seed_of`` order) and
        ``s_ci_method`` (:func:`seed_ci_text`); ``n_dropped`` is the most any replicate
        dropped.
    """
    by, seed_cols = list(by), list(seed_cols)
    columns = set(per_seed.columns)
    stats = [c for c in per_seed.columns if {f"{c}_lo", f"{c}_hi"} <= columns]
    parts = per_seed.partition_by(by, maintain_order=True, as_dict=True) if by else {(): per_seed}
    rows = [
        dict(zip(by, key, strict=True)) | _mean_row(group.sort(seed_cols), stats, seed_cols, ci)
        for key, group in parts.items()
        if group.height > 1
    ]
    if not rows:
        return per_seed
    schema = {c: per_seed.schema[c] for c in by + seed_cols} | {
        "n": pl.Int64,
        "n_seeds": pl.Int64,
        "per_seed_of": pl.Utf8,
    }
    for stat in stats:
        schema |= {stat: pl.Float64, f"{stat}_lo": pl.Float64, f"{stat}_hi": pl.Float64}
        schema |= {f"{stat}_per_seed": pl.List(pl.Float64), f"{stat}_ci_method": pl.Utf8}
    if "n_dropped" in columns:
        schema |= {"n_dropped": pl.Int64, "dropped_reasons": pl.Utf8}
    means = pl.DataFrame(rows, schema=schema, orient="row")
    with_count = per_seed.with_columns(n_seeds=pl.lit(1, dtype=pl.Int64))
    return pl.concat([with_count, means], how="diagonal_relaxed")


def format_per_seed(values: pl.Series) -> pl.Series:
    """A ``<metric>_per_seed`` list column as text, ``"0.920 / 0.840 / 0.880"``."""
    return pl.Series(
        values.name,
        [None if v is None else " / ".join(f"{x:.3f}" for x in v) for v in values.to_list()],
        dtype=pl.Utf8,
    )
