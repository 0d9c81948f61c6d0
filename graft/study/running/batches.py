"""The stored batches of a run: which are missing, the groups one engine call runs (fixed
by the plan, so a resumed run computes every row in the company an uninterrupted one does),
and each batch's table of per-example metrics, appended to the run folder; in the same loop,
each per-batch analysis's table (:mod:`graft.study.running.analysis`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl
import torch
from tqdm.auto import tqdm

from graft.core.execution.executor import Executor
from graft.core.language.spec import SpecError
from graft.core.planning.plan import GraftRow
from graft.errors import ExperimentError
from graft.models import LoadedModel
from graft.results.folder import RunFolder
from graft.results.metrics import example_metrics, row_metrics_frame
from graft.study.data.prompts import TestExample
from graft.study.data.rows import graft_rows, plan_rows, skipped_note
from graft.study.running.analysis import AnalysisBatch, BatchAnalysis
from graft.study.running.fullname import name_columns
from graft.study.running.run_inputs import RunModels, RunPaths, RunPrompts, load_run_models
from graft.study.running.timing import StageTimes
from graft.study.specs.config import Replicate
from graft.study.specs.grafts import NamedGraft
from graft.study.specs.run import ExecutionSpec, RunSpecs

logger = logging.getLogger(__name__)


EXAMPLES_TABLE = "examples"


def batch_id(run: RunSpecs, replicate: Replicate, batch: int) -> str:
    """The stored id of batch ``batch`` of ``replicate``: the number alone in a run of one
    replicate (as before replicates existed), ``<replicate label>-<batch>`` otherwise."""
    return f"{replicate.label}-{batch}" if run.replicated else str(batch)


def check_analyses(analyses: Sequence[BatchAnalysis], run: RunSpecs) -> None:
    """Refuse two analyses of one table, one named as the run's examples, and a run one of
    them cannot analyse (:meth:`BatchAnalysis.check`)."""
    tables = [a.table for a in analyses]
    for name in tables:
        if name == EXAMPLES_TABLE or tables.count(name) > 1:
            raise ExperimentError(
                f"analysis table {name!r}: give every analysis a table of its own, other "
                f"than {EXAMPLES_TABLE!r}"
            )
    for analysis in analyses:
        analysis.check(run)


@dataclass
class _Plan:
    """One replicate's stored batches: its grafts, examples and rows, and per table (the
    examples' and each analysis's) the batches to compute."""

    rep: Replicate
    grafts: list[NamedGraft]
    examples: list[TestExample]
    rows: list[tuple[int, int]]
    n_batches: int
    missing: dict[str, set[int]]


def run_batches(
    run: RunSpecs,
    folder: RunFolder,
    arms: Mapping[Replicate, list[NamedGraft]],
    prompts: Mapping[int, RunPrompts],
    paths: Mapping[Replicate, RunPaths],
    loaded: dict[str, LoadedModel],
    echo: Callable[[str], None],
    times: StageTimes,
    executor: Executor | None = None,
    analyses: Sequence[BatchAnalysis] = (),
) -> dict[str, list[str]]:
    """Run and store every batch the run folder does not hold yet, replicate by replicate
    (each replicate's models loaded once, timed as ``times``' loading stage); ``executor``:
    where the engine runs them (default: this machine, or ``run``'s remote host).

    Each of ``analyses`` stores its frame of every batch it lacks or holds stale, in the same
    loop: a batch whose examples are stored runs the analysis alone (no engine call), and a
    stored examples batch is never computed again for an analysis. ``loaded`` holds the first
    replicate's models on entry (the runner loaded them to check them). Returns table name
    (the examples' and each analysis's) -> the batch ids this call computed."""
    size = run.execution.batch_size
    # the analyses' plan lines and stale checks read the base: the first replicate's, loaded
    base = paths[run.replicates[0]].base
    done = {EXAMPLES_TABLE: folder.done_batches(EXAMPLES_TABLE)}
    for analysis in analyses:
        stored = folder.done_batches(analysis.table)
        if stored:
            stored -= analysis.stale(
                folder.read(analysis.table, batch_column="batch"), loaded[base]
            )
        done[analysis.table] = stored
    plans = []
    for rep, grafts in arms.items():
        examples = prompts[rep.data_seed].examples
        rows = plan_rows(examples, grafts)[0] if rep.control else prompts[rep.data_seed].rows
        n = (len(rows) + size - 1) // size
        missing = {
            t: {b for b in range(n) if batch_id(run, rep, b) not in ids} for t, ids in done.items()
        }
        plans.append(_Plan(rep, grafts, examples, rows, n, missing))
    n_rows = sum(len(p.rows) for p in plans)
    n_batches = sum(p.n_batches for p in plans)
    n_todo = {t: sum(len(p.missing[t]) for p in plans) for t in done}
    echo(_plan_line(run, arms, prompts, n_rows, n_batches, n_todo[EXAMPLES_TABLE], folder))
    for analysis in analyses:
        todo = n_todo[analysis.table]
        echo(
            f"{analysis.table}: {n_rows} rows x {analysis.describe(loaded[base])}, in {n_batches} "
            f"batches ({n_batches - todo} already done) -> {folder.path}"
        )
    quiet = not run.execution.progress
    todo_rows = sum(
        len(p.rows[b * size : (b + 1) * size]) for p in plans for b in p.missing[EXAMPLES_TABLE]
    )
    bars = {
        EXAMPLES_TABLE: tqdm(
            total=n_rows, initial=n_rows - todo_rows, desc=run.experiment, unit="row", disable=quiet
        )
    }
    for analysis in analyses:
        todo = n_todo[analysis.table]
        bars[analysis.table] = tqdm(
            total=todo, desc=analysis.table, unit="batch", disable=quiet or not todo
        )
    computed: dict[str, list[str]] = {table: [] for table in done}
    for plan in plans:
        if any(plan.missing.values()):
            with times.stage("loading"):
                models = load_run_models(run.execution, paths[plan.rep], loaded)
            for stored_id, table, frame in _replicate_batches(
                run, plan, models, executor, analyses
            ):
                folder.append_batch(table, frame, stored_id)
                computed[table].append(stored_id)
                bars[table].update(len(frame) if table == EXAMPLES_TABLE else 1)
    for bar in bars.values():
        bar.close()
    return computed


def _replicate_batches(
    run: RunSpecs,
    plan: _Plan,
    models: RunModels,
    executor: Executor | None,
    analyses: Sequence[BatchAnalysis],
) -> Iterator[tuple[str, str, pl.DataFrame]]:
    """(batch id, table, frame) of every missing batch of one replicate, group by group: the
    engine runs a group only when one of its examples batches is missing, an analysis its
    own missing batches only."""
    size = run.execution.batch_size
    donors = {n: m.model for n, m in models.donors.items()}
    examples, grafts, missing = plan.examples, plan.grafts, plan.missing
    for group in _groups(run, plan.n_batches):
        if not any(m.intersection(group) for m in missing.values()):
            continue
        chunks = [plan.rows[b * size : (b + 1) * size] for b in group]
        flat = [row for chunk in chunks for row in chunk]
        group_rows = graft_rows(examples, grafts, flat)
        metrics = None
        if missing[EXAMPLES_TABLE].intersection(group):
            # the whole group runs, stored batches included: a row's floats may depend on
            # the rows it is batched with, so a resumed run batches exactly as a whole one
            targets = [examples[ei].target_id for ei, _ in flat]
            metrics = _row_metrics(run, models.base, donors, group_rows, targets, size, executor)
        start = 0
        for b, chunk in zip(group, chunks, strict=True):
            rows = group_rows[start : start + len(chunk)]
            own = None if metrics is None else metrics.slice(start, len(chunk))
            start += len(chunk)
            stored_id = batch_id(run, plan.rep, b)
            if b in missing[EXAMPLES_TABLE] and own is not None:
                frame = _batch_frame(own, chunk, examples, grafts, plan.rep)
                if run.analysis.score_full_name:
                    chosen = [examples[ei] for ei, _ in chunk]
                    names = name_columns(run, models.base, donors, rows, chosen, frame, executor)
                    frame = pl.concat([frame, names], how="horizontal")
                yield stored_id, EXAMPLES_TABLE, frame
            for analysis in analyses:
                if b in missing[analysis.table]:
                    batch = AnalysisBatch(run, models, rows, chunk, examples, grafts, plan.rep)
                    yield stored_id, analysis.table, analysis.batch_frame(batch)


#: Stored batches handed to the engine at once: the engine routes rows to the model that does
#: most of their work and shares prompt prefixes, which fills forwards only across many rows.
GROUP_BATCHES = 8


def _groups(run: RunSpecs, n_batches: int) -> list[list[int]]:
    """The stored batches ``0 .. n_batches - 1`` in the groups that one engine call each runs:
    fixed by the plan (not by what is left to do), so that an interrupted run resumed computes
    every row in the same company as an uninterrupted one (one batch each for remote runs,
    whose requests are sized per stored batch)."""
    n = group_batches(run.execution)
    return [list(range(i, min(i + n, n_batches))) for i in range(0, n_batches, n)]


def group_batches(execution: ExecutionSpec) -> int:
    """Stored batches per engine call (:data:`GROUP_BATCHES`, 1 remotely)."""
    return 1 if execution.remote_run else GROUP_BATCHES


def _plan_line(
    run: RunSpecs,
    arms: Mapping[Replicate, list[NamedGraft]],
    prompts: Mapping[int, RunPrompts],
    n_rows: int,
    n_batches: int,
    n_todo: int,
    folder: RunFolder,
) -> str:
    """The one-line plan of a run: prompts x grafts (x replicates) = rows in batches, and
    why rows are fewer than the product (:func:`skipped_note`)."""
    first = prompts[run.data.data_seed]
    n_grafts = len(arms[run.replicates[0]])
    what = f"{len(first.examples)} prompts x {n_grafts} grafts"
    if run.replicated:
        seeds = ",".join(map(str, run.donors.finetune_seeds))
        data = ",".join(str(d) for d in prompts)
        control = " + control models" if run.donors.control else ""
        what += f" x {len(arms)} replicates (finetune seeds {seeds}, data seeds {data}{control})"
    note = skipped_note(first.examples, arms[run.replicates[0]])
    return (
        f"{run.experiment}: {what} = {n_rows} rows{note} in {n_batches} batches "
        f"({n_batches - n_todo} already done) -> {folder.path}"
    )


def _batch_frame(
    metrics: pl.DataFrame,
    chunk: Sequence[tuple[int, int]],
    examples: Sequence[TestExample],
    grafts: Sequence[NamedGraft],
    replicate: Replicate | None = None,
) -> pl.DataFrame:
    """One stored batch: which (prompt, graft, replicate) each row is, beside its
    ``metrics`` (:func:`_row_metrics`)."""
    replicate = replicate or Replicate()
    meta = pl.DataFrame(
        {
            "graft": [grafts[gi].name for _, gi in chunk],
            "group": [grafts[gi].group for _, gi in chunk],
            "spec": [str(grafts[gi].spec) for _, gi in chunk],
            "template": [examples[ei].template for ei, _ in chunk],
            "direction": [examples[ei].direction for ei, _ in chunk],
            "prompt_id": [examples[ei].prompt_id for ei, _ in chunk],
            "fact_id": [examples[ei].fact_id for ei, _ in chunk],
            "text": [examples[ei].text for ei, _ in chunk],
            "data_seed": pl.Series([replicate.data_seed] * len(chunk), dtype=pl.Int64),
            "finetune_seed": pl.Series([replicate.finetune_seed] * len(chunk), dtype=pl.Int64),
        }
    )
    return pl.concat([meta, metrics], how="horizontal")


#: top tokens a remote run returns per row (the examples table lists the top 10)
REMOTE_TOP_K = 10


def _row_metrics(
    run: RunSpecs,
    base: LoadedModel,
    donors,
    rows: list[GraftRow],
    targets: list[int],
    batch_size: int | None = None,
    executor: Executor | None = None,
) -> pl.DataFrame:
    """The metrics of ``rows`` (:func:`graft.results.metrics.example_metrics`'s columns):
    from their last-position logits locally; remotely, from the per-row metrics of
    ``targets`` computed on the server (a few numbers per row instead of a vocabulary of
    logits). Rows per forward: ``batch_size`` (default all)."""
    from graft.core.execution.engine import run_grafts, score_grafts
    from graft.remote.executor import RemoteExecutor

    remote = run.execution.remote_run
    settings: dict[str, Any] = dict(
        batch_size=batch_size or len(rows),
        pad_id=base.tokenizer.pad_token_id,
        executor=executor or (RemoteExecutor(remote) if remote else None),
    )
    ids = torch.tensor(targets)
    try:
        if remote:
            scores = score_grafts(base.model, donors, rows, targets, top_k=REMOTE_TOP_K, **settings)
            return row_metrics_frame(ids, scores, base.tokenizer)
        return example_metrics(
            run_grafts(base.model, donors, rows, **settings), ids, base.tokenizer
        )
    except SpecError as err:  # a RemoteError stays one: the command line exits 1 for it
        raise ExperimentError(str(err)) from None
