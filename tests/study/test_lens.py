"""The logit lens under grafts (graft.study.lens), on the tiny model of every family.

At the last layer the lens at LT is the run's own score of its final logits (graft_texts,
example_metrics); PRE's lens is a plain nnsight logit lens of the base written here from the
model's own module names; ``none`` is PRE whatever runs beside it, and a whole donor with its
own head is that donor's run.
"""

from __future__ import annotations

import nnsight
import polars as pl
import pytest
import torch

from graft.core.spec import parse_spec
from graft.core.texts import _rows, graft_texts
from graft.core.tiny import TINY_FAMILIES
from graft.models import tiny_tokenizer
from graft.results.metrics import example_metrics
from graft.results.plots.lens import lens_chart
from graft.study.lens import POSITIONS, LensScores, logit_lens, own_model

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["Keanu Reeves starred in a movie with", "Tom Hanks acted in"]  # two lengths: padded
FIELDS = [{"FE": "Keanu Reeves"}, {"FE": "Tom Hanks"}]
SPECS = [
    "none",
    "FE:all:all",
    "LT:all:all",
    "FE+LT:all:all",
    "ALL:all:all@sft; head=donor@sft",  # SFT: the donor's own run
    "FE+LT:h2:o,ffn; head=donor",  # a graft read out by the donor's head
]
TARGETS = [7, 41]  # one target token per text
LOGPROB_TOL = 2e-5  # the engine's 1e-5 on logits, twice through a log-softmax


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def lens_of(base, donor, tok, specs, texts=TEXTS, fields=FIELDS) -> tuple[LensScores, list[int]]:
    rows = _rows(tok, texts, [parse_spec(s) for s in specs], fields)
    targets = [t for t in TARGETS[: len(texts)] for _ in specs]
    return logit_lens(base, {"sft": donor}, rows, targets, pad_id=tok.pad_token_id), targets


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_last_layer_at_lt_is_the_runs_score(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    lens, targets = lens_of(base, donor, tok, SPECS)
    logits = graft_texts(base, {"sft": donor}, tok, TEXTS, SPECS, fields=FIELDS)
    scored = example_metrics(logits.reshape(-1, logits.shape[-1]), targets)
    assert lens.target_rank[:, -1, 0].tolist() == scored["target_rank"].to_list()
    got = lens.target_logprob[:, -1, 0].double()
    want = torch.tensor(scored["target_logprob"].to_list())
    assert (got - want).abs().max() <= LOGPROB_TOL
    # an earlier layer is not the final readout (the lens reads every layer, not one)
    assert (lens.target_logprob[:, 0, 0].double() - want).abs().max() > 1e-3


def plain_lens(model, tok, text: str, fe: str, target: int) -> tuple[list[int], list[float]]:
    """The base's logit lens written from the Hugging Face module names, one unpadded prompt
    at a time: (rank, log-prob) per (layer, position LT then FE's last token)."""
    ids = tok(text, return_tensors="pt").input_ids
    offsets = tok(text, return_offsets_mapping=True)["offset_mapping"]
    end = text.index(fe) + len(fe)
    fe_last = max(i for i, (a, b) in enumerate(offsets) if a < end and b > a)
    inner = getattr(model, "model", None) or getattr(model, "transformer", None)
    inner = inner if inner is not None else model.gpt_neox
    layers = getattr(inner, "layers", None) or inner.h
    norm = getattr(inner, "norm", None) or getattr(inner, "ln_f", None) or inner.final_layer_norm
    head = model.get_output_embeddings()
    envoy = nnsight.NNsight(model)
    with torch.no_grad(), envoy.trace(ids):
        outs = nnsight.save([envoy.get(n).output for n in _layer_names(model, layers)])
    ranks, logprobs = [], []
    cap = getattr(model.config, "final_logit_softcapping", None)
    for out in outs:
        hidden = out[0] if isinstance(out, tuple) else out
        for p in (ids.shape[1] - 1, fe_last):
            with torch.no_grad():
                logits = head(norm(hidden[0, p])).float()
            if cap:
                logits = torch.tanh(logits / cap) * cap
            ranks.append(int((logits > logits[target]).sum()))
            logprobs.append(float(torch.log_softmax(logits, -1)[target]))
    return ranks, logprobs


def _layer_names(model, layers) -> list[str]:
    names = {m: n for n, m in model.named_modules()}
    return [names[layer] for layer in layers]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_pre_is_a_plain_logit_lens_of_the_base(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    lens, _ = lens_of(base, donor, tok, ["none"])
    for i, (text, fields) in enumerate(zip(TEXTS, FIELDS, strict=True)):
        ranks, logprobs = plain_lens(base, tok, text, fields["FE"], TARGETS[i])
        assert lens.target_rank[i].flatten().tolist() == ranks
        got = lens.target_logprob[i].flatten().double()
        assert (got - torch.tensor(logprobs, dtype=torch.float64)).abs().max() <= 1e-5


def test_none_is_pre_beside_grafts_and_own_runs_are_the_donor(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    alone, _ = lens_of(base, donor, tok, ["none"])
    mixed, _ = lens_of(base, donor, tok, SPECS)
    at = [i * len(SPECS) for i in range(len(TEXTS))]  # the rows of spec "none"
    assert torch.equal(mixed.target_rank[at], alone.target_rank)
    assert (mixed.target_logprob[at] - alone.target_logprob).abs().max() <= 1e-5
    # the base as its own donor: the whole-donor reference is PRE's run, bit for bit
    rows = _rows(tok, TEXTS, [parse_spec("ALL:all:all@pre; head=donor@pre")], FIELDS)
    own = logit_lens(base, {"pre": base}, rows, TARGETS, pad_id=tok.pad_token_id)
    assert torch.equal(own.target_logprob, alone.target_logprob)
    # SFT's lens is the donor's plain lens
    sft = [i * len(SPECS) + 4 for i in range(len(TEXTS))]
    as_donor, _ = lens_of(donor, base, tok, ["none"])
    assert torch.equal(mixed.target_rank[sft], as_donor.target_rank)
    assert own_model(parse_spec(SPECS[4])) == "sft"
    assert own_model(parse_spec("ALL:all:all")) is None  # the base's head: a graft, not SFT
    assert own_model(parse_spec("none")) is None


def test_a_prompt_without_fe_has_lt_only(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    lens, _ = lens_of(base, donor, tok, ["LT:all:all"], TEXTS[:1], [{}])
    assert lens.has_position.tolist() == [[True, False]]


def test_lens_chart_draws_a_panel_per_position_and_template():
    rows = []
    for template in ("headline", "qa"):
        for position in POSITIONS:
            for graft in ("PRE", "SFT", "LT"):
                for layer in range(3):
                    value = float(layer) if graft == "LT" else 10.0
                    rows.append(
                        dict(template=template, graft=graft, position=position, layer=layer, n=4)
                        | {"median_rank": value, "median_rank_lo": 0.0, "median_rank_hi": 20.0}
                    )
    fig = lens_chart(pl.DataFrame(rows), "median_rank", order=["PRE", "SFT", "LT"])
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert len(axes) == 4 and all(ax.get_yscale() == "log" for ax in axes)
    assert [line.get_label() for line in axes[0].get_lines()] == ["PRE", "SFT", "LT"]
    assert axes[0].get_lines()[2].get_ydata().tolist() == [1.0, 2.0, 3.0]  # rank + 1
