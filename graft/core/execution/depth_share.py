"""A step's rows that are identical up to their first grafted layer run those layers once.

A one-token step on shared prefixes (:mod:`graft.core.planning.prefix`) holds, for each prompt, one
row per graft; E3's component sets graft the last quarter of the layers only, so below it the
rows of a prompt compute the very same thing (the same token, position, mask and cached
prefix). :func:`shared_depth` finds such a step's distinct rows and the first grafted layer;
the executor then runs the layers below it on the distinct rows only and expands the hidden
state, and every batch-sized argument of the layers from there on, to all rows
(:func:`expanding_from`). The layers' numbers are the same computations on fewer rows: equal
to rounding (a matrix product's last bits may depend on its number of rows), tested against
the token-by-token reference on every family.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

#: share only when the distinct rows are at most this share of the step's rows
MAX_SHARE = 0.5


@dataclass
class SharedDepth:
    """How a step's rows share their first layers.

    Args:
        layer: the first grafted layer (the layers below it run on the distinct rows).
        distinct: [distinct rows] each distinct row's first row in the step.
        expand: [rows] each row's distinct row (``rows = distinct[expand]``).
    """

    layer: int
    distinct: torch.Tensor
    expand: torch.Tensor


def first_grafted_layer(
    paths: Sequence[str], layers_path: str, n_layers: int, after: Sequence[str]
) -> int:
    """The first decoder layer any of ``paths`` (grafted module paths) lies in: 0 for a module
    before the layers (an embedding), ``n_layers`` where only modules of ``after`` (the
    family's final norm and head paths) are grafted."""
    prefix = layers_path + "."
    first = n_layers
    for path in paths:
        if path.startswith(prefix):
            first = min(first, int(path[len(prefix) :].split(".", 1)[0]))
        elif path not in after:
            return 0
    return first


def shared_depth(
    step_key: torch.Tensor,
    paths: Sequence[str],
    layers_path: str,
    n_layers: int,
    after: Sequence[str],
) -> SharedDepth | None:
    """The sharing of a step whose rows are keyed by ``step_key`` [rows, k] (rows with equal
    keys compute the same thing until a graft) and that grafts ``paths`` (``after``: as for
    :func:`first_grafted_layer`); None where it
    does not pay (the first layer grafted, or too few repeated rows)."""
    layer = first_grafted_layer(paths, layers_path, n_layers, after)
    if not 0 < layer < n_layers or step_key.shape[0] < 2:
        return None  # (past the last layer: nothing of the layer stack expands the rows)
    keys, expand = torch.unique(step_key, dim=0, return_inverse=True)
    n_distinct, n_rows = keys.shape[0], step_key.shape[0]
    if n_distinct < 2 or n_distinct > MAX_SHARE * n_rows:
        return None  # (one distinct row: a batch dimension of 1 cannot be told apart)
    rows = torch.arange(n_rows)
    distinct = torch.full((n_distinct,), n_rows, dtype=torch.long)
    distinct = distinct.scatter_reduce(0, expand, rows, reduce="amin")
    return SharedDepth(layer, distinct, expand)


def _expanded(value: Any, n_distinct: int, expand: torch.Tensor) -> Any:
    """``value`` with every tensor of ``n_distinct`` rows (first dimension) taken to the rows
    ``expand``; tuples and lists item by item, anything else as it is."""
    if isinstance(value, torch.Tensor):
        if value.dim() > 0 and value.shape[0] == n_distinct:
            return value.index_select(0, expand.to(value.device))
        return value
    if isinstance(value, tuple | list):
        return type(value)(_expanded(v, n_distinct, expand) for v in value)
    return value


@contextlib.contextmanager
def expanding_from(layers: Sequence[nn.Module], share: SharedDepth) -> Iterator[None]:
    """Within the block, ``layers[share.layer:]`` take their hidden state and every
    batch-sized argument from the distinct rows to all rows (a forward pre-hook each)."""
    n_distinct = share.distinct.shape[0]

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return (
            _expanded(args, n_distinct, share.expand),
            {k: _expanded(v, n_distinct, share.expand) for k, v in kwargs.items()},
        )

    handles = [
        layer.register_forward_pre_hook(hook, with_kwargs=True) for layer in layers[share.layer :]
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
