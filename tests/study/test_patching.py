"""Activation and residual-stream patching (graft.study.analyses.patching) on every tiny family,
against plain forwards and nnsight traces written here, and against weight grafting."""

from __future__ import annotations

import copy
import types

import nnsight
import pytest
import torch

from graft.core.api.texts import _rows, graft_texts
from graft.core.execution import resume, windows
from graft.core.execution.engine import score_grafts
from graft.core.families.arch import architecture_of
from graft.core.families.wrapping import wrap
from graft.core.language.spec import parse_spec
from graft.errors import SpecError
from graft.models import tiny_tokenizer
from graft.models.tiny import TINY_FAMILIES
from graft.study.analyses.patching import PatchingExecutor, executor_for, residual_sites
from tests.engine_cases import layer_sweep, spied
from tests.fast_tier import slow_except

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-5  # the engine's float32 bound
TEXTS = ["Keanu Reeves starred in a movie with", "Tom Hanks acted in"]  # two lengths: padded
FIELDS = [{"FE": "Keanu Reeves"}, {"FE": "Tom Hanks"}]
PATCHING = ("activation", "residual")


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def run(
    base, donor, tok, spec: str, method: str, texts=TEXTS, fields=FIELDS, **options
) -> torch.Tensor:
    """Last-token logits of ``spec`` on ``texts`` by ``method`` (``options``: graft_texts')."""
    executor = executor_for(method)
    return graft_texts(
        base, {"sft": donor}, tok, texts, spec, fields=fields, executor=executor, **options
    )


