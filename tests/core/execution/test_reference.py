"""Sanity tests of the token-by-token reference implementation (tests/reference.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from graft.models.tiny import TINY_FAMILIES, tiny_pair

try:
    from tests.reference import (
        cache_name,
        cache_of,
        component_names,
        family_spec,
        reference_last_logits,
    )
except ImportError:  # tests/ is not a package: pytest puts it on sys.path
    from reference import (
        cache_name,
        cache_of,
        component_names,
        family_spec,
        reference_last_logits,
    )

TOL = 1e-5
# Longer than the sliding window (4) of the tiny gemma2/gemma3 models.
IDS = [1, 5, 9, 17, 33, 40, 7, 8, 60, 61]
N_LAYERS = 2


@pytest.fixture(scope="module", params=TINY_FAMILIES)
def pair(request):
    base, donor = tiny_pair(request.param, n_layers=N_LAYERS)
    return request.param, base, donor


@torch.no_grad()
def _plain_last(model, ids=IDS) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0, -1].float()


def _all_cells(model, positions, donor="sft", components=None) -> dict:
    embeds, layer_components = component_names(model)
    cells = {}
    for comp in embeds:
        if components is None or comp in components:
            cells[(-1, comp)] = dict.fromkeys(positions, donor)
    for layer in range(model.config.num_hidden_layers):
        for comp in layer_components:
            if components is None or comp in components:
                cells[(layer, comp)] = dict.fromkeys(positions, donor)
    return cells


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_no_cells_equals_base(pair):
    family, base, donor = pair
    before = _state(base)
    ref = reference_last_logits(base, {"sft": donor}, IDS, {})
    assert ref.dtype == torch.float32 and ref.shape == (base.config.vocab_size,)
    assert (ref - _plain_last(base)).abs().max().item() <= TOL
    # the base is left untouched (weights and tying)
    after = base.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    if base.config.tie_word_embeddings:
        assert base.get_output_embeddings().weight is base.get_input_embeddings().weight


def test_everything_grafted_equals_donor(pair):
    family, base, donor = pair
    cells = _all_cells(base, range(len(IDS)))
    ref = reference_last_logits(
        base, {"sft": donor}, IDS, cells, final_norm_donor="sft", unembed_donor="sft"
    )
    assert (ref - _plain_last(donor)).abs().max().item() <= TOL
    assert (ref - _plain_last(base)).abs().max().item() > 1e-3


def test_component_tables():
    expected_common = {"ln_1", "q", "k", "v", "o", "ln_2", "up", "down"}
    for family in TINY_FAMILIES:
        base, _ = tiny_pair(family, n_layers=1)
        embeds, comps = component_names(base)
        assert "embed" in embeds
        assert ("pos_embed" in embeds) == (family == "gpt2")
        assert expected_common <= set(comps)
        assert ("gate" in comps) == (family not in ("gpt2", "gpt_neox"))
        assert ("q_norm" in comps) == (family in ("qwen3", "gemma3"))
        assert ("ln_post_ffn" in comps) == (family in ("gemma2", "gemma3"))
        # every parameter of the model is covered by exactly the table (+ final norm, lm_head)
        spec = family_spec(base)
        covered = {
            f"{spec['final_norm']}.{n}"
            for n, _ in base.get_submodule(spec["final_norm"]).named_parameters()
        }
        for path in spec["embeddings"].values():
            covered |= {f"{path}.{n}" for n, _ in base.get_submodule(path).named_parameters()}
        for path, _ in spec["layer"].values():
            full = f"{spec['layers']}.0.{path}"
            covered |= {f"{full}.{n}" for n, _ in base.get_submodule(full).named_parameters()}
        names = {n for n, _ in base.named_parameters()}
        out_name = next(
            n for n, p in base.named_parameters() if p is base.get_output_embeddings().weight
        )
        assert names - covered <= {out_name}, (family, names - covered)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox"])
def test_fused_qkv_slices(family):
    base, donor = tiny_pair(family, n_layers=N_LAYERS)
    donors = {"sft": donor}
    positions = range(len(IDS))
    spec = family_spec(base)
    fused = spec["layer"]["q"][0]
    assert spec["layer"]["k"][0] == fused == spec["layer"]["v"][0]
    # random init gives near-uniform attention, where q hardly matters: sharpen both models
    with torch.no_grad():
        for model in (base, donor):
            for layer in range(N_LAYERS):
                model.get_submodule(f"{spec['layers']}.{layer}.{fused}").weight.mul_(10.0)

    # q, k and v grafted separately == the whole fused module from the donor
    separate = _all_cells(base, positions, components={"q", "k", "v"})
    ref = reference_last_logits(base, donors, IDS, separate)
    manual = copy.deepcopy(base)
    for layer in range(N_LAYERS):
        path = f"{spec['layers']}.{layer}.{fused}"
        manual.get_submodule(path).load_state_dict(donor.get_submodule(path).state_dict())
    assert (ref - _plain_last(manual)).abs().max().item() <= TOL

    # q alone differs from the base and from k alone
    only_q = reference_last_logits(base, donors, IDS, _all_cells(base, positions, components={"q"}))
    only_k = reference_last_logits(base, donors, IDS, _all_cells(base, positions, components={"k"}))
    assert (only_q - _plain_last(base)).abs().max().item() > 1e-4
    assert (only_q - only_k).abs().max().item() > 1e-4

    # the selectors pick exactly the q / k / v outputs as the HF attention code splits them
    path = f"{spec['layers']}.0.{fused}"
    x = torch.randn(1, 3, base.config.hidden_size, generator=torch.Generator().manual_seed(0))

    def split(module):
        with torch.no_grad():
            out = module(x)
        if family == "gpt2":  # GPT2Attention: c_attn(h).split(split_size, dim=2)
            return out.split(base.config.hidden_size, dim=2)
        heads = base.config.num_attention_heads  # GPTNeoXAttention: view + chunk(3, dim=-1)
        return out.view(1, 3, heads, -1).chunk(3, dim=-1)

    base_parts, donor_parts = split(base.get_submodule(path)), split(donor.get_submodule(path))
    for which, name in enumerate("qkv"):
        mixed = copy.deepcopy(base.get_submodule(path))
        selector = spec["layer"][name][1]
        src = dict(donor.get_submodule(path).named_parameters())
        with torch.no_grad():
            for pname, p in mixed.named_parameters():
                index = selector(pname, p)
                p[index] = src[pname][index]
        parts = split(mixed)
        for j in range(3):
            want = donor_parts[j] if j == which else base_parts[j]
            assert torch.equal(parts[j], want), (name, j)


@pytest.mark.parametrize("family,tied", [("gpt2", None), ("gemma", None), ("llama", True)])
def test_tied_embed_graft_keeps_base_unembedding(family, tied):
    base, donor = tiny_pair(family, tied=tied, n_layers=N_LAYERS)
    assert base.get_output_embeddings().weight is base.get_input_embeddings().weight
    donors = {"sft": donor}
    last = len(IDS) - 1
    cells = {(-1, "embed"): {last: "sft"}}
    ref = reference_last_logits(base, donors, IDS, cells)
    assert (ref - _plain_last(base)).abs().max().item() > 1e-4

    # manual: base run on embeddings whose last row is the donor's; base unembedding
    with torch.no_grad():
        ids = torch.tensor([IDS])
        emb = base.get_input_embeddings()(ids).clone()
        emb[0, last] = donor.get_input_embeddings()(ids[:, last])[0]
        manual = base(inputs_embeds=emb).logits[0, -1].float()
    assert (ref - manual).abs().max().item() <= TOL

    # the unembedding is controlled by unembed_donor only
    with_unembed = reference_last_logits(base, donors, IDS, cells, unembed_donor="sft")
    assert (with_unembed - ref).abs().max().item() > 1e-4
    with torch.no_grad():
        hidden = base(inputs_embeds=emb, output_hidden_states=True).hidden_states[-1][0, -1]
        manual_unembed = donor.get_output_embeddings()(hidden).float()
        softcap = getattr(base.config, "final_logit_softcapping", None)
        if softcap:
            manual_unembed = torch.tanh(manual_unembed / softcap) * softcap
    assert (with_unembed - manual_unembed).abs().max().item() <= TOL


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_prefix_graft_uses_donor_cache(family):
    """Everything grafted at positions 0..k == donor prefill, then the base continues on that cache."""
    base, donor = tiny_pair(family, n_layers=N_LAYERS)
    k = 5
    cells = _all_cells(base, range(k + 1))
    ref = reference_last_logits(base, {"sft": donor}, IDS, cells)
    with torch.no_grad():
        ids = torch.tensor([IDS])
        out = donor(ids[:, : k + 1], use_cache=True)
        rest = base(
            ids[:, k + 1 :],
            **{cache_name(base): cache_of(out)},
            attention_mask=torch.ones(1, len(IDS), dtype=torch.long),
            position_ids=torch.arange(k + 1, len(IDS)).unsqueeze(0),
            use_cache=True,
        )
    assert (ref - rest.logits[0, -1].float()).abs().max().item() <= TOL
    assert (ref - _plain_last(base)).abs().max().item() > 1e-4


def test_errors():
    base, donor = tiny_pair("llama", n_layers=1)
    donors = {"sft": donor}
    for cells, message in (
        ({(0, "nope"): {0: "sft"}}, "unknown component 'nope'"),
        ({(-1, "pos_embed"): {0: "sft"}}, "'pos_embed' at layer -1 is not an embedding"),
        ({(0, "q_norm"): {0: "sft"}}, "unknown component 'q_norm'"),
        ({(-1, "q"): {0: "sft"}}, "'q' at layer -1 is not an embedding"),
        ({(5, "q"): {0: "sft"}}, r"layer 5 out of range 0\.\.0"),
        ({(0, "q"): {0: "other"}}, "unknown donor 'other'"),
        ({(0, "q"): {len(IDS): "sft"}}, f"position {len(IDS)} out of range"),
    ):
        with pytest.raises(ValueError, match=message):
            reference_last_logits(base, donors, IDS, cells)
    with pytest.raises(ValueError, match="unknown donor 'other'"):
        reference_last_logits(base, donors, IDS, {}, unembed_donor="other")
