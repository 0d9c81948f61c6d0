"""The one-pass engine against the independent token-by-token weight-swap reference.

Every supported family, position / component / layer / embedding / head / multi-donor
grafts, prompts of different lengths in one batch, left and right padding: max abs logit
difference <= 1e-5 in float32. Plus the engine's invariants (exact equalities).
"""

from __future__ import annotations

import pytest
import torch

from graft.core.execution.engine import GraftRow, run_grafts
from graft.core.families.arch import architecture_of
from graft.core.language.spec import EMBEDDING_COMPONENTS, SpecError, parse_spec
from graft.errors import UnsupportedModelError
from graft.models.tiny import TINY_FAMILIES, perturbed_copy, tiny_model
from tests.engine_cases import BASE_POSITION_SPECS, own_forward
from tests.fast_tier import slow_except
from tests.reference import reference_last_logits

TOL = 1e-5
POSITION_SPECS = [*BASE_POSITION_SPECS, "M:all:all", "FE+M:all:all", "ALL:all:all"]
COMPONENT_SPECS = [
    "FE+LT:all:attn",
    "ALL:all:ffn",
    "LT:all:o,ffn",
    "ALL:h2:o,ffn_up",
    "LT:q4:o,ffn_down",
]
LAYER_SPECS = ["ALL:h1:block", "ALL:q4:block", "FE+LT:1-2:block", "ALL:0,3:block", "ALL:-1:block"]
HEAD_SPECS = ["ALL:all:all; head=donor", "LT:all:all; head=paper", "FE+LT:all:embed; head=paper"]
MULTI_DONOR_SPECS = [
    "FE:all:all@task; LT:h2:o,ffn",
    "ALL:all:attn@task; LT:all:o,ffn; head=donor@task",
]


def family_specs(arch) -> list[str]:
    singles = [f"ALL:all:{c}" for c in arch.components if c not in EMBEDDING_COMPONENTS]
    singles += [f"FE+LT:all:{c}" for c in EMBEDDING_COMPONENTS if c in arch.components]
    return (
        ["none"]
        + POSITION_SPECS
        + singles
        + COMPONENT_SPECS
        + LAYER_SPECS
        + HEAD_SPECS
        + MULTI_DONOR_SPECS
    )


def make_rows(arch, seed: int = 0) -> list[GraftRow]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i, text in enumerate(family_specs(arch)):
        n = (6, 9, 11)[i % 3]  # different lengths in one batch
        ids = [1] + torch.randint(3, 96, (n - 1,), generator=g).tolist()
        spans = {"FE": [1, 2], "M": [4, 5]}
        rows.append(GraftRow(ids, spans, parse_spec(text)))
    return rows


def reference(base, donors, arch, row) -> torch.Tensor:
    res = row.spec.resolve(arch, len(row.input_ids), row.spans)
    return reference_last_logits(
        base, donors, list(row.input_ids), res.cells, res.final_norm_donor, res.unembed_donor
    )


@pytest.fixture(scope="module")
def family_setup(request):
    cache = {}

    def get(family, tied=None):
        if (family, tied) not in cache:
            base = tiny_model(family, seed=0, tied=tied)
            donors = {"sft": perturbed_copy(base, seed=1), "task": perturbed_copy(base, seed=2)}
            arch = architecture_of(base)
            rows = make_rows(arch)
            refs = torch.stack([reference(base, donors, arch, r) for r in rows])
            cache[(family, tied)] = (base, donors, arch, rows, refs)
        return cache[(family, tied)]

    return get


# the reference checks of one family are in the fast tier, the other families are slow
CASES = slow_except(
    [(f, None) for f in TINY_FAMILIES] + [("llama", True), ("qwen2", True)], ("llama", None)
)


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize(("family", "tied"), CASES)
def test_engine_matches_token_by_token_reference(family_setup, family, tied, padding_side):
    base, donors, arch, rows, refs = family_setup(family, tied)
    out = run_grafts(base, donors, rows, batch_size=7, padding_side=padding_side)
    diffs = (out - refs).abs().amax(dim=-1)
    bad = {str(r.spec): float(d) for r, d in zip(rows, diffs, strict=True) if d > TOL}
    assert not bad, f"{family}: grafts off the reference: {bad}"
    # the comparison is not vacuous: every graft but 'none' moves the logits
    base_ref = refs[0]
    moved = (refs[1:] - base_ref).abs().amax(dim=-1)
    assert bool((moved > 1e-3).all()), [
        str(r.spec) for r, m in zip(rows[1:], moved, strict=True) if m <= 1e-3
    ]


@pytest.mark.parametrize("family", slow_except(TINY_FAMILIES, "llama"))
def test_graft_nothing_is_the_base_exactly(family_setup, family):
    base, donors, arch, rows, _ = family_setup(family)
    none_rows = [GraftRow(r.input_ids, r.spans, parse_spec("none")) for r in rows[:6]]
    out = run_grafts(
        base, donors, none_rows, batch_size=6, padding_side="right", sort_by_length=False
    )
    last = own_forward(base, none_rows)
    # exact: the same batch, padding and forward, nothing patched (left padding runs other
    # shapes than this plain forward: equal within TOL there, not bit for bit)
    assert torch.equal(out, last)


