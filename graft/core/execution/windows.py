"""Rows run from their first changed column: before it, the running model's own keys and values.

A row whose first grafted (or patched) cell lies in column ``c`` computes, in the columns
before ``c``, exactly what the running model's plain forward computes there, at every layer:
a sweep's cells at a late position unit recompute them for every cell. Here the rows of a
batch are grouped by their first changed column (:func:`first_changed_columns`); for each
group with ``c > 0`` the running model's keys and values of the first ``c`` columns (saved
with its layer inputs by the prompt's one plain forward,
:func:`graft.core.execution.resume.layer_inputs`) make a key/value cache
(:func:`leading_cache`), and the rows run their columns from ``c`` on alone
(:func:`step_inputs`, :func:`windowed`) from their first changed layer
(:mod:`graft.core.execution.resume`), each layer gathering its rows' prompts from the cache
(:func:`graft.core.planning.kv_cache.select_rows_by_layer`) and the saved layer inputs cut to
those columns. Batches are left-padded, so every row's last position is the last
column. Equal to the whole forward up to rounding (a step over a cache orders its sums
differently), tested on every family.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from graft.core.execution import resume
from graft.core.execution.prompt_values import PromptValues
from graft.core.planning.kv_cache import (
    cache_argument,
    gathers_per_layer,
    new_cache,
    select_rows_by_layer,
)


def first_changed_columns(patches: Sequence[Any], n_rows: int, length: int) -> torch.Tensor:
    """[rows] each row's first of ``length`` columns that ``patches`` change (``length - 1``
    for a row changed at none, or only by a mask over fewer columns: the head under
    ``logits_to_keep``): its columns before are the running model's own at every layer."""
    first = torch.full((n_rows,), length - 1, dtype=torch.long)
    for p in patches:
        rows = p.rows.cpu()
        if rows.shape[1] != length:
            continue
        touched = rows.any(dim=1)
        at = rows.to(torch.int8).argmax(dim=1)  # the first marked column
        first[touched] = torch.minimum(first[touched], at[touched])
    return first


def step_inputs(
    inputs: Mapping[str, Any], cache_name: str, cache: Any, start: int = -1
) -> dict[str, Any]:
    """``inputs`` (whole left-padded prompts) as a step over ``cache``, the prompts'
    key/value cache of their columns before ``start`` (-1: all but the last): the columns
    from ``start`` on, their positions, the whole mask."""
    return {
        **inputs,
        "input_ids": inputs["input_ids"][:, start:],
        "position_ids": inputs["position_ids"][:, start:],
        cache_name: cache,
        "use_cache": True,
    }


def takes_cache(model: nn.Module) -> bool:
    """Whether ``model``'s rows can step over a key/value cache of their leading columns:
    it takes a cache whose layers can be gathered layer by layer (plain or sliding-window
    key/value layers, as its config makes them)."""
    return cache_argument(model) is not None and gathers_per_layer(new_cache(model))


def leading_cache(
    model: nn.Module,
    distinct: Mapping[str, Any],
    start: int,
    keys: Sequence[torch.Tensor] = (),
    values: Sequence[torch.Tensor] = (),
) -> Any | None:
    """A key/value cache of the running model's first ``start`` columns of ``distinct``'s
    prompts: from its layers' ``keys`` and ``values`` over the whole prompts ([prompts,
    heads, positions, dim], as :func:`graft.core.execution.resume.plain_layer_inputs` saves
    them), else (none given, or a layer kept fewer positions: a sliding window shorter than
    the prompt) from a forward of its decoder over those columns. None where ``start`` is 0
    or the model's cache cannot be gathered layer by layer (:func:`takes_cache`)."""
    if start < 1 or not takes_cache(model):
        return None
    cache = new_cache(model)
    length = distinct["input_ids"].shape[1]
    if keys and all(k.shape[-2] == length for k in keys):
        for j, (k, v) in enumerate(zip(keys, values, strict=True)):
            cache.update(k[:, :, :start], v[:, :, :start], j)
        return cache
    decoder = cast(nn.Module, model.base_model)
    with torch.no_grad():
        decoder(
            input_ids=distinct["input_ids"][:, :start],
            attention_mask=distinct["attention_mask"][:, :start],
            position_ids=distinct["position_ids"][:, :start],
            use_cache=True,
            **{cast(str, cache_argument(model)): cache},
        )
    return cache


