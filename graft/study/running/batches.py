"""The stored batches of a run: which are missing, the groups one engine call runs (fixed
by the plan, so a resumed run computes every row in the company an uninterrupted one does),
and each batch's table of per-example metrics, appended to the run folder."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import polars as pl
import torch
from tqdm.auto import tqdm

from graft.core.plan import GraftRow
from graft.core.spec import SpecError
from graft.errors import ExperimentError
from graft.models import LoadedModel
from graft.results.folder import RunFolder
from graft.results.metrics import example_metrics, row_metrics_frame
from graft.study.data.prompts import TestExample
from graft.study.data.rows import (
    graft_rows,
    plan_rows,
)
from graft.study.running.fullname import name_columns
from graft.study.running.run_inputs import RunPaths, RunPrompts, load_run_models
from graft.study.running.timing import StageTimes
from graft.study.specs.config import ExperimentConfig, Replicate
from graft.study.specs.grafts import Graft

logger = logging.getLogger(__name__)


EXAMPLES_TABLE = "examples"


def batch_id(cfg: ExperimentConfig, replicate: Replicate, batch: int) -> str:
    """The stored id of batch ``batch`` of ``replicate``: the number alone in a run of one
    replicate (as before replicates existed), ``<replicate label>-<batch>`` otherwise."""
    return f"{replicate.label}-{batch}" if cfg.replicated else str(batch)


def run_batches(
    cfg: ExperimentConfig,
    folder: RunFolder,
    arms: Mapping[Replicate, list[Graft]],
    prompts: Mapping[int, RunPrompts],
    paths: Mapping[Replicate, RunPaths],
    loaded: dict[str, LoadedModel],
    echo: Callable[[str], None],
    times: StageTimes,
    executor: Any = None,
) -> None:
    """Run and store every batch the run folder does not hold yet, replicate by replicate
    (each replicate's models loaded once, timed as ``times``' loading stage); ``executor``:
    where the engine runs them (default: this machine, or ``cfg``'s remote host)."""
    size = cfg.batch_size
    done = folder.done_batches(EXAMPLES_TABLE)
    plans = []
    for rep, grafts in arms.items():
        examples = prompts[rep.data_seed].examples
        rows = plan_rows(examples, grafts)[0] if rep.control else prompts[rep.data_seed].rows
        n_batches = (len(rows) + size - 1) // size
        missing = {b for b in range(n_batches) if batch_id(cfg, rep, b) not in done}
        plans.append((rep, grafts, examples, rows, n_batches, missing))
    n_rows = sum(len(p[3]) for p in plans)
    n_batches = sum(p[4] for p in plans)
    n_todo = sum(len(p[5]) for p in plans)
    echo(_plan_line(cfg, arms, prompts, n_rows, n_batches, n_todo, folder))
    todo_rows = sum(len(p[3][b * size : (b + 1) * size]) for p in plans for b in p[5])
    bar = tqdm(
        total=n_rows,
        initial=n_rows - todo_rows,
        desc=cfg.experiment,
        unit="row",
        disable=not cfg.progress,
    )
    for rep, grafts, examples, rows, rep_batches, missing in plans:
        if not missing:
            continue
        with times.stage("loading"):
            models = load_run_models(cfg, paths[rep], loaded)
        torch_donors = {n: m.model for n, m in models.donors.items()}
        for group in _groups(cfg, rep_batches):
            if not missing.intersection(group):
                continue
            # the whole group runs, stored batches included: a row's floats may depend on
            # the rows it is batched with, so a resumed run batches exactly as a whole one
            chunks = [rows[b * size : (b + 1) * size] for b in group]
            flat = [row for chunk in chunks for row in chunk]
            targets = [examples[ei].target_id for ei, _ in flat]
            group_rows = graft_rows(examples, grafts, flat)
            group_scores = _run_rows(
                cfg, models.base, torch_donors, group_rows, targets, size, executor
            )
            start = 0
            for b, chunk in zip(group, chunks, strict=True):
                end = start + len(chunk)
                batch_rows, scores = group_rows[start:end], _slice_scores(group_scores, start, end)
                start = end
                if b not in missing:
                    continue
                frame = _batch_frame(scores, chunk, examples, grafts, models.base.tokenizer, rep)
                if cfg.score_full_name:
                    chosen = [examples[ei] for ei, _ in chunk]
                    names = name_columns(
                        cfg, models.base, torch_donors, batch_rows, chosen, frame, executor
                    )
                    frame = pl.concat([frame, names], how="horizontal")
                folder.append_batch(EXAMPLES_TABLE, frame, batch_id(cfg, rep, b))
                bar.update(len(chunk))
    bar.close()


#: Stored batches handed to the engine at once: the engine routes rows to the model that does
#: most of their work and shares prompt prefixes, which fills forwards only across many rows.
GROUP_BATCHES = 8


def _groups(cfg: ExperimentConfig, n_batches: int) -> list[list[int]]:
    """The stored batches ``0 .. n_batches - 1`` in the groups that one engine call each runs:
    fixed by the plan (not by what is left to do), so that an interrupted run resumed computes
    every row in the same company as an uninterrupted one (one batch each for remote runs,
    whose requests are sized per stored batch)."""
    n = group_batches(cfg)
    return [list(range(i, min(i + n, n_batches))) for i in range(0, n_batches, n)]


def group_batches(cfg: ExperimentConfig) -> int:
    """Stored batches per engine call of ``cfg``'s run (:data:`GROUP_BATCHES`, 1 remotely)."""
    return 1 if cfg.remote_run else GROUP_BATCHES


def _slice_scores(scores, start: int, end: int):
    """Rows ``start:end`` of logits or of a dict of per-row metrics."""
    if isinstance(scores, dict):
        return {name: value[start:end] for name, value in scores.items()}
    return scores[start:end]


def _plan_line(
    cfg: ExperimentConfig,
    arms: Mapping[Replicate, list[Graft]],
    prompts: Mapping[int, RunPrompts],
    n_rows: int,
    n_batches: int,
    n_todo: int,
    folder: RunFolder,
) -> str:
    """The one-line plan of a run: prompts x grafts (x replicates) = rows in batches."""
    first = prompts[cfg.data_seed]
    n_grafts = len(arms[cfg.replicates[0]])
    what = f"{len(first.examples)} prompts x {n_grafts} grafts"
    if cfg.replicated:
        seeds = ",".join(map(str, cfg.finetune_seeds or (0,)))
        data = ",".join(str(d) for d in prompts)
        control = " + control models" if cfg.control else ""
        what += f" x {len(arms)} replicates (finetune seeds {seeds}, data seeds {data}{control})"
    return (
        f"{cfg.experiment}: {what} = {n_rows} rows in {n_batches} batches "
        f"({n_batches - n_todo} already done) -> {folder.path}"
    )


def _batch_frame(
    scores: torch.Tensor | dict[str, torch.Tensor],
    chunk: Sequence[tuple[int, int]],
    examples: Sequence[TestExample],
    grafts: Sequence[Graft],
    tokenizer: Any,
    replicate: Replicate | None = None,
) -> pl.DataFrame:
    """One stored batch: which (prompt, graft, replicate) each row is, and its metrics (from
    logits, or from the metrics a remote run computed inside its trace)."""
    replicate = replicate or Replicate()
    targets = torch.tensor([examples[ei].target_id for ei, _ in chunk])
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
    metrics = (
        row_metrics_frame(targets, scores, tokenizer)
        if isinstance(scores, dict)
        else example_metrics(scores, targets, tokenizer)
    )
    return pl.concat([meta, metrics], how="horizontal")


#: top tokens a remote run returns per row (the examples table lists the top 10)
REMOTE_TOP_K = 10


def _run_rows(
    cfg: ExperimentConfig,
    base: LoadedModel,
    donors,
    rows: list[GraftRow],
    targets: list[int],
    batch_size: int | None = None,
    executor: Any = None,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Last-position logits of ``rows`` locally; remotely, the per-row metrics of ``targets``
    computed on the server (a few numbers per row instead of a vocabulary of logits). Rows per
    forward: ``batch_size`` (default all)."""
    from graft.core.engine import run_grafts
    from graft.remote.executor import RemoteExecutor

    remote = cfg.remote_run
    try:
        return run_grafts(
            base.model,
            donors,
            rows,
            batch_size=batch_size or len(rows),
            pad_id=base.tokenizer.pad_token_id,
            executor=executor or (RemoteExecutor(remote) if remote else None),
            targets=targets if remote else None,
            top_k=REMOTE_TOP_K,
        )
    except SpecError as err:  # a RemoteError stays one: the command line exits 1 for it
        raise ExperimentError(str(err)) from None
