"""Scoring a whole continuation (e.g. a target name) under a graft, token by token.

A target of ``m`` tokens ``t_0 .. t_{m-1}`` after a prompt of ``p`` tokens is scored
teacher-forced: row ``j`` is the prompt followed by ``t_0 .. t_{j-1}``, with
``GraftRow.prompt_length = p``, read at its last position with target ``t_j``. On such rows
``LT`` covers the last prompt token and every continuation position, so the last-token
graft follows the prediction position along the target; named spans and indices stay on the
prompt, ``ALL`` and complements cover the continuation too (see
:func:`graft.core.language.selectors.position_set`). A graft of nothing is then the base's own
scoring and ``ALL:all:all; head=donor`` the donor's.

The target's log-probability is the sum of its steps'. Greedy decoding reproduces the
target exactly iff at every step the target token is the most probable one given the
previous target tokens (rank 0), so exact match needs no generation pass. (Rank 0 counts
ties in the target's favour, where an argmax would pick the lowest id; with float logits
exact ties do not happen in practice.)

Every step is a row of its own, so the engine and every executor (local or remote) run it
unchanged, with per-row metrics computed inside the trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from graft.core.execution.engine import score_grafts
from graft.core.planning.plan import GraftRow
from graft.errors import SpecError

__all__ = ["continuation_rows", "score_continuations"]


def continuation_rows(
    rows: Sequence[GraftRow], continuations: Sequence[Sequence[int]], start: int = 0
) -> tuple[list[GraftRow], list[int], list[tuple[int, int]]]:
    """The teacher-forced rows of each row's continuation.

    Args:
        rows: prompt rows (their ``prompt_length`` unset).
        continuations: per row, the continuation's token ids (at least one).
        start: the first step to build (1 skips step 0, the prompt itself, when its score
            is already known).

    Returns:
        the rows, each one's target token id, and each one's ``(row index, step)``.
    """
    if len(continuations) != len(rows):
        raise SpecError(f"{len(continuations)} continuations for {len(rows)} rows: one per row")
    out, targets, where = [], [], []
    for i, (row, ids) in enumerate(zip(rows, continuations, strict=True)):
        ids = [int(t) for t in ids]
        if not ids:
            raise SpecError(f"row {i}: the continuation has no tokens; give at least one")
        if row.prompt_length is not None:
            raise SpecError(f"row {i} already has a continuation (prompt_length is set)")
        prompt = list(row.input_ids)
        for j in range(start, len(ids)):
            out.append(GraftRow(prompt + ids[:j], row.spans, row.spec, len(prompt)))
            targets.append(ids[j])
            where.append((i, j))
    return out, targets, where


def score_continuations(
    base: Any,
    donors: Any,
    rows: Sequence[GraftRow],
    continuations: Sequence[Sequence[int]],
    *,
    first: tuple[Sequence[float], Sequence[int]] | None = None,
    **kwargs: Any,
) -> dict[str, torch.Tensor]:
    """Teacher-forced scores of each row's continuation under the row's graft.

    Args:
        base, donors: as for :func:`graft.core.execution.engine.run_grafts`.
        rows: prompt rows: ``GraftRow(input_ids, spans, spec)``.
        continuations: per row, the continuation's token ids (e.g. a target name's).
        first: the step-0 scores when already known, as (log-probabilities, ranks) of each
            continuation's first token after its row's prompt (e.g. a run's first-token
            metrics); that step is then not run again, and the others run in a batch with
            one row less per continuation, so they equal a run without ``first`` within the
            engine's float bound rather than bit for bit (a batch of another shape may round
            differently in the last bit).
        **kwargs: passed to ``score_grafts`` (batch_size, executor, pad_id, ...).

    Returns:
        ``logprob`` [rows] (float64: the sum over the continuation's tokens), ``tokens``
        [rows] (its length), ``exact`` [rows] (bool: greedy decoding reproduces it, i.e.
        every step has rank 0), ``step_logprobs`` [rows, longest] (NaN past each row's end)
        and ``step_ranks`` [rows, longest] (-1 past the end).
    """
    ext, targets, where = continuation_rows(rows, continuations, start=0 if first is None else 1)
    longest = max((len(c) for c in continuations), default=0)
    logprobs = torch.full((len(rows), longest), float("nan"), dtype=torch.float64)
    ranks = torch.full((len(rows), longest), -1, dtype=torch.long)
    if first is not None:
        logprobs[:, 0] = torch.as_tensor(first[0], dtype=torch.float64)
        ranks[:, 0] = torch.as_tensor(first[1], dtype=torch.long)
    if ext:
        metrics = score_grafts(base, donors, ext, targets, top_k=1, **kwargs)
        idx = torch.tensor(where, dtype=torch.long).reshape(-1, 2)
        logprobs[idx[:, 0], idx[:, 1]] = metrics["target_logprob"].double()
        ranks[idx[:, 0], idx[:, 1]] = metrics["target_rank"]
    lengths = torch.tensor([len(c) for c in continuations], dtype=torch.long)
    inside = torch.arange(longest)[None, :] < lengths[:, None]
    return {
        "logprob": torch.where(inside, logprobs, 0.0).sum(dim=1),
        "tokens": lengths,
        "exact": ((ranks == 0) | ~inside).all(dim=1),
        "step_logprobs": logprobs,
        "step_ranks": ranks,
    }
