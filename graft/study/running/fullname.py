"""Whole-name scoring in an experiment (``ExperimentConfig.score_full_name``).

The first token of a common first name ("Robert") is a weak test of a recalled fact, so a
run can also score every token of the target name, teacher-forced
(:func:`graft.core.api.continuation.score_continuations`): the name's log-probability and
whether greedy decoding reproduces the whole name. Step 0 is the row's own first-token
result, so each example costs one extra row per name token after the first; the last-token
graft follows the prediction position along the name (``GraftRow.prompt_length``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from graft.core.api.continuation import score_continuations
from graft.core.execution.executor import Executor
from graft.core.planning.plan import GraftRow
from graft.errors import ExperimentError, SpecError
from graft.results.metrics import name_metrics_frame
from graft.study.data.prompts import TestExample
from graft.study.specs.run import AnalysisSpec, RunSpecs

#: The option a resumed run must share with its stored config once either scores names.
NAME_OPTION = "options.score_full_name"


def name_columns(
    run: RunSpecs,
    base: Any,
    donors: Mapping[str, Any],
    rows: Sequence[GraftRow],
    examples: Sequence[TestExample],
    first: pl.DataFrame,
    executor: Executor | None = None,
) -> pl.DataFrame:
    """The whole-name columns of one stored batch.

    Args:
        run: the run's options (rows per forward, remote execution).
        base: the base ``LoadedModel``; donors: donor name -> torch model.
        rows: the batch's engine rows; examples: the test example of each row.
        first: the batch's first-token metrics (``target_logprob``, ``target_rank``), the
            name's step 0.
        executor: where the engine runs the name's steps (default: this machine, or the
            remote host of ``run``).

    Returns:
        ``name_text`` and :func:`graft.results.metrics.name_metrics_frame`'s columns.
    """
    from graft.remote.executor import RemoteExecutor

    remote = run.execution.remote_run
    step0 = (first["target_logprob"].to_list(), first["target_rank"].to_list())
    try:
        scores = score_continuations(
            base.model,
            donors,
            rows,
            [ex.target_ids for ex in examples],
            first=step0,
            batch_size=run.execution.batch_size,
            pad_id=base.tokenizer.pad_token_id,
            executor=executor or (RemoteExecutor(remote) if remote is not None else None),
        )
    except SpecError as err:  # a RemoteError stays one: the command line exits 1 for it
        raise ExperimentError(str(err)) from None
    names = pl.DataFrame({"name_text": [ex.target_text for ex in examples]})
    return pl.concat([names, name_metrics_frame(scores)], how="horizontal")


def resume_key(analysis: AnalysisSpec, stored: Mapping[str, Any] | None) -> list[str]:
    """The config key of whole-name scoring for resuming: checked when this run or the
    stored one (``stored``: its ``config.json``, None for a new run) scores names, so their
    batches never mix; runs from before the option existed resume as they were."""
    before = (stored or {}).get("options", {}).get("score_full_name", False)
    return [NAME_OPTION] if analysis.score_full_name or before else []
