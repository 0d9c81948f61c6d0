"""``graft.attribute``'s ``local`` estimator (:mod:`graft.core.api.attribution_local`) on the
tiny model of every family, float64: the attention block's change it takes is the real
graft's (the block's output under ``graft_texts``), ``v`` and ``o`` alone are the ``linear``
estimator's, and at the last layer's LT, where only norms and the head follow, it is within
3% of the real effect and closer to it than ``linear``; a bad estimator name is one line."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

import graft
from graft.core.api.attribution import _leaves
from graft.core.api.attribution_local import AttentionCapture, attention_path, block_changes
from graft.core.api.texts import _rows, _spec_list
from graft.core.families.arch import architecture_of
from graft.errors import SpecError
from graft.models.registry import TINY_FAMILIES
from graft.models.tiny import perturbed_copy, tiny_model

TEXT, FIELDS, TARGET = "the cat sat on the mat and", {"FE": "cat"}, " a"
ATTENTION = ["q", "k", "v", "qkv", "o", "attn"]


def _pair(family: str, scale: float):
    base = tiny_model(family).double()
    return base, perturbed_copy(base, seed=100, scale=scale)


def _real(base, donor, tok, specs: list[str], fields=None) -> np.ndarray:
    target = tok(TARGET, add_special_tokens=False)["input_ids"][0]
    logits = graft.graft_texts(base, donor, tok, TEXT, ["none", *specs], fields=fields)
    scores = logits.double().log_softmax(-1)[:, target]
    return (scores[1:] - scores[0]).numpy()


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_the_block_change_is_the_real_grafts(family):
    """Every attention kind at FE of layer 1, a large donor change: the block's output change
    the estimator takes equals the block's output change in the real graft."""
    tok = graft.tiny_tokenizer()
    base, donor = _pair(family, 0.3)
    arch = architecture_of(base)
    real: list[torch.Tensor] = []

    def keep(module, args, out):
        real.append((out[0] if isinstance(out, tuple) else out).detach())

    handle = base.get_submodule(attention_path(arch, 1)).register_forward_hook(keep)
    specs = [f"FE:1:{kind}" for kind in ATTENTION]
    graft.graft_texts(base, donor, tok, TEXT, ["none", *specs], fields=FIELDS)
    handle.remove()
    row = _rows(tok, [TEXT], _spec_list("none"), [FIELDS])[0]
    ids = torch.tensor([row.input_ids])
    positions = torch.zeros(ids.shape, dtype=torch.bool)
    positions[0, list(row.spans["FE"])] = True
    capture = AttentionCapture(base, arch, [1])
    base(input_ids=ids, use_cache=False)
    capture.remove()
    cells = [(positions, _leaves(arch, kind)) for kind in ATTENTION]
    change = block_changes(capture, base, donor, arch, 1, cells)[:, 0]
    (grafted,) = real
    assert (grafted[1:] - grafted[0]).abs().max() > 1e-2  # the grafts do change the block
    assert torch.allclose(change, grafted[1:] - grafted[0], atol=1e-12)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_v_and_o_alone_are_the_linear_estimate(family):
    tok = graft.tiny_tokenizer()
    base, donor = _pair(family, 0.3)
    args = (base, donor, tok, [TEXT, "hello world, says the"], TARGET)
    fields = [FIELDS, {"FE": "world"}]
    local = graft.attribute(*args, fields=fields, kinds=["v", "o", "q"])
    linear = graft.attribute(*args, fields=fields, kinds=["v", "o", "q"], estimator="linear")
    same = pl.col("kind").is_in(["v", "o"])
    assert np.allclose(
        local.filter(same)["estimate"], linear.filter(same)["estimate"], rtol=1e-9, atol=1e-14
    )
    q = pl.col("kind") == "q"
    assert not np.allclose(local.filter(q)["estimate"], linear.filter(q)["estimate"], rtol=1e-6)


def test_last_layer_lt_is_nearly_exact():
    """Downstream of the last layer's attention are only norms and the head: the local
    estimate is within 3% of the real effect, closer than the linear one, for a donor 30%
    away (llama)."""
    tok = graft.tiny_tokenizer()
    base, donor = _pair("llama", 0.3)
    last = architecture_of(base).n_layers - 1
    kinds = ["q", "k", "qkv", "attn"]
    args = (base, donor, tok, TEXT, TARGET)
    options = dict(units=["LT"], layers=[last], kinds=kinds)
    local = graft.attribute(*args, **options)["estimate"].to_numpy()
    linear = graft.attribute(*args, **options, estimator="linear")["estimate"].to_numpy()
    real = _real(base, donor, tok, [f"LT:{last}:{kind}" for kind in kinds])
    assert np.abs(real).min() > 1e-4
    local_error, linear_error = np.abs(local - real), np.abs(linear - real)
    assert (local_error <= 0.03 * np.abs(real)).all()
    assert (local_error < linear_error).all()


def test_a_bad_estimator_is_one_line():
    tok = graft.tiny_tokenizer()
    base, donor = _pair("llama", 0.02)
    with pytest.raises(SpecError, match=r"^estimator 'exact': choose one of local, linear$"):
        graft.attribute(base, donor, tok, TEXT, TARGET, estimator="exact")
