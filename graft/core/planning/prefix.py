"""Shared prefixes: rows of one prompt that differ only at its last token share the rest.

A graft changes nothing before its first grafted position (causality), so every earlier
position of a row computes what its carrier model, grafted as the row is before its last
token, computes on the prompt alone. Rows of one prompt whose grafts agree before the last
token (:func:`prefix_signature`: nothing, for the rows that graft only their last token; or
e.g. the first entity, for FE and FE+LT) are grouped: their prefix (every token but the
last) runs once, filling a key/value cache (without a trace when nothing is grafted there,
else in a trace with the prefix's graft); the cache is selected for each row, and only the
last token runs, in a trace with the row's graft there. E3's component sets at LT then cost
one prompt forward plus one single-token step per graft, and FE+LT costs a step once FE ran.

This module plans the steps (:func:`prefix_plans`: batch plans with a
:class:`graft.core.planning.plan.SharedPrefix`); :mod:`graft.core.planning.kv_cache` handles
the cache (:func:`~graft.core.planning.kv_cache.prefix_cache`,
:func:`~graft.core.planning.kv_cache.select_rows`);
:class:`graft.core.execution.engine.LocalExecutor` runs them. Prefixes are
padded on the left with explicit position ids, so each row's step sees its own prompt's
positions and attends to its own prompt's keys only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

import torch

from graft.core.families.arch import Architecture
from graft.core.language.spec import ResolvedGraft
from graft.core.planning.plan import (
    BatchPlan,
    GraftRow,
    LayoutCache,
    SharedPrefix,
    SitePatch,
    _layout_key,
    plan_batch,
)

if TYPE_CHECKING:
    pass

#: A step holds at most this many rows per row of a batch (a step row is one token) ...
STEP_ROWS_PER_BATCH_ROW = 4
#: ... and at most this many in all unless a batch is larger: a one-token step's matrix
#: products run near full speed at this width, while its logits and its group's key/value
#: cache grow with every row (SmolLM2-135M on a 2-core CPU, E1 at batch 64: steps of 256 rows
#: were 5% faster than of 128 and took 5% more memory than the bound).
STEP_ROWS = 128


def step_rows(batch_size: int) -> int:
    """Most rows of one step, and most prefixes of one group, for ``batch_size``: up to
    :data:`STEP_ROWS_PER_BATCH_ROW` batches' worth, capped at :data:`STEP_ROWS` (never
    below one batch)."""
    return max(batch_size, min(STEP_ROWS_PER_BATCH_ROW * batch_size, STEP_ROWS))


#: What a graft grafts before a prompt's last token: ``(layer, component, position, donor)``.
Signature = tuple[tuple[int, str, int, str], ...]


def prefix_signature(res: ResolvedGraft, length: int) -> Signature:
    """What ``res`` grafts before the last of ``length`` tokens, as a comparable tuple of
    ``(layer, component, position, donor)``: rows of one prompt with equal signatures compute
    the same prefix (causality), whatever they graft at the last token."""
    last = length - 1
    return tuple(
        sorted(
            (layer, component, position, donor)
            for (layer, component), cell in res.cells.items()
            for position, donor in cell.items()
            if position < last
        )
    )


def before_last(res: ResolvedGraft, length: int) -> ResolvedGraft:
    """``res`` on the prefix: its cells before the last of ``length`` tokens (no head)."""
    last = length - 1
    cells = {}
    for key, cell in res.cells.items():
        kept = {p: d for p, d in cell.items() if p < last}
        if kept:
            cells[key] = kept
    return ResolvedGraft(cells)


def grafts_last_token_only(res: ResolvedGraft, length: int) -> bool:
    """Whether ``res`` grafts something, and only at the last of ``length`` >= 2 tokens (the
    head acts there anyway)."""
    if length < 2 or not (res.cells or res.final_norm_donor or res.unembed_donor):
        return False
    last = length - 1
    return all(cell.keys() == {last} for cell in res.cells.values())


def _cut(patch: SitePatch, region: tuple[slice, slice]) -> SitePatch | None:
    """``patch`` on the part ``region`` (an index into its [batch, positions] mask that keeps
    two dimensions) of its batch, None when it marks nothing there; fused q/k/v slices, given
    per marked cell, keep the cells inside."""
    rows = patch.rows[region]
    if not rows.any():
        return None
    if not patch.slices:
        return replace(patch, rows=rows)
    inside = torch.zeros_like(patch.rows)
    inside[region] = True
    keep = inside[patch.rows]  # per marked cell of the whole batch: is it inside
    return replace(patch, rows=rows, slices=[(k, m[keep]) for k, m in patch.slices])


def _last_column(patch: SitePatch) -> SitePatch | None:
    """``patch`` on the last column of its batch (see :func:`_cut`)."""
    return _cut(patch, (slice(None), slice(-1, None)))


def columns_from(full: BatchPlan, start: int) -> BatchPlan:
    """The columns ``start:`` of ``full`` (a left-padded plan) as a window on a key/value
    cache that holds the columns before: ids, positions and patches of the window, the
    attention mask over cache and window, only the last column's logits kept."""
    width = full.input_ids.shape[1]
    cut = (_cut(p, (slice(None), slice(start, None))) for p in full.patches)
    return BatchPlan(
        input_ids=full.input_ids[:, start:],
        attention_mask=full.attention_mask,
        position_ids=full.position_ids[:, start:],
        last_index=torch.full((len(full.input_ids),), width - 1 - start, dtype=torch.long),
        patches=[p for p in cut if p is not None],
        keep_last_only=True,
    )


