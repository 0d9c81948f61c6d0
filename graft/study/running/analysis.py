"""Per-batch analyses of the runner: what an analysis (such as the logit lens) gives the one
run loop so that its table is computed, stored, resumed and combined with the run's own.

An analysis has a stored table of its own (``parts/<table>/<batch>.parquet``, one part per
stored batch of the run, with the run's batch ids and run key). :func:`graft.study.running.
batches.run_batches` computes, in the same loop, under the same lock and with the same
resume as the run's examples, each analysis's frame of every stored batch it lacks (or holds
stale): a batch whose examples are stored and whose analysis part is not runs the analysis
alone, never the engine; a stored examples batch is never computed again for an analysis.
After the run's own summaries, each analysis's :meth:`BatchAnalysis.finish` writes its
combined table and whatever it derives from it. The runner imports no analysis: they are
passed in as objects (``run_experiment(..., analyses=(...))``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import polars as pl

from graft.core.families.arch import Architecture
from graft.core.planning.plan import GraftRow
from graft.models import LoadedModel
from graft.results.folder import RunFolder
from graft.study.data.prompts import TestExample
from graft.study.running.run_inputs import RunModels, RunPrompts
from graft.study.specs.config import Replicate
from graft.study.specs.grafts import NamedGraft
from graft.study.specs.run import RunSpecs


@dataclass
class AnalysisBatch:
    """One stored batch of a run, as an analysis computes its frame.

    Args:
        run: the run's resolved specs.
        models: the replicate's loaded models.
        rows: the batch's engine rows (token ids, spans, spec), in ``chunk`` order.
        chunk: the batch's (example index, graft index) rows.
        examples: the replicate's examples (``chunk`` indexes them).
        grafts: the replicate's grafts (``chunk`` indexes them).
        replicate: the replicate the batch belongs to.
    """

    run: RunSpecs
    models: RunModels
    rows: Sequence[GraftRow]
    chunk: Sequence[tuple[int, int]]
    examples: Sequence[TestExample]
    grafts: Sequence[NamedGraft]
    replicate: Replicate


@dataclass
class FinishedRun:
    """A run whose batches (examples and analyses) are all stored and whose own summaries are
    written, as an analysis's :meth:`BatchAnalysis.finish` sees it.

    Args:
        run: the run's resolved specs.
        folder: the run folder.
        grafts: every graft of the run, in run order (control twins after their graft).
        prompts: data seed -> the run's examples and rows.
        arch: the base model's architecture.
        computed: table name (the examples' and each analysis's) -> the batch ids this call
            computed.
    """

    run: RunSpecs
    folder: RunFolder
    grafts: Sequence[NamedGraft]
    prompts: Mapping[int, RunPrompts]
    arch: Architecture
    computed: Mapping[str, list[str]]


class BatchAnalysis(Protocol):
    """A per-batch analysis of the runner (e.g. :class:`graft.study.analyses.lens.
    LensAnalysis`)."""

    @property
    def table(self) -> str:
        """The name of its stored table (``parts/<table>/``, ``<table>.parquet``)."""
        ...

    def check(self, run: RunSpecs) -> None:
        """Raise a :class:`graft.errors.GraftError` for a run it cannot analyse (called
        before anything is loaded or written)."""
        ...

    def describe(self, base: LoadedModel) -> str:
        """What one row of its table is, for the run's plan line (``base``: the run's base
        model, the first replicate's)."""
        ...

    def stale(self, stored: pl.DataFrame, base: LoadedModel) -> set[str]:
        """The ids of the stored batches to compute again: ``stored`` is its stored parts
        read with a ``batch`` column (those written in an older layout, say)."""
        ...

    def batch_frame(self, batch: AnalysisBatch) -> pl.DataFrame:
        """The stored frame of one batch."""
        ...

    def finish(self, done: FinishedRun) -> Any:
        """Write its combined table and what it derives from it; the result goes into
        :attr:`graft.study.running.runner.ExperimentRun.analyses` under its table name."""
        ...
