"""A step's rows identical up to their first grafted layer run those layers once
(graft.core.execution.depth_share): the numbers against the token-by-token reference on every
family, and the sharing itself."""

from __future__ import annotations

import pytest
import torch

import graft.core.execution.executor as executor
from graft.core.execution.depth_share import _expanded, first_grafted_layer, shared_depth
from graft.core.execution.engine import LocalExecutor, run_grafts
from graft.core.families.arch import architecture_of
from graft.models.tiny import TINY_FAMILIES, perturbed_copy, tiny_model
from tests.core.execution.test_engine_paths import TOL, prompt_rows, reference
from tests.fast_tier import slow_except

pytestmark = pytest.mark.usefixtures("one_thread")

#: E3-like: component sets at the last token in the upper layers, one row per set and prompt
#: a Llama-family model's final norm and head paths
AFTER = ("model.norm", "lm_head")
SPECS = ["LT:h2:o", "LT:h2:ffn", "LT:h2:o,ffn", "LT:q4:attn", "LT:h2:q", "none"]


@pytest.mark.parametrize("family", slow_except(TINY_FAMILIES, "llama"))
def test_shared_first_layers_match_the_reference(family, monkeypatch):
    base = tiny_model(family, seed=0)
    donors = {"sft": perturbed_copy(base, seed=1)}
    rows = prompt_rows(SPECS, lengths=(6, 9, 11, 5))
    shares = []
    original = executor.shared_depth

    def spying(*args):
        share = original(*args)
        shares.append(share)
        return share

    monkeypatch.setattr(executor, "shared_depth", spying)
    out = run_grafts(base, donors, rows, batch_size=8)
    assert any(s is not None for s in shares), f"{family}: no step shared its first layers"
    shared = [s for s in shares if s is not None]
    n_layers = base.config.num_hidden_layers
    assert all(0 < s.layer < n_layers and len(s.distinct) < len(s.expand) for s in shared)
    expected = reference(base, donors, architecture_of(base), rows)
    assert (out - expected).abs().max() <= TOL
    unshared = run_grafts(
        base, donors, rows, batch_size=8, executor=LocalExecutor(share_depth=False)
    )
    assert (out - unshared).abs().max() <= TOL


def test_the_first_grafted_layer():
    layers = "model.layers"
    assert (
        first_grafted_layer(
            ["model.layers.3.mlp.up_proj", "model.layers.5.self_attn.o_proj"], layers, 8, AFTER
        )
        == 3
    )
    assert first_grafted_layer(["model.embed_tokens", "model.layers.5.mlp"], layers, 8, AFTER) == 0
    assert first_grafted_layer(["model.norm", "lm_head"], layers, 8, AFTER) == 8
    assert (
        first_grafted_layer(
            ["transformer.ln_f", "transformer.h.2.attn.c_proj"],
            "transformer.h",
            4,
            ("transformer.ln_f", "lm_head"),
        )
        == 2
    )


def test_what_shares_and_what_does_not():
    paths = ["model.layers.6.self_attn.o_proj"]
    key = torch.tensor([[0, 7, 5], [1, 9, 4], [0, 7, 5], [1, 9, 4], [0, 7, 5], [1, 9, 4]])
    share = shared_depth(key, paths, "model.layers", 8, AFTER)
    assert share is not None and share.layer == 6
    assert share.distinct.tolist() == [0, 1] and share.expand.tolist() == [0, 1, 0, 1, 0, 1]
    assert torch.equal(key[share.distinct][share.expand], key)
    assert shared_depth(key, ["model.embed_tokens"], "model.layers", 8, AFTER) is None  # layer 0
    assert shared_depth(key, ["lm_head"], "model.layers", 8, AFTER) is None  # past the layers
    assert shared_depth(key[:3], paths, "model.layers", 8, AFTER) is None  # 2 distinct of 3 rows
    assert shared_depth(key[[0, 2]], paths, "model.layers", 8, AFTER) is None  # one distinct row


def test_batch_sized_arguments_are_expanded_and_nothing_else():
    expand = torch.tensor([0, 1, 0, 1])
    hidden, cos = torch.arange(2.0)[:, None], torch.arange(4.0).view(2, 2)
    position = torch.tensor([11])
    out = _expanded((hidden, (cos, cos), position, None, 3), 2, expand)
    assert out[0][:, 0].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert out[1][0].shape == (4, 2) and out[1][1].shape == (4, 2)
    assert out[2] is position and out[3] is None and out[4] == 3
