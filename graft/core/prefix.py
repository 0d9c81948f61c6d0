"""Shared prefixes: rows that graft only their last token share the prompt before it.

A graft changes nothing before its first grafted position (causality), so a row whose every
grafted cell (the head included) is at the last token computes, on every earlier position,
exactly what its carrier model computes on the prompt alone. Such rows are grouped by prompt:
each prompt's prefix (every token but the last) runs once, without a trace, filling a
key/value cache; the cache is then selected for each row of the prompt, and only the last
token runs, in a trace with the row's graft. E3's component sets at LT then cost one prompt
forward plus one single-token step per graft, not one full forward per graft.

This module plans the steps (:func:`prefix_plans`: batch plans with a
:class:`graft.core.plan.SharedPrefix`) and handles the cache (:func:`prefix_cache`,
:func:`select_rows`); :class:`graft.core.engine.LocalExecutor` runs them. Prefixes are padded on the left with explicit position ids, so each row's
step sees its own prompt's positions and attends to its own prompt's keys only.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn

from graft.core.arch import Architecture
from graft.core.plan import BatchPlan, GraftRow, LayoutCache, SharedPrefix, plan_batch
from graft.core.spec import ResolvedGraft

#: A step holds at most this many rows per row of a batch (a step row is one token).
STEP_ROWS_PER_BATCH_ROW = 4


def grafts_last_token_only(res: ResolvedGraft, length: int) -> bool:
    """Whether ``res`` grafts something, and only at the last of ``length`` >= 2 tokens (the
    head acts there anyway)."""
    if length < 2 or not (res.cells or res.final_norm_donor or res.unembed_donor):
        return False
    last = length - 1
    return all(cell.keys() == {last} for cell in res.cells.values())


def accepts_cache(model: nn.Module) -> bool:
    """Whether ``model``'s forward takes a key/value cache (``past_key_values``)."""
    return "past_key_values" in inspect.signature(model.forward).parameters


def _step_plan(full: BatchPlan, prefix: BatchPlan, prompt_index: torch.Tensor) -> BatchPlan:
    """The last column of ``full`` (a left-padded plan whose every mark is in that column)
    as a step on ``prefix``: ids, positions and masks [batch, 1], attention over prefix + 1."""
    for p in full.patches:
        if p.rows[:, :-1].any():
            raise AssertionError(f"a prefix step grafts {p.path} before the last token")
    mask = prefix.attention_mask[prompt_index]
    return BatchPlan(
        input_ids=full.input_ids[:, -1:],
        attention_mask=torch.cat([mask, torch.ones((len(mask), 1), dtype=mask.dtype)], dim=1),
        position_ids=full.position_ids[:, -1:],
        last_index=torch.zeros(len(mask), dtype=torch.long),
        patches=[replace(p, rows=p.rows[:, -1:]) for p in full.patches],
        keep_last_only=True,
        targets=full.targets,
        top_k=full.top_k,
        prefix=SharedPrefix(prefix, prompt_index),
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
) -> list[tuple[list[int], BatchPlan]]:
    """(row indices, step plan) for the rows ``indices``, each grafting its last token only
    (:func:`grafts_last_token_only`; ``resolved`` holds each row's graft on the model that
    runs it). Prompts, sorted by length, are grouped ``batch_size`` at a time; each group's
    prefixes form one :class:`SharedPrefix` batch and its rows, a prompt's rows together,
    steps of one token per row: up to as many tokens as ``batch_size`` whole prompts of the
    group (at most ``STEP_ROWS_PER_BATCH_ROW * batch_size`` rows), so that the step's matrix
    products are wide enough to run efficiently."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i in indices:
        by_prompt.setdefault(tuple(rows[i].input_ids), []).append(i)
    prompts = sorted(by_prompt, key=lambda ids: (len(ids), ids))
    layouts = LayoutCache()
    steps = []
    for start in range(0, len(prompts), batch_size):
        group = prompts[start : start + batch_size]
        prefix = plan_batch(arch, [GraftRow(ids[:-1]) for ids in group], pad_id=pad_id)
        order = [(p, i) for p, ids in enumerate(group) for i in by_prompt[ids]]
        per_step = batch_size * min(STEP_ROWS_PER_BATCH_ROW, len(group[-1]))
        for s in range(0, len(order), per_step):
            part = order[s : s + per_step]
            idx = [i for _, i in part]
            full = plan_batch(
                arch,
                [rows[i] for i in idx],
                pad_id=pad_id,
                resolved=[resolved[i] for i in idx],
                layouts=layouts,
            )
            if targets is not None:
                full.targets, full.top_k = targets[torch.tensor(idx, dtype=torch.long)], top_k
            prompt_index = torch.tensor([p for p, _ in part], dtype=torch.long)
            steps.append((idx, _step_plan(full, prefix, prompt_index)))
    return steps


def prefix_cache(model: nn.Module, prefix: BatchPlan, device: torch.device):
    """The key/value cache of ``model`` (a causal LM) over the prefixes, run without its
    head (only the cache is kept)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model.base_model(
            input_ids=prefix.input_ids.to(device),
            attention_mask=prefix.attention_mask.to(device),
            position_ids=prefix.position_ids.to(device),
            past_key_values=cache,
            use_cache=True,
        )
    return cache


def select_rows(cache, index: torch.Tensor):
    """A cache holding ``cache``'s entries for the prompts ``index`` (one per row); ``cache``
    itself is left as it is, so every step of a group starts from the same prefixes."""
    selected = copy.copy(cache)
    selected.layers = [copy.copy(layer) for layer in cache.layers]
    selected.batch_select_indices(index)
    return selected
