"""Rows run from their first changed layer: below it, the running model's own states, once.

A row whose first grafted (or patched) module lies in decoder layer ``k`` computes, below
layer ``k``, exactly what the running model's plain forward computes on its prompt: a sweep
of one-layer cells recomputes those layers for every cell. Here a batch's rows are sorted by
their first changed layer (:func:`first_changed_layers`); one plain forward of the running
model over the batch's distinct prompts saves every layer's input
(:func:`plain_layer_inputs`); then one forward runs the rows with a growing batch
(:func:`resuming`): layer ``j`` runs on the rows that start at or below it, the rows that
start at ``j`` joining with their saved input. The embeddings run on every row (a lookup);
the final norm and the head on every row at the last position. A row that changes nothing
in the layers (a reference, a head graft) joins after the last layer. Rows whose first
changed column is past the first also skip the columns before it
(:mod:`graft.core.execution.windows`).

The layers' numbers are the same computations on fewer rows: equal to rounding (a matrix
product's last bits may depend on its number of rows), tested on every family against the
whole-forward path. Memory: the saved inputs, ``(layers + 1) x positions x hidden``
floats per prompt (:func:`saved_bytes`), kept across batches up to
:data:`graft.core.execution.prompt_values.KEEP_BYTES` (or one batch's, if more), beside the
batch's own activations, which only shrink.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from graft.core.execution.prompt_values import PromptValues
from graft.core.planning.kv_cache import cache_argument, new_cache

#: Resume only when the rows' own layers plus the distinct prompts' plain forward cost at
#: most this share of every row running every layer (else the plain path is as cheap).
MAX_WORK_SHARE = 0.9


def layer_index(path: str, layers_path: str, n_layers: int, after: Sequence[str]) -> int:
    """The decoder layer ``path`` (a module path) lies in: 0 for a module before the layers
    (an embedding), ``n_layers`` for one of ``after`` (the final norm, the head)."""
    prefix = layers_path + "."
    if path.startswith(prefix):
        return int(path[len(prefix) :].split(".", 1)[0])
    return n_layers if path in after else 0


def first_changed_layers(
    patches: Sequence[Any], n_rows: int, layers_path: str, n_layers: int, after: Sequence[str]
) -> torch.Tensor:
    """[rows] each row's first layer that any of ``patches`` (with ``path`` and a bool
    ``rows`` [rows, positions] mask) changes; ``n_layers`` for a row changed by none or only
    after the layers."""
    start = torch.full((n_rows,), n_layers, dtype=torch.long)
    for p in patches:
        layer = layer_index(p.path, layers_path, n_layers, after)
        touched = p.rows.any(dim=1).cpu()
        start[touched] = start[touched].clamp(max=layer)
    return start


def distinct_rows(inputs: Mapping[str, Any]) -> tuple[dict[str, Any], torch.Tensor]:
    """``inputs`` with each distinct padded row once, and each row's index among them (a
    sweep's batch holds many cells of one prompt)."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    key = torch.cat([ids, mask, inputs.get("position_ids", mask)], dim=1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    first = torch.full((unique.shape[0],), key.shape[0], dtype=torch.long, device=key.device)
    rows = torch.arange(key.shape[0], device=key.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    batch = ids.shape[0]
    picked = {
        k: v[first] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch else v
        for k, v in inputs.items()
    }
    return picked, inverse


def _stream(value: Any) -> torch.Tensor:
    """A layer's hidden state (a layer may return a tuple whose first item it is)."""
    return value[0] if isinstance(value, tuple) else value


def _hidden_arg(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def layer_inputs(
    values: PromptValues,
    model: nn.Module,
    layers: Sequence[nn.Module],
    distinct: dict[str, Any],
    keys_values: bool = False,
) -> list[torch.Tensor]:
    """:func:`plain_layer_inputs` of ``distinct``'s prompts, each prompt's computed once while
    ``values`` keeps it (``keys_values``: its layers' keys and values too)."""
    n = len(layers)
    tags: list[Hashable] = [("layer input", id(model), j) for j in range(n + 1)]
    if keys_values:
        tags += [(kind, id(model), j) for kind in ("layer keys", "layer values") for j in range(n)]

    def compute(part: dict[str, Any], asked: list[Hashable]) -> list[torch.Tensor]:
        found = plain_layer_inputs(model, layers, part, keys_values)
        return [found[tags.index(t)] for t in asked]

    return values.get(tags, distinct, compute)


def plain_layer_inputs(
    model: nn.Module,
    layers: Sequence[nn.Module],
    inputs: Mapping[str, Any],
    keys_values: bool = False,
) -> list[torch.Tensor]:
    """One plain forward of ``model`` on ``inputs``: each decoder layer's input hidden
    state, then the last layer's output (``len(layers) + 1`` tensors [rows, positions,
    hidden]); ``keys_values`` (a model that takes a key/value cache): then each layer's keys,
    then each layer's values ([rows, heads, positions, dim], from the forward's cache)."""
    saved: list[torch.Tensor] = []

    def before(module: nn.Module, args: tuple, kwargs: dict) -> None:
        saved.append(_hidden_arg(args, kwargs))

    def after(module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        saved.append(_stream(out))

    run: dict[str, Any] = {"use_cache": False, **inputs}
    cache = None
    if keys_values:
        cache = new_cache(model)
        run.update({cast(str, cache_argument(model)): cache, "use_cache": True})
    handles = [layer.register_forward_pre_hook(before, with_kwargs=True) for layer in layers]
    handles.append(layers[-1].register_forward_hook(after, with_kwargs=True))
    try:
        with torch.no_grad():
            model(**run)
    finally:
        for handle in handles:
            handle.remove()
    if cache is not None:  # plain key/value layers (asked only where they gather per layer)
        kept: list[Any] = list(cache.layers)
        saved += [layer.keys for layer in kept] + [layer.values for layer in kept]
    return saved


def saved_bytes(
    n_layers: int, n_prompts: int, positions: int, hidden: int, itemsize: int, kv_width: int = 0
) -> int:
    """Bytes :func:`plain_layer_inputs` holds for ``n_prompts`` distinct padded prompts
    (``kv_width``: the width of one position's keys, and of its values, all heads, where a
    layer's keys and values are kept too)."""
    per_position = (n_layers + 1) * hidden + n_layers * 2 * kv_width
    return per_position * n_prompts * positions * itemsize


def worth_resuming(start: torch.Tensor, n_distinct: int, n_layers: int) -> bool:
    """Whether rows starting at layers ``start`` save work over each running every layer
    (:data:`MAX_WORK_SHARE`), counting the distinct prompts' plain forward."""
    own = int((n_layers - start.clamp(max=n_layers)).sum())
    return own + n_distinct * n_layers <= MAX_WORK_SHARE * n_layers * start.shape[0]


def _rows_cut(value: Any, n_rows: int, n: int) -> Any:
    """``value`` with every tensor of ``n_rows`` rows (first dimension, two or more
    dimensions) cut to its first ``n``; tuples, lists and dicts item by item."""
    if isinstance(value, torch.Tensor):
        return value[:n] if value.dim() > 1 and value.shape[0] == n_rows else value
    if isinstance(value, tuple | list):
        return type(value)(_rows_cut(v, n_rows, n) for v in value)
    if isinstance(value, dict):
        return {k: _rows_cut(v, n_rows, n) for k, v in value.items()}
    return value


@contextlib.contextmanager
def resuming(
    layers: Sequence[nn.Module],
    counts: Sequence[int],
    saved: Sequence[torch.Tensor],
    expand: torch.Tensor,
) -> Iterator[None]:
    """Within the block, a forward of the model whose batch rows are sorted by their first
    changed layer runs layer ``j`` on its first ``counts[j]`` rows only: those already
    running, then those starting at ``j`` with their saved input ``saved[j][expand[row]]``
    (``saved``: :func:`plain_layer_inputs` of the distinct prompts, ``expand``: each row's
    distinct prompt). After the last layer the rows that start past it join with
    ``saved[-1]``. Every batch-sized argument of a layer is cut to its rows likewise."""
    originals: list[tuple[nn.Module, Any]] = []
    n_layers = len(layers)

    def make(j: int, inner: Callable[..., Any]) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            hidden = _hidden_arg(args, kwargs)
            n_rows = expand.shape[0]
            n = counts[j]
            if j == 0:
                x = hidden[:n]
            else:
                x = hidden
                if n > x.shape[0]:
                    join = expand[x.shape[0] : n].to(saved[j].device)
                    x = torch.cat([x, saved[j].index_select(0, join).to(x.dtype)])
            if n == 0:
                out: Any = x
            else:
                rest = _rows_cut(args[1:], n_rows, n)
                kw = _rows_cut({k: v for k, v in kwargs.items() if k != "hidden_states"}, n_rows, n)
                out = inner(x, *rest, **kw)
            if j == n_layers - 1 and n < n_rows:
                stream = _stream(out)
                join = expand[n:].to(saved[-1].device)
                tail = saved[-1].index_select(0, join).to(stream.dtype)
                stream = torch.cat([stream, tail])
                out = (stream, *out[1:]) if isinstance(out, tuple) else stream
            return out

        return forward

    try:
        for j, layer in enumerate(layers):
            originals.append((layer, layer.__dict__.get("forward")))
            layer.forward = make(j, layer.forward)
        yield
    finally:
        for layer, before in originals:
            if before is None:
                del layer.__dict__["forward"]
            else:
                layer.__dict__["forward"] = before


def permuted(batch: types.SimpleNamespace, order: torch.Tensor) -> types.SimpleNamespace:
    """``batch`` (:func:`graft.core.execution.trace.trace_batch`) with its rows in ``order``:
    inputs, every patch's masks (a fused site's slice masks follow its cells), picks and
    targets."""
    n_rows = batch.inputs["input_ids"].shape[0]

    def take(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == n_rows:
            return t.index_select(0, order.to(t.device))
        return t

    def slice_taken(rows: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
        # a slice mask is over the patch's marked cells in row-major order: lay it out on
        # the cells, reorder the rows, read it back
        cells = torch.zeros(rows.shape, dtype=torch.bool, device=rows.device)
        cells[rows] = sel.to(rows.device)
        return take(cells)[take(rows)].to(sel.device)

    patches = [
        types.SimpleNamespace(
            **{
                **vars(p),
                "rows": take(p.rows),
                "slices": [(k, slice_taken(p.rows, m)) for k, m in p.slices],
                "cells": None,
            }
        )
        for p in batch.patches
    ]
    return types.SimpleNamespace(
        **{
            **vars(batch),
            "inputs": {k: take(v) for k, v in batch.inputs.items()},
            "patches": patches,
            "pick": take(batch.pick),
            "targets": take(batch.targets),
        }
    )


def cut_patches(
    patches: Sequence[types.SimpleNamespace],
    counts: Sequence[int],
    layers_path: str,
    after: Sequence[str],
) -> list[types.SimpleNamespace]:
    """``patches`` of a sorted batch with the masks of a module in layer ``j`` cut to the
    ``counts[j]`` rows that layer runs (no row it changes is cut: a row's first changed
    layer is at most ``j``)."""
    n_layers = len(counts)
    out = []
    for p in patches:
        layer = layer_index(p.path, layers_path, n_layers, after)
        if not p.path.startswith(layers_path + "."):
            out.append(p)
            continue
        n = counts[layer]
        out.append(
            types.SimpleNamespace(
                **{
                    **vars(p),
                    "rows": p.rows[:n],  # the cells, and so the slice masks, are kept
                    "cells": None,
                }
            )
        )
    return out


class Resumed:
    """A batch prepared to run from each row's first changed layer.

    Args:
        batch: the batch with its rows sorted by first changed layer, its layer patches' masks
            cut to the rows their layer runs.
        order: [rows] the original row of each sorted row.
        counts: the rows each decoder layer runs.
        expand: [rows] each sorted row's distinct prompt.
        distinct: the distinct prompts' inputs.
    """

    def __init__(
        self,
        batch: types.SimpleNamespace,
        order: torch.Tensor,
        counts: list[int],
        expand: torch.Tensor,
        distinct: dict[str, Any],
    ) -> None:
        self.batch = batch
        self.order = order
        self.counts = counts
        self.expand = expand
        self.distinct = distinct

    def restore(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` [rows, ...] of the sorted rows, back in the original row order."""
        back = torch.empty_like(out)
        back[self.order.to(out.device)] = out
        return back


def prepare(
    batch: types.SimpleNamespace,
    layers_path: str,
    n_layers: int,
    after: Sequence[str],
    force: bool = False,
) -> Resumed | None:
    """``batch`` sorted and cut to run from its rows' first changed layers, or None where
    that does not pay (:func:`worth_resuming`) or nothing is patched; ``force``: always
    (a batch whose rows all start at layer 0 then runs every layer on every row)."""
    n_rows = batch.inputs["input_ids"].shape[0]
    start = first_changed_layers(batch.patches, n_rows, layers_path, n_layers, after)
    if int(start.min()) >= n_layers and not batch.patches:
        return None
    distinct, inverse = distinct_rows(batch.inputs)
    n_distinct = int(distinct["input_ids"].shape[0])
    if not force and (int(start.max()) == 0 or not worth_resuming(start, n_distinct, n_layers)):
        return None
    order = torch.sort(start, stable=True).indices
    counts = [int((start <= j).sum()) for j in range(n_layers)]
    sorted_batch = permuted(batch, order)
    sorted_batch.inputs["use_cache"] = False  # one pass: no cache, whose rows would differ by layer
    sorted_batch.patches = cut_patches(sorted_batch.patches, counts, layers_path, after)
    expand = inverse.cpu().index_select(0, order)
    return Resumed(sorted_batch, order, counts, expand, distinct)