@pytest.mark.parametrize("method", PATCHING)
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_patching_nothing_is_the_base_bit_for_bit(tiny_pairs, tok, family, method):
    base, donor = tiny_pairs(family)
    got = run(base, donor, tok, "none", method, padding_side="right", sort_by_length=False)
    encoded = [tok(text)["input_ids"] for text in TEXTS]
    width = max(len(e) for e in encoded)
    ids = torch.zeros((len(encoded), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(encoded):
        ids[i, : len(e)], mask[i, : len(e)] = torch.tensor(e), 1
    with torch.no_grad():
        plain = base(input_ids=ids, attention_mask=mask).logits
    # the same batch, padding and forward, nothing patched: exact
    assert torch.equal(got, torch.stack([plain[i, len(e) - 1] for i, e in enumerate(encoded)]))


@pytest.mark.parametrize("method", PATCHING)
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_patching_every_cell_is_the_donor(tiny_pairs, tok, family, method):
    base, donor = tiny_pairs(family)
    own = graft_texts(donor, {}, tok, TEXTS, "none", fields=FIELDS)  # padded the same way
    got = run(base, donor, tok, "ALL:all:all; head=donor", method)
    assert (got - own).abs().max() <= TOL
    # and it moved: the base is far from the donor
    assert (run(base, donor, tok, "none", method) - own).abs().max() > 1e-3


def same_embeddings(base, donor):
    """``donor`` with the base's embeddings, so layer 0 sees the same input in both runs."""
    donor = copy.deepcopy(donor)
    for site in architecture_of(base).table.embed_sites:
        donor.get_submodule(site.path).load_state_dict(base.get_submodule(site.path).state_dict())
    return donor


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_activation_patching_is_grafting_where_inputs_agree(tiny_pairs, tok, family):
    """Positions 0..2 of layer 0 (every position before them patched too) read the same
    input in the donor's run and in the base's: patching their outputs is grafting."""
    base, donor = tiny_pairs(family)
    donor = same_embeddings(base, donor)
    for spec in ("0:0:all", "0..2:0:all", "0..2:0:ln_1,attn"):
        weights = run(base, donor, tok, spec, "weights")
        patched = run(base, donor, tok, spec, "activation")
        assert (patched - weights).abs().max() <= TOL, spec
    # where the input differs (LT reads the base's earlier positions in layer 0, and the
    # donor's layer 1 output in the donor's run) the two differ: the check can fail
    weights = run(base, donor, tok, "LT:1:all", "weights")
    patched = run(base, donor, tok, "LT:1:all", "activation")
    assert (patched - weights).abs().max() > 1e-4


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_residual_patching_of_the_last_layer_is_the_donors_final_norm_input(
    tiny_pairs, tok, family
):
    base, donor = tiny_pairs(family)
    arch = architecture_of(base)
    norm = arch.table.final_norm_path
    for text, field in zip(TEXTS, FIELDS, strict=True):
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad(), wrap(donor).trace(ids):
            stream = nnsight.save(wrap(donor).get(norm).input)
        with torch.no_grad(), wrap(base).trace(ids):
            wrap(base).get(norm).input = stream
            want = nnsight.save(wrap(base).output.logits[:, -1])
        spec = f"ALL:{arch.n_layers - 1}:all"
        got = run(base, donor, tok, spec, "residual", [text], [field])
        assert (got - want).abs().max() <= TOL
        # a single component of the last layer patches the same residual stream
        got_o = run(base, donor, tok, f"ALL:{arch.n_layers - 1}:o", "residual", [text], [field])
        assert (got_o - want).abs().max() <= TOL


def site(path: str, donor: str, rows: list[list[bool]]) -> types.SimpleNamespace:
    return types.SimpleNamespace(path=path, donor=donor, rows=torch.tensor(rows), seq_dim=1)


def test_residual_sites_join_a_layers_masks_in_forward_order():
    patches = [
        site("model.embed_tokens", "sft", [[True, False]]),
        site("model.layers.0.self_attn.q_proj", "sft", [[True, False]]),
        site("model.layers.0.mlp.down_proj", "sft", [[False, True]]),
        site("model.layers.1.mlp.down_proj", "sft", [[False, True]]),
        site("lm_head", "sft", [[False, True]]),
    ]
    sites = residual_sites("model.layers", patches)
    assert [s.path for s in sites] == [
        "model.embed_tokens",
        "model.layers.0",
        "model.layers.1",
        "lm_head",
    ]
    assert sites[1].rows.tolist() == [[True, True]]
    assert sites[2].rows.tolist() == [[False, True]]
    assert patches[1].rows.tolist() == [[True, False]]  # the plan's masks are not changed


def test_residual_sites_refuse_two_donors_at_one_cell():
    patches = [
        site("model.layers.0.mlp.down_proj", "a", [[True, False]]),
        site("model.layers.0.self_attn.o_proj", "b", [[True, True]]),
    ]
    with pytest.raises(SpecError, match="one donor per"):
        residual_sites("model.layers", patches)
    ok = residual_sites("model.layers", [patches[0], site(patches[1].path, "b", [[False, True]])])
    assert [s.donor for s in ok] == ["a", "b"]


def test_unknown_method_is_one_line():
    with pytest.raises(SpecError, match="activation or residual"):
        PatchingExecutor("weights")
    with pytest.raises(SpecError, match="use some of"):
        executor_for("gradient")


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2"])
def test_activation_patching_is_the_hand_written_nnsight_patch(tiny_pairs, tok, family):
    """``LT:1:o``, written as an nnsight user would: save the donor's output projection of
    layer 1, write its last position into the base's run."""
    base, donor = tiny_pairs(family)
    arch = architecture_of(base)
    path, _ = arch.site_for(1, "o")
    for text, field in zip(TEXTS, FIELDS, strict=True):
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad(), wrap(donor).trace(ids):
            saved = nnsight.save(wrap(donor).get(path).output)
        with torch.no_grad(), wrap(base).trace(ids):
            wrap(base).get(path).output[:, -1] = saved[:, -1]
            want = nnsight.save(wrap(base).output.logits[:, -1])
        got = run(base, donor, tok, "LT:1:o", "activation", [text], [field])
        assert (got - want).abs().max() <= TOL
        assert (
            got - run(base, donor, tok, "none", "activation", [text], [field])
        ).abs().max() > 1e-4


#: A patching sweep's cells: units x layers x sites, references, whole-depth cells, fused
#: q/k/v slices and a head patch
SWEEP = layer_sweep(["LT:1:q", "FE:2:k,v", "LT:3:o; head=donor"], ("o", "down", "all"))


@pytest.mark.parametrize("method", PATCHING)
@pytest.mark.parametrize("family", slow_except(TINY_FAMILIES, "llama", "gpt2"))
def test_patching_from_the_first_patched_layer_is_the_whole_forward(
    tiny_pairs, tok, family, method, monkeypatch
):
    base, donor = tiny_pairs(family)
    seen = {**spied(monkeypatch, resume, "prepare"), **spied(monkeypatch, windows, "step_inputs")}
    got = run(base, donor, tok, SWEEP, method)
    assert any(r is not None for r in seen["prepare"]), "no row ran from its first layer"
    # steps over a cache of more than one width: FE[-1], (FE+LT)^C and LT start apart
    widths = {step["input_ids"].shape[1] for step in seen["step_inputs"]}
    assert len(widths) >= 2, f"steps over a cache only of widths {widths}"
    whole = graft_texts(
        base,
        {"sft": donor},
        tok,
        TEXTS,
        SWEEP,
        fields=FIELDS,
        executor=PatchingExecutor(method, reuse=False),
    )
    assert (got - whole).abs().max() <= TOL
    assert (got - whole[:, :1]).abs().max() > 1e-3  # the cells differ: the check can fail
    # the metrics path (targets, as the runner scores rows): ranks and top-5 identical
    targets = whole.argmax(-1)[:, 3]  # some token whose rank moves across the cells
    rows = _rows(tok, TEXTS, [parse_spec(s) for s in SWEEP], FIELDS)
    flat = targets.repeat_interleave(len(SWEEP))
    scored = [
        score_grafts(base, {"sft": donor}, rows, flat, executor=executor)
        for executor in (PatchingExecutor(method), PatchingExecutor(method, reuse=False))
    ]
    assert torch.equal(scored[0]["target_rank"], scored[1]["target_rank"])
    assert torch.equal(scored[0]["top_ids"], scored[1]["top_ids"])
    assert (scored[0]["target_logprob"] - scored[1]["target_logprob"]).abs().max() <= TOL