def slice_rows(plan: BatchPlan, start: int, stop: int) -> BatchPlan:
    """Rows ``start:stop`` of ``plan`` (a prefix plan: no targets), their patches with them."""
    cut = (_cut(p, (slice(start, stop), slice(None))) for p in plan.patches)
    patches = [p for p in cut if p is not None]
    return replace(
        plan,
        input_ids=plan.input_ids[start:stop],
        attention_mask=plan.attention_mask[start:stop],
        position_ids=plan.position_ids[start:stop],
        last_index=plan.last_index[start:stop],
        patches=patches,
    )


def _step_plan(
    full: BatchPlan, prefix: BatchPlan, prompt_index: torch.Tensor, parts: list[tuple[int, int]]
) -> BatchPlan:
    """The last column of ``full`` (a left-padded plan; its marks before that column are
    the prefixes' own, computed by ``prefix``, a forward per row range of ``parts``) as a
    step on ``prefix``: ids, positions and masks [batch, 1], attention over prefix + 1."""
    mask = prefix.attention_mask[prompt_index]
    patches = [p for p in map(_last_column, full.patches) if p is not None]
    return BatchPlan(
        input_ids=full.input_ids[:, -1:],
        attention_mask=torch.cat([mask, torch.ones((len(mask), 1), dtype=mask.dtype)], dim=1),
        position_ids=full.position_ids[:, -1:],
        last_index=torch.zeros(len(mask), dtype=torch.long),
        patches=patches,
        keep_last_only=True,
        targets=full.targets,
        top_k=full.top_k,
        prefix=SharedPrefix(prefix, prompt_index, parts),
    )


