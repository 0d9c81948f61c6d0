"""The key/value cache of shared prefixes (graft.core.planning.kv_cache): a step's rows read
their prompts' keys and values, gathered when the step reaches each layer."""

from __future__ import annotations

import copy

import torch
from transformers import DynamicCache

from graft.core.planning.kv_cache import select_rows, select_rows_by_layer


def _filled_cache(prompts=3, heads=2, length=5, dim=4, layers=3) -> DynamicCache:
    cache = DynamicCache()
    for i in range(layers):
        cache.update(
            torch.randn(prompts, heads, length, dim), torch.randn(prompts, heads, length, dim), i
        )
    return cache


def test_a_selected_cache_gathers_each_layer_when_the_step_reaches_it():
    cache = _filled_cache()
    index = torch.tensor([2, 0, 0, 1, 2])
    expected = copy.deepcopy(cache)
    expected.batch_select_indices(index)
    selected = select_rows(cache, index)
    # nothing is copied up front: the layers still hold the prompts' tensors
    assert all(s.keys is c.keys for s, c in zip(selected.layers, cache.layers, strict=True))
    for i in range(len(cache.layers)):
        new_k, new_v = torch.randn(5, 2, 1, 4), torch.randn(5, 2, 1, 4)
        keys, values = selected.update(new_k, new_v, i)
        want_k, want_v = expected.update(new_k, new_v, i)
        assert torch.equal(keys, want_k) and torch.equal(values, want_v)
        # it stores nothing: the prompts' cache and the selected one keep their length
        assert selected.layers[i].keys.shape[-2] == cache.layers[i].keys.shape[-2] == 5
    assert selected.get_seq_length() == cache.get_seq_length() == 5


def test_each_layer_of_a_cache_may_take_its_own_rows():
    cache = _filled_cache()
    indices = [torch.tensor([2, 0, 1]), torch.tensor([2, 0]), torch.tensor([1])]
    selected = select_rows_by_layer(cache, indices)
    for i, index in enumerate(indices):
        new_k, new_v = torch.randn(len(index), 2, 1, 4), torch.randn(len(index), 2, 1, 4)
        keys, values = selected.update(new_k, new_v, i)
        assert torch.equal(keys[:, :, :5], cache.layers[i].keys[index])
        assert torch.equal(values[:, :, 5:], new_v)
        assert cache.layers[i].keys.shape[0] == 3  # the prompts' cache is left as it is