@pytest.mark.parametrize("family", slow_except(TINY_FAMILIES, "llama"))
def test_graft_everything_with_donor_head_is_the_donor(family_setup, family):
    base, donors, _, rows, _ = family_setup(family)
    every = [
        GraftRow(r.input_ids, r.spans, parse_spec("ALL:all:all; head=donor")) for r in rows[:5]
    ]
    out = run_grafts(base, donors, every, batch_size=5)
    with torch.no_grad():
        want = torch.stack(
            [donors["sft"](torch.tensor([r.input_ids])).logits[0, -1] for r in every]
        )
    assert (out - want).abs().max() <= TOL


@pytest.mark.parametrize("family", slow_except(["gpt2", "llama", "gemma3"], "llama"))
def test_batched_equals_one_prompt_at_a_time(family_setup, family):
    base, donors, _, rows, _ = family_setup(family)
    batched = run_grafts(base, donors, rows, batch_size=len(rows))
    single = torch.cat([run_grafts(base, donors, [r], batch_size=1) for r in rows])
    assert (batched - single).abs().max() <= TOL


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "gemma3"])
def test_donor_equal_to_base_changes_nothing(family_setup, family):
    base, _, _, rows, _ = family_setup(family)
    twin = perturbed_copy(base, scale=0.0)  # equal weights, separate tensors
    plain = run_grafts(base, {}, [GraftRow(r.input_ids, r.spans) for r in rows], batch_size=8)
    # the twin's modules run on the gathered rows only: other matrix shapes, so other
    # kernel blocking and rounding; the engine's float32 bound, not equality
    out = run_grafts(base, {"sft": twin, "task": twin}, rows, batch_size=8)
    assert (out - plain).abs().max() <= TOL
    # a donor that IS the base patches nothing: the very same ops as the plain run
    same = run_grafts(base, {"sft": base, "task": base}, rows, batch_size=8)
    assert torch.equal(same, plain)


@pytest.mark.parametrize("family", slow_except(["gpt2", "llama"], "llama"))
def test_remote_serialisation_path_gives_the_same_logits(family_setup, family):
    from graft.remote.config import RemoteConfig
    from graft.remote.executor import RemoteExecutor

    base, donors, _, rows, refs = family_setup(family)
    simulate = RemoteExecutor(RemoteConfig(mode="simulate"))
    out = run_grafts(base, donors, rows[:12], batch_size=6, executor=simulate)
    assert (out - refs[:12]).abs().max() <= TOL


def test_log_probs_and_progress(family_setup):
    base, donors, _, rows, refs = family_setup("llama")
    lp = run_grafts(base, donors, rows[:4], log_probs=True, progress="test")
    assert torch.allclose(lp.exp().sum(-1), torch.ones(4), atol=1e-5)
    assert (lp - torch.log_softmax(refs[:4], -1)).abs().max() <= TOL


def test_errors_are_clear(family_setup, tiny_pairs):
    base, donors, _, rows, _ = family_setup("llama")
    with pytest.raises(SpecError, match="donor"):
        run_grafts(base, {"sft": donors["sft"]}, [rows[-1]])  # uses 'task'
    other = tiny_model("llama", seed=0, n_layers=3)
    with pytest.raises(SpecError, match="differs|lacks|has no tensor"):
        run_grafts(base, {"sft": other}, rows[:1])
    gpt2 = tiny_pairs("gpt2")[0]
    with pytest.raises(SpecError, match="is a gpt2 model but the base is llama"):
        run_grafts(base, {"sft": gpt2}, rows[:1])
    bert = torch.nn.Linear(2, 2)
    with pytest.raises(UnsupportedModelError, match="not supported; supported families: gpt2"):
        architecture_of(bert)
    with pytest.raises(SpecError, match="not a span"):
        run_grafts(base, donors, [GraftRow([1, 5, 6], {}, parse_spec("FE:all:all"))])


@pytest.mark.parametrize("family", slow_except(TINY_FAMILIES, "llama"))
def test_float64_engine_equals_reference_to_rounding(family):
    """In float64 the two algorithms agree to ~1e-12: what is left in float32 is rounding."""
    base = tiny_model(family, seed=3).double()
    donors = {"sft": perturbed_copy(base, seed=4), "task": perturbed_copy(base, seed=5)}
    arch = architecture_of(base)
    rows = make_rows(arch, seed=1)[::3]
    out = run_grafts(base, donors, rows, batch_size=5)
    refs = torch.stack([reference(base, donors, arch, r) for r in rows])
    assert out.dtype == torch.float64
    assert (out - refs.double()).abs().max() <= 1e-10
