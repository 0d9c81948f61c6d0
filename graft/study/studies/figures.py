"""A study's figures across models and seeds: per experiment, a metric per graft with one
marker per finetune seed, one panel per model (``<experiment>_<metric>.png`` and ``.pdf``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from graft.results.plots.style import (
    graft_label,
    is_unit_metric,
    metric_label,
    new_figure,
    save_figure,
)

#: One marker per finetune seed (in seed order, repeating past the last).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def seed_means(table: pl.DataFrame, metric: str) -> pl.DataFrame:
    """``metric`` per (model, seed, experiment, graft) of a collected table: the mean over
    its templates; a design of several runs (a component run's pairs) names the graft
    ``<run>: <graft>``."""
    several = table.group_by("experiment").agg(pl.col("run").n_unique().alias("runs"))
    label = (
        pl.when(pl.col("runs") > 1)
        .then(pl.concat_str(pl.col("run"), pl.lit(": "), pl.col("graft")))
        .otherwise(pl.col("graft"))
    )
    return (
        table.join(several, on="experiment")
        .filter(pl.col(metric).is_not_null())
        .with_columns(label.alias("label"))
        .group_by("model", "finetune_seed", "experiment", "label", maintain_order=True)
        .agg(pl.col(metric).cast(pl.Float64).mean())
    )


def draw_study_figures(
    table: pl.DataFrame, folder: Path, metrics: Sequence[str] = ("acc@5",)
) -> list[Path]:
    """Draw each experiment's figure of each of ``metrics`` the table has into ``folder``;
    return the PNG paths."""
    pngs = []
    for metric in (m for m in metrics if m in table.columns):
        means = seed_means(table, metric)
        for experiment in means["experiment"].unique(maintain_order=True).to_list():
            rows = means.filter(pl.col("experiment") == experiment)
            pngs.append(_draw(rows, metric, experiment, folder))
    return pngs


def _draw(rows: pl.DataFrame, metric: str, experiment: str, folder: Path) -> Path:
    models = rows["model"].unique(maintain_order=True).to_list()
    labels = rows["label"].unique(maintain_order=True).to_list()
    seeds = sorted(rows["finetune_seed"].unique().to_list())
    fig = new_figure(max(4.0, 0.45 * len(labels)) * len(models), 3.6)
    axes = fig.subplots(1, len(models), squeeze=False, sharey=True)[0]
    for ax, model in zip(axes, models, strict=True):
        for i, seed in enumerate(seeds):
            got = rows.filter((pl.col("model") == model) & (pl.col("finetune_seed") == seed))
            xs = [labels.index(x) + 0.12 * (i - (len(seeds) - 1) / 2) for x in got["label"]]
            ax.scatter(
                xs, got[metric].to_list(), marker=MARKERS[i % len(MARKERS)], label=f"seed {seed}"
            )
        ax.set_title(model)
        ax.set_xticks(range(len(labels)), [graft_label(x) for x in labels], rotation=60)
        ax.grid(axis="y", alpha=0.3)
        if is_unit_metric(metric):
            ax.set_ylim(-0.03, 1.03)
    axes[0].set_ylabel(metric_label(metric))
    axes[-1].legend(title="finetune seed", fontsize="small")
    fig.suptitle(f"{experiment}: {metric} per graft, one marker per finetune seed")
    png, _pdf = save_figure(fig, folder, f"{experiment}_{metric.replace('@', '')}")
    return png
