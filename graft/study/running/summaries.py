"""A run's tables once its batches are stored: ``examples.parquet``, the summary with
confidence intervals (and the mean over replicates), the key paired contrasts, the drop
report; and the summary as a compact text table for the terminal."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import polars as pl

from graft.results.compare import (
    CONTRASTS_STEM,
    NAME_CONTRASTS_STEM,
    key_contrasts,
)
from graft.results.folder import RunFolder
from graft.results.over_seeds import REPLICATE_COLUMNS, format_per_seed, summarize_over_seeds
from graft.results.summary import summarize
from graft.study.running.batches import EXAMPLES_TABLE
from graft.study.running.run_inputs import RunPrompts
from graft.study.specs.grafts import NamedGraft
from graft.study.specs.run import AnalysisSpec, RunSpecs

logger = logging.getLogger(__name__)


def write_summaries(
    run: RunSpecs, folder: RunFolder, grafts: Sequence[NamedGraft], prompts: dict
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Write ``examples.parquet``, the summary, the key contrasts (on whole names too when
    scored) and the drop report; return the examples and the summary."""
    table = _finalize_examples(run, folder)
    summary = summarize_run(table, grafts, {d: p.drops for d, p in prompts.items()}, run.analysis)
    folder.write_summary(summary)
    measures = [("hit@5", "target_logprob", CONTRASTS_STEM)]
    if "name_exact" in table.columns:
        measures.append(("name_exact", "name_logprob", NAME_CONTRASTS_STEM))
    for hit, score, stem in measures:
        n_boot, seed = max(run.analysis.n_boot, 1), run.analysis.seed
        contrasts = key_contrasts(table, hit, score, n_boot=n_boot, seed=seed)
        if not contrasts.is_empty():
            folder.write_summary(contrasts, stem=stem)
    folder.write_json("drops.json", _drops_report(run, prompts))
    return table, summary


def _finalize_examples(run: RunSpecs, folder: RunFolder) -> pl.DataFrame:
    """Combine the stored batches into ``examples.parquet`` and return the table. Batches
    stored before rows recorded their replicate (a run of one, resumed) get its seeds."""
    table = folder.read(EXAMPLES_TABLE)  # checks every part: nothing derived if one is bad
    if not table.is_empty() and not run.replicated:
        seeds = {"data_seed": run.data.data_seed, "finetune_seed": 0}
        table = table.with_columns(
            pl.col(c).fill_null(v) if c in table.columns else pl.lit(v, dtype=pl.Int64).alias(c)
            for c, v in seeds.items()
        )
    folder.finalize(EXAMPLES_TABLE, table)
    return table


def _drops_report(run: RunSpecs, prompts: Mapping[int, RunPrompts]) -> dict[str, Any]:
    """``drops.json``: the first data seed's drops, and every data seed's when there are
    several."""
    first = prompts[run.data.data_seed]
    report: dict[str, Any] = {"per_template": first.drops, "skipped_grafts": first.skipped}
    if len(prompts) > 1:
        report["per_data_seed"] = {
            str(d): {"per_template": p.drops, "skipped_grafts": p.skipped}
            for d, p in prompts.items()
        }
    return report


def summarize_run(
    table: pl.DataFrame,
    grafts: Sequence[NamedGraft],
    drops: Mapping[int, Mapping[str, Mapping[str, int]]],
    analysis: AnalysisSpec,
) -> pl.DataFrame:
    """Summary per (group, template, graft) in the experiment's graft order, with CIs: one
    row per replicate (``data_seed``, ``finetune_seed``), then, where a graft ran in several
    replicates, a row of the mean over them with a between-replicate interval
    (:func:`graft.results.over_seeds.summarize_over_seeds`; its seed columns are null).

    Args:
        table: the run's examples.
        grafts: every graft of the run, in plot order.
        drops: data seed -> template -> drop reason -> count.
        analysis: the run's bootstrap resamples and seed.
    """
    if table.is_empty():
        return table
    by = ["group", "template", "graft", *REPLICATE_COLUMNS]
    parts = table.partition_by("data_seed", as_dict=True, maintain_order=True)
    per_seed = pl.concat(
        [
            summarize(
                part,
                by=by,
                n_boot=analysis.n_boot,
                seed=analysis.seed,
                drops={t: drops.get(d, {}).get(t, {}) for t in part["template"].unique()},
                drops_by="template",
            )
            for (d,), part in parts.items()
        ],
        how="diagonal_relaxed",
    )
    summary = summarize_over_seeds(per_seed, ["group", "template", "graft"], REPLICATE_COLUMNS)
    order = {g.name: i for i, g in enumerate(grafts)}
    return summary.sort(
        by=[
            pl.col("group"),
            pl.col("template"),
            pl.col("graft").replace_strict(order, default=len(order)),
            pl.col("finetune_seed").is_not_null(),  # the mean over replicates first
            *REPLICATE_COLUMNS,
        ],
        maintain_order=True,
    )


def format_summary(summary: pl.DataFrame, metric: str = "acc@5", digits: int | None = 3) -> str:
    """A compact table: one line per graft and template, the metric and its CI rounded to
    ``digits`` (None: as stored); for a run of several replicates, their mean with the
    between-replicate interval and each replicate's value (``<metric>_per_seed``, in the
    order of ``per_seed_of``). The ``group`` column is left out when no graft has a group,
    and a graft of none shows ``-`` beside grafts of one."""
    if summary.is_empty():
        return "(no results)"
    cols = ["group", "graft", "template", metric, f"{metric}_lo", f"{metric}_hi", "n"]
    if "group" in summary.columns:
        if (summary["group"].fill_null("") == "").all():
            cols.remove("group")
        else:
            summary = summary.with_columns(
                pl.when(pl.col("group").fill_null("") == "")
                .then(pl.lit("-"))
                .otherwise(pl.col("group"))
                .alias("group")
            )
    head = ""
    if f"{metric}_per_seed" in summary.columns:
        means = summary.filter(pl.col("n_seeds") > 1)
        summary = means.with_columns(format_per_seed(means[f"{metric}_per_seed"]))
        cols[-1:] = [f"{metric}_per_seed", "n"]
        head = (
            f"{metric}: mean over replicates ({means['per_seed_of'][0]}), "
            f"{means[f'{metric}_ci_method'][0]}; then each replicate's value; n prompts "
            "per replicate\n"
        )
    table = summary.select([c for c in cols if c in summary.columns])
    if digits is not None:
        table = table.with_columns(pl.col(pl.Float32, pl.Float64).round(digits))
    with pl.Config(
        tbl_rows=200,
        tbl_cols=20,
        tbl_hide_dataframe_shape=True,
        fmt_str_lengths=40,
        float_precision=digits,
    ):
        return head + str(table)


def print_summary(
    summary: pl.DataFrame, metric: str = "acc@5", echo: Callable[[str], None] | None = None
) -> None:
    """Send :func:`format_summary` to ``echo`` (default: this module's logger)."""
    (echo or logger.info)(format_summary(summary, metric))
