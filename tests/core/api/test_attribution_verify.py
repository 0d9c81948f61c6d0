"""``graft.core.verify_attribution``: single cells grafted for real beside their estimates;
``graft.core.verify_multicell``: multi-cell grafts (a whole layer, FE / LT / FE+LT in every
layer) for real against the sum of their cells' estimates, on a tiny llama in float64: the
real effects are ``graft_texts``' own, the estimates the sums of ``graft.attribute``'s cells,
and the first-order error grows with the donor's distance from the base."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

import graft
from graft.core import verify_attribution, verify_multicell
from graft.models.tiny import perturbed_copy, tiny_model

TEXTS = ["the cat sat on the mat and", "hello world, says the"]
FIELDS = [{"FE": "cat"}, {"FE": "world"}]
TARGET = " a"


@pytest.fixture(scope="module")
def pair():
    base = tiny_model("llama").double()
    return base, graft.tiny_tokenizer()


def _relative_error(table: pl.DataFrame) -> float:
    return float(np.median(np.abs(table["error"].to_numpy()) / np.abs(table["real"].to_numpy())))


def test_sets_real_effects_and_estimates(pair):
    base, tok = pair
    donor = perturbed_copy(base, seed=100, scale=0.02)
    table = verify_multicell(base, donor, tok, TEXTS, TARGET, fields=FIELDS)
    n_layers = base.config.num_hidden_layers
    one = table.filter(pl.col("prompt") == 1)
    assert one["set"].to_list() == ["layer"] * n_layers + ["FE", "LT", "FE+LT"]
    assert one["spec"].to_list()[-1] == "FE+LT:all:attn,mlp"
    # real: the graft itself, run apart
    target = tok(TARGET, add_special_tokens=False)["input_ids"][0]
    logits = graft.graft_texts(base, donor, tok, TEXTS[1], ["none", *one["spec"]], fields=FIELDS[1])
    logprob = logits.double().log_softmax(-1)[:, target]
    assert np.allclose(one["real"].to_numpy(), (logprob[1:] - logprob[0]).numpy(), atol=1e-10)
    # estimate: the sum of the single cells' estimates
    cells = graft.attribute(
        base, donor, tok, TEXTS[1], TARGET, fields=FIELDS[1], kinds=["attn", "mlp"]
    )
    fe_lt = one.filter(pl.col("set") == "FE+LT")
    assert fe_lt["estimate"][0] == pytest.approx(float(cells["estimate"].sum()), abs=1e-12)
    assert fe_lt["cells"][0] == len(cells)
    whole = graft.attribute(
        base, donor, tok, TEXTS[1], TARGET, units=["ALL"], kinds=["attn", "mlp"], layers=[2]
    )
    layer2 = one.filter((pl.col("set") == "layer") & (pl.col("layer") == 2))
    assert layer2["estimate"][0] == pytest.approx(float(whole["estimate"].sum()), abs=1e-12)
    assert np.allclose(table["error"], table["estimate"] - table["real"])
    # a small donor change: first order holds within a few percent
    assert _relative_error(table) < 0.1


def test_the_error_grows_with_the_change(pair):
    base, tok = pair
    near = verify_multicell(
        base, perturbed_copy(base, seed=100, scale=0.02), tok, TEXTS, TARGET, fields=FIELDS
    )
    far = verify_multicell(
        base, perturbed_copy(base, seed=100, scale=0.3), tok, TEXTS, TARGET, fields=FIELDS
    )
    assert _relative_error(far) > 2 * _relative_error(near)


def test_a_prompt_without_fe_has_only_layers_and_lt(pair):
    base, tok = pair
    donor = perturbed_copy(base, seed=100, scale=0.02)
    table = verify_multicell(base, donor, tok, TEXTS[0], TARGET, layers=[0])
    assert table["set"].to_list() == ["layer", "LT"]


def test_single_cells_real_effects_beside_their_estimates(pair):
    base, tok = pair
    donor = perturbed_copy(base, seed=100, scale=0.02)
    table = graft.attribute(base, donor, tok, TEXTS, TARGET, fields=FIELDS, layers=[0, 2])
    top = verify_attribution(base, donor, tok, TEXTS, TARGET, table, top_k=3, fields=FIELDS)
    # each prompt's three cells of largest |estimate|, the estimates as attribute gave them
    assert top["prompt"].to_list() == [0, 0, 0, 1, 1, 1]
    for prompt, cells in top.group_by("prompt"):
        largest = table.filter(pl.col("prompt") == prompt[0])["estimate"].abs().top_k(3)
        assert sorted(cells["estimate"].abs()) == pytest.approx(sorted(largest))
    # real: each cell grafted alone, run apart
    target = tok(TARGET, add_special_tokens=False)["input_ids"][0]
    for prompt, (text, fields) in enumerate(zip(TEXTS, FIELDS, strict=True)):
        cells = top.filter(pl.col("prompt") == prompt)
        specs = [f"{u}:{ly}:{k}" for u, ly, k in cells.select("unit", "layer", "kind").iter_rows()]
        logits = graft.graft_texts(base, donor, tok, text, ["none", *specs], fields=fields)
        logprob = logits.double().log_softmax(-1)[:, target]
        assert np.allclose(cells["real"], (logprob[1:] - logprob[0]).numpy(), atol=1e-10)
    every = verify_attribution(base, donor, tok, TEXTS, TARGET, table, top_k=None, fields=FIELDS)
    assert len(every) == len(table)
