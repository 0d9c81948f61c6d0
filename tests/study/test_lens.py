"""The logit lens under grafts (graft.study.analyses.lens_trace, lens_causality, lens_tables
and the runner's analysis in lens), on the tiny model of every family.

At the last layer the lens at LT is the run's own score of its final logits (graft_texts,
example_metrics), top tokens included; PRE's lens is a plain nnsight logit lens of the base
written here from the model's own module names, its embedding layer a lens of Hugging Face's
embedding output (``hidden_states[0]``); the top-k tokens agree with the target's rank;
``none`` is PRE whatever runs beside it, and a whole donor with its own head is that donor's
run; the lines found identical by causality (LT = PRE and FE+LT = FE at FE-last) are
identical, bit for bit; the lens as an analysis refuses what it cannot run.
"""

from __future__ import annotations

import nnsight
import polars as pl
import pytest
import torch

from graft.core.api.texts import _rows, graft_texts
from graft.core.families.arch import architecture_of
from graft.core.language.spec import parse_spec
from graft.errors import ExperimentError
from graft.models import tiny_tokenizer
from graft.models.tiny import TINY_FAMILIES
from graft.results.metrics import example_metrics
from graft.results.plots.lens import EMBEDDING_LAYER, layer_label, lens_chart
from graft.study.analyses.lens import LensAnalysis
from graft.study.analyses.lens_causality import identical_lines
from graft.study.analyses.lens_tables import stale_batches
from graft.study.analyses.lens_trace import POSITIONS, LensScores, logit_lens, own_model
from graft.study.data.prompts import TestExample
from graft.study.data.rows import graft_rows, plan_rows
from graft.study.running.batches import check_analyses
from graft.study.specs.config import ExperimentConfig
from graft.study.specs.grafts import NamedGraft
from graft.study.specs.run import resolve

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
TOP_K = 5


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
    # the top tokens of the last layer at LT are the run's top tokens
    run_top = [ids[:TOP_K] for ids in scored["top10_ids"].to_list()]
    assert lens.top_ids[:, -1, 0].tolist() == run_top


