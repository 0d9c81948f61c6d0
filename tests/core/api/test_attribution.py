"""``graft.attribute`` (both estimators) against real single-cell grafts (``graft_texts``) on the tiny model of
every family (``TINY_FAMILIES``), in float64: per module kind, Pearson >= 0.95 and sign
agreement >= 0.95 over the cells that move the target; a wrong estimate (cells shuffled,
sign flipped) fails the same check."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

import graft
from graft.core import ESTIMATORS
from graft.errors import SpecError
from graft.models.registry import TINY_FAMILIES
from graft.models.tiny import perturbed_copy, tiny_model

TEXTS = ["the cat sat on the mat and", "hello world, says the", "a dog ran far, the end"]
FIELDS = [{"FE": "cat"}, {"FE": "world"}, {"FE": "dog"}]
TARGET = " a"


def _pair(family: str, scale: float = 0.02):
    base = tiny_model(family).double()
    return base, perturbed_copy(base, seed=100, scale=scale)


def _real_effects(base, donor, tok, table: pl.DataFrame) -> np.ndarray:
    """Each table row's real effect: log-prob of the target under the graft minus the base's."""
    target = tok(TARGET, add_special_tokens=False)["input_ids"][0]
    real = []
    for prompt, (text, fields) in enumerate(zip(TEXTS, FIELDS, strict=True)):
        cells = table.filter(pl.col("prompt") == prompt)
        specs = [
            "none",
            *(f"{u}:{ly}:{k}" for u, ly, k in cells.select("unit", "layer", "kind").iter_rows()),
        ]
        logprobs = graft.graft_texts(base, donor, tok, text, specs, fields=fields)
        logprobs = logprobs.double().log_softmax(-1)[:, target]
        real += (logprobs[1:] - logprobs[0]).tolist()
    return np.array(real)


def _agrees(estimate: np.ndarray, real: np.ndarray) -> tuple[float, float]:
    """(Pearson, sign agreement over the cells whose real effect is >= 5% of the largest)."""
    pearson = float(np.corrcoef(estimate, real)[0, 1])
    moving = np.abs(real) >= 0.05 * np.abs(real).max()
    return pearson, float((np.sign(estimate[moving]) == np.sign(real[moving])).mean())


def _check(table: pl.DataFrame, real: np.ndarray, wrong: str | None = None) -> list[str]:
    """The kinds whose estimates fail the bar (``wrong``: after breaking them on purpose)."""
    failed = []
    for kind in table["kind"].unique(maintain_order=True):
        chosen = (table["kind"] == kind).to_numpy()
        estimate = table["estimate"].to_numpy()[chosen]
        if wrong == "shuffled":
            estimate = np.random.default_rng(0).permutation(estimate)
        elif wrong == "flipped":
            estimate = -estimate
        pearson, sign = _agrees(estimate, real[chosen])
        if pearson < 0.95 or sign < 0.95:
            failed.append(f"{kind}: pearson {pearson:.3f} sign {sign:.2f}")
    return failed


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_estimates_match_real_single_cell_grafts(family, estimator):
    tok = graft.tiny_tokenizer()
    base, donor = _pair(family)
    table = graft.attribute(base, donor, tok, TEXTS, TARGET, fields=FIELDS, estimator=estimator)
    assert set(table["unit"]) == {"FE", "LT"}
    assert set(table["kind"]) == set(graft.core.DEFAULT_KINDS)
    real = _real_effects(base, donor, tok, table)
    assert np.abs(real).max() > 1e-4  # the grafts do move the target
    assert _check(table, real) == []


def test_a_wrong_estimate_fails_the_check():
    tok = graft.tiny_tokenizer()
    base, donor = _pair("llama")
    table = graft.attribute(base, donor, tok, TEXTS, TARGET, fields=FIELDS, kinds=["o", "mlp"])
    real = _real_effects(base, donor, tok, table)
    assert _check(table, real) == []
    assert len(_check(table, real, wrong="shuffled")) == 2
    assert len(_check(table, real, wrong="flipped")) == 2


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_batches_and_metric(family):
    """Batching (padding) changes nothing, in gemma2's float64 attention too (left padding
    made NaN there); the logit metric is its own gradient."""
    tok = graft.tiny_tokenizer()
    base, donor = _pair(family)
    args = (base, donor, tok, TEXTS, TARGET)
    kinds = ["v", "qkv", "mlp"]  # qkv: the local estimator's repeated batch, padded rows too
    one = graft.attribute(*args, fields=FIELDS, batch_size=1, kinds=kinds)
    three = graft.attribute(*args, fields=FIELDS, batch_size=3, kinds=kinds)
    assert np.allclose(one["estimate"], three["estimate"], atol=1e-10)
    logit = graft.attribute(*args, fields=FIELDS, kinds=kinds, metric="logit")
    assert not np.allclose(logit["estimate"], one["estimate"])


def test_bad_input_says_what_to_fix():
    tok = graft.tiny_tokenizer()
    base, donor = _pair("llama")
    with pytest.raises(SpecError, match="no unit 'M'"):
        graft.attribute(base, donor, tok, TEXTS[0], TARGET, fields=FIELDS[0], units=["M"])
    with pytest.raises(SpecError, match="kind 'gatez'"):
        graft.attribute(base, donor, tok, TEXTS[0], TARGET, kinds=["gatez"])
    with pytest.raises(SpecError, match="metric"):
        graft.attribute(base, donor, tok, TEXTS[0], TARGET, metric="prob")
    with pytest.raises(SpecError, match="layers"):
        graft.attribute(base, donor, tok, TEXTS[0], TARGET, layers=[9])
    assert torch.is_grad_enabled()