def windowed(
    batch: types.SimpleNamespace, start: int, cache_name: str, cache: Any
) -> types.SimpleNamespace:
    """``batch`` as a step over ``cache`` from column ``start``: its inputs' columns from
    ``start`` on (:func:`step_inputs`), its patches' masks likewise (no marked cell lies
    before ``start``: their slice masks, over the marked cells, stay), each row's last
    position counted in the step's columns."""
    length = batch.inputs["input_ids"].shape[1]

    def cut(p: types.SimpleNamespace) -> types.SimpleNamespace:
        if p.rows.shape[1] != length:  # the head under logits_to_keep
            return p
        return types.SimpleNamespace(**{**vars(p), "rows": p.rows[:, start:], "cells": None})

    pick = torch.where(batch.pick >= 0, batch.pick - start, batch.pick)
    return types.SimpleNamespace(
        **{
            **vars(batch),
            "inputs": step_inputs(batch.inputs, cache_name, cache, start),
            "patches": [cut(p) for p in batch.patches],
            "pick": pick,
        }
    )


def split_states(
    found: Sequence[torch.Tensor], n_layers: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """:func:`graft.core.execution.resume.layer_inputs`'s tensors as (layer inputs, keys,
    values); the last two empty where it kept no keys and values."""
    found = list(found)
    inputs = n_layers + 1
    return found[:inputs], found[inputs : inputs + n_layers], found[inputs + n_layers :]


def run_resumed(
    batch: types.SimpleNamespace,
    model: nn.Module,
    layers: Sequence[nn.Module],
    where: tuple[str, Sequence[str]],
    values: PromptValues,
    forward: Callable[[types.SimpleNamespace, resume.Resumed | None], torch.Tensor],
    force: bool = False,
) -> torch.Tensor | None:
    """``batch`` run by ``forward`` from each row's first changed layer, and from its first
    changed column where that is past the first (one forward per such column); None where
    every row starts at column 0 and resuming does not pay
    (:func:`graft.core.execution.resume.prepare`; ``force``: resume always). ``forward``
    takes a batch and how it was cut (its distinct prompts and each row's prompt; None for
    rows run whole) and returns its rows' results. ``where``: the layers' module path and
    the modules after them (final norm, head); ``values``: each prompt's layer inputs, kept."""
    layers_path, after = where
    n_rows, length = batch.inputs["input_ids"].shape
    first = first_changed_columns(batch.patches, n_rows, length)
    starts = first.unique().tolist()
    parts = []
    with_cache = takes_cache(model)
    for start in starts:
        idx = (first == start).nonzero().squeeze(1)
        part = batch if len(starts) == 1 else resume.permuted(batch, idx)
        ready = resume.prepare(part, layers_path, len(layers), after, force=force or start > 0)
        if ready is None:
            if len(starts) == 1:
                return None
            parts.append((idx, forward(part, None)))
            continue
        found = resume.layer_inputs(values, model, layers, ready.distinct, with_cache)
        saved, keys, vals = split_states(found, len(layers))
        run = ready.batch
        cache = leading_cache(model, ready.distinct, start, keys, vals)
        if cache is not None:
            name = cast(str, cache_argument(model))
            index = ready.expand.to(saved[0].device)
            per_layer = select_rows_by_layer(cache, [index[:n] for n in ready.counts])
            run = windowed(run, start, name, per_layer)
            saved = [state[:, start:] for state in saved]
        with resume.resuming(layers, ready.counts, saved, ready.expand):
            parts.append((idx, ready.restore(forward(run, ready))))
    if len(parts) == 1:
        return parts[0][1]
    result = parts[0][1].new_empty((n_rows, *parts[0][1].shape[1:]))
    for idx, out in parts:
        result[idx.to(result.device)] = out
    return result