def check_top_k(lens: LensScores, targets: list[int]) -> int:
    """Assert the top-k tokens agree with the targets' ranks; return how many listed one."""
    n_rows, n_layers, n_pos = lens.target_rank.shape
    assert lens.top_ids.shape == (n_rows, n_layers, n_pos, TOP_K)
    # most probable first, the top-1 at least as probable as the target
    assert (lens.top_logprob[..., :-1] >= lens.top_logprob[..., 1:]).all()
    assert (lens.top_logprob[..., :1] >= lens.target_logprob[..., None]).all()
    listed = 0
    for i, target in enumerate(targets):
        for layer in range(n_layers):
            for p in range(n_pos):
                rank, top = int(lens.target_rank[i, layer, p]), lens.top_ids[i, layer, p].tolist()
                if rank < TOP_K:  # the target is listed at its rank (rank 0: the top-1 token)
                    assert top[rank] == target
                    assert lens.top_logprob[i, layer, p, rank] == lens.target_logprob[i, layer, p]
                    listed += 1
                else:
                    assert target not in top
    return listed


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2"])
def test_top_k_agrees_with_the_target_rank(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    lens, targets = lens_of(base, donor, tok, SPECS)
    check_top_k(lens, targets)
    # each row's top-1 token at the output as its target: rank 0 there, listed first
    rows = _rows(tok, TEXTS, [parse_spec(s) for s in SPECS], FIELDS)
    tops = lens.top_ids[:, -1, 0, 0].tolist()
    again = logit_lens(base, {"sft": donor}, rows, tops, pad_id=tok.pad_token_id)
    assert (again.target_rank[:, -1, 0] == 0).all()
    assert check_top_k(again, tops) >= len(rows)
    wider = logit_lens(base, {"sft": donor}, rows, tops, pad_id=tok.pad_token_id, top_k=500)
    assert wider.top_ids.shape[-1] == base.config.vocab_size  # at most the vocabulary
    assert torch.equal(wider.top_ids[..., :TOP_K], again.top_ids)


def plain_lens(
    model, tok, text: str, fe: str, target: int
) -> tuple[list[int], list[float], list[list[int]]]:
    """The base's logit lens written from the Hugging Face module names, one unpadded prompt
    at a time: (rank, log-prob, top-5 ids) per (layer, position LT then FE's last token), the
    first layer Hugging Face's embedding output (``hidden_states[0]``, the first layer's
    input: scaled embeddings on Gemma, token plus position embeddings on GPT-2)."""
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
    with torch.no_grad():
        embedded = model(ids, output_hidden_states=True).hidden_states[0]
    ranks, logprobs, tops = [], [], []
    cap = getattr(model.config, "final_logit_softcapping", None)
    for out in [embedded, *outs]:
        hidden = out[0] if isinstance(out, tuple) else out
        for p in (ids.shape[1] - 1, fe_last):
            with torch.no_grad():
                logits = head(norm(hidden[0, p])).float()
            if cap:
                logits = torch.tanh(logits / cap) * cap
            ranks.append(int((logits > logits[target]).sum()))
            logprobs.append(float(torch.log_softmax(logits, -1)[target]))
            tops.append(logits.topk(TOP_K).indices.tolist())
    return ranks, logprobs, tops


def _layer_names(model, layers) -> list[str]:
    names = {m: n for n, m in model.named_modules()}
    return [names[layer] for layer in layers]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_pre_is_a_plain_logit_lens_of_the_base(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    lens, _ = lens_of(base, donor, tok, ["none"])
    for i, (text, fields) in enumerate(zip(TEXTS, FIELDS, strict=True)):
        ranks, logprobs, tops = plain_lens(base, tok, text, fields["FE"], TARGETS[i])
        assert lens.target_rank[i].shape[0] == architecture_of(base).n_layers + 1  # emb first
        assert lens.target_rank[i].flatten().tolist() == ranks
        got = lens.target_logprob[i].flatten().double()
        assert (got - torch.tensor(logprobs, dtype=torch.float64)).abs().max() <= 1e-5
        assert lens.top_ids[i].flatten(0, 1).tolist() == tops
        # the embedding layer is not the first layer's output
        assert (lens.target_logprob[i, 0] - lens.target_logprob[i, 1]).abs().max() > 1e-4


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


#: The causality test's grafts: LT (cells at the last token only) and FE+LT are PRE and FE at
#: FE-last; LT read out by the donor's head is not PRE there (its readout differs); SFT is
#: the donor's run.
CAUSAL = {
    "PRE": "none",
    "FE": "FE:all:all",
    "LT": "LT:all:all",
    "FE+LT": "FE+LT:all:all",
    "SFT": "ALL:all:all@sft; head=donor@sft",
    "LT-head": "LT:all:all; head=donor",
    "LT-attn": "LT:all:attn",
}


def causal_run(base, tok) -> tuple[list[TestExample], list[NamedGraft], list[tuple[int, int]]]:
    """The test texts as a run's examples (one template) with the :data:`CAUSAL` grafts."""
    prompts = _rows(tok, TEXTS, [parse_spec("none")], FIELDS)
    examples = [
        TestExample(
            fact_id=i,
            template="headline",
            text=text,
            input_ids=list(row.input_ids),
            spans={k: list(v) for k, v in row.spans.items()},
            target_text="",
            target_id=TARGETS[i],
            prompt_id=f"{i}:headline:forward",
        )
        for i, (text, row) in enumerate(zip(TEXTS, prompts, strict=True))
    ]
    grafts = [NamedGraft(name, parse_spec(spec)) for name, spec in CAUSAL.items()]
    rows, _ = plan_rows(examples, grafts)
    return examples, grafts, rows


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_lines_identical_by_causality_are_found_and_identical(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    examples, grafts, rows = causal_run(base, tok)
    same = identical_lines(examples, grafts, rows, architecture_of(base))
    # found from the specs and positions: LT and LT:all:attn graft only after FE-last
    assert same == {
        ("", "headline", "LT", "FE-last"): "PRE",
        ("", "headline", "FE+LT", "FE-last"): "FE",
        ("", "headline", "LT-attn", "FE-last"): "PRE",
    }
    assert ("", "headline", "FE", "FE-last") not in same  # FE grafts FE-last itself
    assert ("", "headline", "LT-head", "FE-last") not in same  # the donor's head reads it
    assert not any(position == "LT" for *_, position in same)
    # and they are identical: every layer, the embeddings included, bit for bit
    lens = logit_lens(
        base,
        {"sft": donor},
        graft_rows(examples, grafts, rows),
        [examples[ei].target_id for ei, _ in rows],
        pad_id=tok.pad_token_id,
    )
    at = {(ei, grafts[gi].name): i for i, (ei, gi) in enumerate(rows)}
    fe_last, lt = POSITIONS.index("FE-last"), POSITIONS.index("LT")
    for ei in range(len(examples)):
        for (_, _, name, _), earlier in same.items():
            i, j = at[ei, name], at[ei, earlier]
            for scores in (lens.target_rank, lens.target_logprob, lens.top_ids, lens.top_logprob):
                assert torch.equal(scores[i, :, fe_last], scores[j, :, fe_last]), (name, earlier)
            # at LT, where they differ, the lines differ
            assert not torch.equal(lens.target_logprob[i, :, lt], lens.target_logprob[j, :, lt])
        # the lines not found identical are not: FE and LT-head at FE-last differ from PRE
        for name in ("FE", "LT-head"):
            i, j = at[ei, name], at[ei, "PRE"]
            diff = lens.target_logprob[i, :, fe_last] - lens.target_logprob[j, :, fe_last]
            assert diff.abs().max() > 1e-4, name


def test_stale_batches_are_those_of_an_older_layout_or_another_top_k():
    def part(batch: str, layers: list[int], width: int) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "batch": [batch] * len(layers),
                "layer": layers,
                "top_ids": [[1] * width] * len(layers),
                "top_tokens": [["a"] * width] * len(layers),
                "top_probs": [[0.5] * width] * len(layers),
            }
        )

    stored = pl.concat([part("0", [-1, 0, 1], 5), part("1", [0, 1], 5), part("2", [-1, 0], 3)])
    assert stale_batches(stored, 5) == {"1", "2"}  # no embedding layer; top 3
    assert stale_batches(stored, 3) == {"0", "1"}
    assert stale_batches(stored.drop("top_ids"), 5) == {"0", "1", "2"}  # no top-k at all
    assert stale_batches(pl.DataFrame(), 5) == set()


def test_the_lens_analysis_refuses_what_it_cannot_run():
    with pytest.raises(ExperimentError, match="top_k"):
        LensAnalysis(top_k=0)
    lens = LensAnalysis()
    assert lens.table == "lens" and lens.top_k == 5
    check_analyses([lens], resolve(ExperimentConfig("lens")))  # one replicate, local
    with pytest.raises(ExperimentError, match="one replicate"):
        check_analyses([lens], resolve(ExperimentConfig("lens", finetune_seeds=(0, 1))))
    with pytest.raises(ExperimentError, match="table of its own"):
        check_analyses([lens, LensAnalysis(top_k=3)], resolve(ExperimentConfig("lens")))


def chart_frame(same_as: bool = True) -> pl.DataFrame:
    rows = []
    for template in ("headline", "qa"):
        for position in POSITIONS:
            for graft in ("PRE", "SFT", "LT"):
                for layer in range(EMBEDDING_LAYER, 3):
                    value = float(layer + 1) if graft == "LT" else 10.0
                    same = "PRE" if same_as and graft == "LT" and position == "FE-last" else None
                    rows.append(
                        dict(template=template, graft=graft, position=position, layer=layer, n=4)
                        | {"median_rank": value, "median_rank_lo": 0.0, "median_rank_hi": 20.0}
                        | {"mean_logprob": -value, "mean_logprob_lo": -20.0}
                        | {"mean_logprob_hi": 0.0, "same_as": same}
                    )
    return pl.DataFrame(rows)


def drawn(ax) -> list:
    """The graft lines of a panel (not the dotted line after the embeddings)."""
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def test_lens_chart_draws_a_panel_per_position_and_template():
    fig = lens_chart(chart_frame(), "median_rank", order=["PRE", "SFT", "LT"], model="tiny")
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert len(axes) == 4 and all(ax.get_yscale() == "log" for ax in axes)
    lt_panel, fe_panel = axes[0], axes[2]  # headline at LT, headline at FE-last
    assert "at LT" in lt_panel.get_title() and "at FE-last" in fe_panel.get_title()
    assert [line.get_label() for line in drawn(lt_panel)] == ["PRE", "SFT", "LT"]
    lt_line = drawn(lt_panel)[2]
    assert lt_line.get_xdata().tolist() == [-1, 0, 1, 2]  # the embeddings first
    assert lt_line.get_ydata().tolist() == [1.0, 2.0, 3.0, 4.0]  # rank + 1
    # at FE-last LT is PRE: drawn once, said in the title and the legend
    assert [line.get_label() for line in drawn(fe_panel)] == ["PRE", "SFT"]
    assert "LT = PRE" in fe_panel.get_title()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["PRE (= LT at FE-last)", "SFT", "LT"]
    fig.canvas.draw()
    ticks = [t.get_text() for t in fe_panel.get_xticklabels()]  # the bottom row's
    assert ticks[0] == layer_label(EMBEDDING_LAYER) == "emb"
    caption = fig.get_supxlabel()
    assert "tiny" in caption and "n=4" in caption and "drawn once" in caption


def test_lens_chart_of_log_probabilities_and_of_a_summary_without_same_as():
    fig = lens_chart(chart_frame(same_as=False), "mean_logprob", order=["PRE", "SFT", "LT"])
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert all(ax.get_yscale() == "linear" for ax in axes)
    assert all(len(drawn(ax)) == 3 for ax in axes)  # no same_as: every line drawn
    assert drawn(axes[0])[2].get_ydata().tolist() == [-0.0, -1.0, -2.0, -3.0]
    assert "nats" in axes[0].get_ylabel()
