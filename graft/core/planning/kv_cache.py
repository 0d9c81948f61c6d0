"""The key/value cache of shared prefixes (:mod:`graft.core.planning.prefix`): the name a
model's forward takes it under, an empty one, one filled over a prefix plan, several joined
along the batch, and a cache selected per row for a step: plain key/value layers gathered
lazily, layer by layer, when the step reaches them (so a step holds one layer's rows at a
time), each layer from its own prompts where a step runs its layers on different rows."""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from graft.core.families.arch import model_config
from graft.core.planning.plan import BatchPlan

if TYPE_CHECKING:
    from transformers import Cache


#: The names transformers has given the key/value cache argument of a causal LM's forward,
#: newest first: ``cache`` from 5.24 on (``past_key_values`` then stays a deprecated alias),
#: ``past_key_values`` before.
CACHE_ARGUMENTS = ("cache", "past_key_values")


def cache_argument(model: nn.Module) -> str | None:
    """The name under which ``model``'s forward (and its decoder's, which a prefix runs) takes
    a key/value cache (:data:`CACHE_ARGUMENTS`), or ``None`` where it takes none."""
    decoder: nn.Module = getattr(model, "base_model", model)
    # mypy does not see class objects as Hashable (python/mypy#11470)
    return _cache_argument_of(type(model), type(decoder))  # type: ignore[arg-type]


@functools.cache
def _cache_argument_of(model_class: type[nn.Module], decoder_class: type[nn.Module]) -> str | None:
    for name in CACHE_ARGUMENTS:
        if all(
            name in inspect.signature(c.forward).parameters for c in (model_class, decoder_class)
        ):
            return name
    return None


def accepts_cache(model: nn.Module) -> bool:
    """Whether ``model``'s forward takes a key/value cache (:func:`cache_argument`)."""
    return cache_argument(model) is not None


def concat_caches(caches: Sequence[Cache]) -> Cache | None:
    """One cache holding ``caches`` (of equal widths: slices of one padded prefix plan) one
    after the other along the batch, emptying them; None (``caches`` untouched) where a
    layer keeps more than keys and values."""
    if len(caches) == 1:
        return caches[0]
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    plain_kinds = (DynamicLayer, DynamicSlidingWindowLayer)
    if any(type(layer) not in plain_kinds for c in caches for layer in c.layers):
        return None
    joined = copy.copy(caches[0])
    joined.layers = []
    for layers in zip(*(c.layers for c in caches), strict=True):
        layer = copy.copy(layers[0])
        layer.keys = torch.cat([x.keys for x in layers])
        layer.values = torch.cat([x.values for x in layers])
        for x in layers:  # the parts are spent: free them as the joined cache fills
            x.keys = x.values = None
        joined.layers.append(layer)
    return joined


def new_cache(model: nn.Module) -> Cache:
    """An empty key/value cache for ``model`` (sliding-window layers as its config says)."""
    from transformers import DynamicCache

    return DynamicCache(config=model_config(model))


def prefix_cache(model: nn.Module, prefix: BatchPlan, device: torch.device) -> Cache:
    """The key/value cache of ``model`` (a causal LM) over the prefixes, run without its
    head (only the cache is kept)."""
    name = cache_argument(model)
    assert name is not None  # prefixes run only on models that take a cache (accepts_cache)
    decoder = cast(nn.Module, model.base_model)  # torch types it as Tensor | Module
    cache = new_cache(model)
    with torch.no_grad():
        decoder(
            input_ids=prefix.input_ids.to(device),
            attention_mask=prefix.attention_mask.to(device),
            position_ids=prefix.position_ids.to(device),
            use_cache=True,
            **{name: cache},
        )
    return cache


def gathers_per_layer(cache) -> bool:
    """Whether :func:`select_rows` gathers ``cache``'s rows layer by layer (plain key/value
    layers), so that layers may take different rows (its ``below``)."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    lazy = (DynamicLayer, DynamicSlidingWindowLayer)
    return all(
        type(layer) in lazy and not getattr(layer, "record_past", False) for layer in cache.layers
    )


def select_rows(cache, index: torch.Tensor, below: tuple[int, torch.Tensor] | None = None):
    """A cache holding ``cache``'s entries for the prompts ``index`` (one per row); ``cache``
    itself is left as it is, so every step of a group starts from the same prefixes.
    ``below``: ``(layer, other_index)``: the layers below ``layer`` take the prompts
    ``other_index`` instead (a step that runs them on fewer rows,
    :mod:`graft.core.execution.depth_share`; needs :func:`gathers_per_layer`).

    Plain key/value layers are not copied to the rows up front: each layer gathers its
    prompts' keys and values to the rows when the step reaches it and appends the new token,
    storing nothing (a step is the last forward on its cache), so a step holds one layer's
    rows at a time instead of all of them. Other layer kinds are selected as transformers
    does."""
    selected = copy.copy(cache)
    selected.layers = [copy.copy(layer) for layer in cache.layers]
    if not gathers_per_layer(cache):
        if below is not None:
            raise ValueError("these cache layers cannot take different rows")  # programming error
        selected.batch_select_indices(index)
        return selected
    for i, layer in enumerate(selected.layers):
        if layer.get_seq_length() > 0:
            rows = below[1] if below is not None and i < below[0] else index
            layer.update = _gathering_update(layer.keys, layer.values, rows)
    return selected


def select_rows_by_layer(cache, indices: Sequence[torch.Tensor]):
    """:func:`select_rows` with each layer's own prompts: layer ``i`` takes ``indices[i]``
    (a step whose layers run on different rows, :mod:`graft.core.execution.resume`; needs
    :func:`gathers_per_layer`)."""
    if not gathers_per_layer(cache):
        raise ValueError("these cache layers cannot take different rows")  # programming error
    selected = copy.copy(cache)
    selected.layers = [copy.copy(layer) for layer in cache.layers]
    for layer, index in zip(selected.layers, indices, strict=True):
        if layer.get_seq_length() > 0:
            layer.update = _gathering_update(layer.keys, layer.values, index)
    return selected


def _gathering_update(
    keys: torch.Tensor, values: torch.Tensor, index: torch.Tensor
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A layer's ``update`` for a step: ``keys``/``values`` [prompts, heads, length, dim]
    gathered to the rows ``index``, the step's own appended along the length; stores nothing."""

    def update(
        key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.cat([keys.index_select(0, index), key_states], dim=-2),
            torch.cat([values.index_select(0, index), value_states], dim=-2),
        )

    return update
