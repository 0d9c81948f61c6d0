"""The logit lens as an analysis of the one runner (:class:`LensAnalysis`), and its figures.

``graft-exp lens`` is one :func:`graft.study.running.runner.run_experiment` call with
``analyses=(LensAnalysis(top_k=...),)``: the runner plans the rows, cuts them into stored
batches and, in its one loop (same lock, same resume), stores each batch's lens beside its
examples as ``parts/lens/<batch>.parquet`` (:func:`graft.study.analyses.lens_trace.logit_lens`
on the batch's engine rows, :func:`graft.study.analyses.lens_tables.lens_frame`); a batch
stored in an older layout or with another ``top_k`` is computed again
(:func:`~graft.study.analyses.lens_tables.stale_batches`), a batch whose examples are stored
runs the lens alone. After the run's own summaries, :meth:`LensAnalysis.finish` combines the
parts into ``lens.parquet``, summarises them per (group, template, graft, position, layer)
into ``lens_summary.parquet`` and ``.csv`` (:func:`~graft.study.analyses.lens_tables.
summarize_lens`, with ``same_as`` from :func:`graft.study.analyses.lens_causality.
identical_lines`), and writes the top-1 tokens of a few prompts to ``lens_top_tokens.csv``.
:func:`draw_lens_figures` draws the summary (:func:`graft.results.plots.lens.lens_chart`).

The roles: :mod:`~graft.study.analyses.lens_trace` (the lens inside a grafted trace),
:mod:`~graft.study.analyses.lens_causality` (lines identical by causality),
:mod:`~graft.study.analyses.lens_tables` (its tables, summary and top tokens), this module
(the glue to the runner, and the figures).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from graft.core.families.arch import architecture_of
from graft.core.families.wrapping import unwrap
from graft.errors import ExperimentError
from graft.models import LoadedModel
from graft.results.plots import save_figure
from graft.results.plots.lens import lens_chart
from graft.results.record import read_run_record
from graft.results.report import draw_figures
from graft.results.run_config import recorded_options
from graft.storage.tables import read_table, write_csv
from graft.study.analyses.lens_causality import identical_lines
from graft.study.analyses.lens_tables import (
    LENS_SUMMARY,
    LENS_TABLE,
    LENS_TOP_TOKENS,
    TOP_TOKEN_PROMPTS,
    first_prompts,
    lens_frame,
    stale_batches,
    summarize_lens,
    top_tokens_table,
)
from graft.study.analyses.lens_trace import POSITIONS, logit_lens, top_width
from graft.study.running.analysis import AnalysisBatch, FinishedRun
from graft.study.specs.choices import DEFAULT_TOP_K
from graft.study.specs.run import RunSpecs

#: The summary statistics drawn, each in a figure of its own: the median rank (robust, on a
#: log axis) and the mean log-probability (the probability on a log scale: a mean
#: probability is ~0 below the last layers and its 0..1 axis showed nothing there).
FIGURE_METRICS = ("median_rank", "mean_logprob")


def check_lens_config(run: RunSpecs) -> None:
    """Refuse what the lens does not run: several replicates, and remote runs."""
    if run.replicated:
        raise ExperimentError(
            "the lens runs one replicate: drop finetune_seeds, data_seeds and control",
            param="finetune_seeds",
        )
    if run.execution.remote is not None:
        raise ExperimentError(
            "the lens runs on this machine only: leave remote unset", param="remote"
        )


@dataclass
class LensRun:
    """What the lens of a run produced (:meth:`LensAnalysis.finish`).

    Args:
        table: the per-(example, graft, layer, position) scores and top-k tokens.
        summary: per (group, template, graft, position, layer): ``n``, ``mean_rank``,
            ``median_rank``, ``mean_prob``, ``mean_logprob``, ``acc@k`` with intervals, and
            ``same_as``.
        computed: the stored batches this run computed (empty when all were stored).
        top_tokens: the top-1 tokens of a few prompts (``lens_top_tokens.csv``).
    """

    table: pl.DataFrame
    summary: pl.DataFrame
    computed: list[str]
    top_tokens: pl.DataFrame


@dataclass(frozen=True)
class LensAnalysis:
    """The logit lens as a per-batch analysis of the runner
    (:class:`graft.study.running.analysis.BatchAnalysis`): one replicate, on this machine.

    Args:
        top_k: the top tokens stored per (row, layer, position) (at most the vocabulary);
            stored batches with another number are computed again.
    """

    top_k: int = DEFAULT_TOP_K

    #: its stored table: ``parts/lens/<batch>.parquet``, ``lens.parquet``
    table = LENS_TABLE

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ExperimentError(f"top_k must be at least 1, not {self.top_k}", param="top_k")

    def check(self, run: RunSpecs) -> None:
        """:func:`check_lens_config`."""
        check_lens_config(run)

    def describe(self, base: LoadedModel) -> str:
        """``(4 layers + emb) x 2 positions, top 5 tokens``: what a row gives the table."""
        n_layers = architecture_of(unwrap(base.model)).n_layers
        width = top_width(base.model, self.top_k)
        return f"({n_layers} layers + emb) x {len(POSITIONS)} positions, top {width} tokens"

    def stale(self, stored: pl.DataFrame, base: LoadedModel) -> set[str]:
        """Stored batches without the embedding layer or the top-k columns, or with another
        number of top tokens (:func:`~graft.study.analyses.lens_tables.stale_batches`)."""
        return stale_batches(stored, top_width(base.model, self.top_k))

    def batch_frame(self, batch: AnalysisBatch) -> pl.DataFrame:
        """The lens of one stored batch: one trace of its engine rows."""
        base = batch.models.base
        scores = logit_lens(
            base.model,
            {n: m.model for n, m in batch.models.donors.items()},
            batch.rows,
            [batch.examples[ei].target_id for ei, _ in batch.chunk],
            pad_id=base.tokenizer.pad_token_id,
            top_k=self.top_k,
        )
        return lens_frame(
            scores,
            batch.chunk,
            batch.examples,
            batch.grafts,
            batch.replicate.data_seed,
            base.tokenizer,
        )

    def finish(self, done: FinishedRun) -> LensRun:
        """Write ``lens.parquet``, ``lens_summary.parquet`` and ``.csv`` and
        ``lens_top_tokens.csv``; every stored part is checked first."""
        folder, run = done.folder, done.run
        prompts = done.prompts[run.data.data_seed]
        examples, rows = prompts.examples, prompts.rows
        table = folder.read(LENS_TABLE)
        folder.finalize(LENS_TABLE, table)
        same = identical_lines(examples, done.grafts, rows, done.arch)
        summary = summarize_lens(table, done.grafts, run.analysis, same)
        folder.write_summary(summary, stem=LENS_SUMMARY)
        shown = first_prompts(examples, TOP_TOKEN_PROMPTS)
        texts = {e.prompt_id: e.text for e in examples}
        top = top_tokens_table(table, shown, texts, done.grafts)
        write_csv(top, folder.path / f"{LENS_TOP_TOKENS}.csv")
        return LensRun(table, summary, list(done.computed.get(LENS_TABLE, [])), top)


def draw_lens_figures(folder: str | Path, fig_dir: str | Path | None = None) -> list[Path]:
    """Draw the lens figures of the run in ``folder`` from ``lens_summary.parquet``: one per
    group and statistic of :data:`FIGURE_METRICS`, a panel per (position, template);
    ``figures/lens[_<group>]_<metric>.png`` (and ``.pdf``; ``fig_dir``: that folder instead
    of ``figures``). Returns the PNG paths."""
    folder = Path(folder)
    record = read_run_record(folder)
    summary = read_table(
        folder / f"{LENS_SUMMARY}.parquet",
        LENS_SUMMARY,
        record.run_key,
        options=recorded_options(folder),
    )
    model, order = record.model, [g.name for g in record.grafts]
    out = []
    for (group,), part in summary.partition_by("group", as_dict=True, maintain_order=True).items():
        for metric in FIGURE_METRICS:
            if metric not in part.columns:
                continue  # a summary without it (no log-probabilities)
            fig = lens_chart(part, metric, order=order, model=model, positions=POSITIONS)
            stem = "lens" + (f"_{group}" if group else "") + f"_{metric}"
            png, _ = save_figure(fig, Path(fig_dir) if fig_dir else folder / "figures", stem)
            out.append(png)
    return out


def draw_run_figures(
    folder: str | Path, metric: str = "acc@5", fig_dir: str | Path | None = None
) -> list[Path]:
    """Redraw every figure of the finished run in ``folder`` from its tables:
    :func:`graft.results.report.draw_figures` of ``metric``, then a lens run's
    :func:`draw_lens_figures`. Returns the PNG paths."""
    paths = draw_figures(folder, metric, fig_dir)
    if (Path(folder) / f"{LENS_SUMMARY}.parquet").is_file():
        paths += draw_lens_figures(folder, fig_dir)
    return paths