def prefix_plans(
    arch: Architecture,
    rows: Sequence[GraftRow],
    resolved: Sequence[ResolvedGraft],
    indices: Sequence[int],
    batch_size: int,
    *,
    pad_id: int,
    targets: torch.Tensor | None = None,
    top_k: int = 0,
    kept: tuple[LayoutCache, LayoutCache] | None = None,
    steps_on: Mapping[int, tuple[str, ResolvedGraft]] | None = None,
    step_layouts: Callable[[str], LayoutCache] | None = None,
) -> list[tuple[list[int], BatchPlan]]:
    """(row indices, step plan) for the rows ``indices`` (``resolved`` holds each row's graft
    on the model that runs it). Rows are keyed by prompt and :func:`prefix_signature`: one
    prefix per key, grafted as the key's rows graft it (most often not at all: rows that
    graft their last token only). Keys, sorted by prompt length, are grouped
    :func:`step_rows` at a time; each group's prefixes form one :class:`SharedPrefix` batch
    (run ``batch_size`` rows per forward, ungrafted and grafted ones apart: the ungrafted
    without a trace) and its rows, a key's rows together, steps of one token per row: up to
    as many tokens as ``batch_size`` whole prompts of the group (at most :func:`step_rows`
    rows), so that the step's matrix products are wide enough to run efficiently and every
    weight is read once per step. ``kept``: the steps' and the prefixes' row layouts
    kept from earlier calls (:mod:`graft.core.planning.plan_cache`); what is derived from a row's
    graft alone (its prefix signature and graft) is kept with the steps' layouts.
    ``steps_on``: rows whose step another model runs (``graft.core.execution.routing``'s
    ``_Routes.steps``), each (its name, the step's graft there); a step's rows are split by
    the model that runs them (:attr:`BatchPlan.step_model`), their layouts kept in
    ``step_layouts(name)``."""
    layouts, prefix_layouts = kept if kept is not None else (LayoutCache(), LayoutCache())
    moved = steps_on or {}
    own_layouts: dict[str, LayoutCache] = {}

    def layouts_on(model: str) -> LayoutCache:
        if step_layouts is not None:
            return step_layouts(model)
        return own_layouts.setdefault(model, LayoutCache())

    by_key: dict[tuple[tuple[int, ...], Signature], list[int]] = {}
    for i in indices:
        ids = tuple(rows[i].input_ids)
        signature = layouts.remember(
            "signature", _layout_key(rows[i]), partial(prefix_signature, resolved[i], len(ids))
        )
        by_key.setdefault((ids, signature), []).append(i)
    keys = sorted(by_key, key=lambda key: (len(key[0]), key[0]))
    size = step_rows(batch_size)
    steps = []
    for start in range(0, len(keys), size):
        # ungrafted prefixes first: chunks of them run without a trace
        group = sorted(keys[start : start + size], key=lambda key: bool(key[1]))
        firsts = [by_key[key][0] for key in group]  # their spec and spans key the layouts
        prefix = plan_batch(
            arch,
            [GraftRow(rows[i].input_ids[:-1], rows[i].spans, rows[i].spec) for i in firsts],
            pad_id=pad_id,
            resolved=[
                layouts.remember(
                    "before_last",
                    _layout_key(rows[i]),
                    partial(before_last, resolved[i], len(rows[i].input_ids)),
                )
                for i in firsts
            ],
            layouts=prefix_layouts,
        )
        n_plain = sum(not sig for _, sig in group)  # ungrafted and grafted rows apart
        parts = [
            (a, min(a + batch_size, stop))
            for begin, stop in ((0, n_plain), (n_plain, len(group)))
            for a in range(begin, stop, batch_size)
        ]
        order = [(p, i) for p, key in enumerate(group) for i in by_key[key]]
        longest = max(len(ids) for ids, _ in group)
        per_step = min(size, batch_size * longest)
        for s in range(0, len(order), per_step):
            by_model: dict[str | None, list[tuple[int, int]]] = {}
            for p, i in order[s : s + per_step]:
                by_model.setdefault(moved[i][0] if i in moved else None, []).append((p, i))
            for model, part in by_model.items():
                idx = [i for _, i in part]
                full = plan_batch(
                    arch,
                    [rows[i] for i in idx],
                    pad_id=pad_id,
                    resolved=[resolved[i] if model is None else moved[i][1] for i in idx],
                    layouts=layouts if model is None else layouts_on(model),
                )
                if targets is not None:
                    full.targets = targets[torch.tensor(idx, dtype=torch.long)]
                    full.top_k = top_k
                prompt_index = torch.tensor([p for p, _ in part], dtype=torch.long)
                step = _step_plan(full, prefix, prompt_index, parts)
                step.step_model = model
                steps.append((idx, step))
    return steps
