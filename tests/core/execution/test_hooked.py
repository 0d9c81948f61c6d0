"""The local executor's graft without a trace (graft.core.execution.hooked) and the planning kept
across calls (graft.core.planning.plan_cache): the same numbers as the traced graft bit for bit, the
models left as they were, and no stale plan when the donors change."""

from __future__ import annotations

import pytest
import torch

import graft.core.execution.hooked as hooked
import graft.core.execution.split as split_module
from graft.core.execution.engine import LocalExecutor, run_grafts
from graft.core.families.arch import architecture_of
from graft.core.families.wrapping import wrap
from graft.core.planning.plan import GraftRow
from graft.core.planning.plan_cache import layouts_for
from graft.models.tiny import TINY_FAMILIES, perturbed_copy
from tests.engine_cases import E1_SPECS, random_rows

pytestmark = pytest.mark.usefixtures("one_thread")

SPECS = [
    *E1_SPECS,
    "LT:q4:q",
    "LT:q4:k,v",
    "LT:q4:o,ffn",
    "FE:0-1:qkv; LT:all:mlp",
    "FE+LT:all:attn; head=donor",
]


def rows_of(specs, lengths=(9, 4, 7, 5, 11, 7)) -> list[GraftRow]:
    return random_rows(specs, lengths)


def _forwards(model: torch.nn.Module) -> dict[str, object]:
    return {name: m.__dict__.get("forward") for name, m in model.named_modules()}


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_hooked_forwards_give_the_traced_graft_bit_for_bit(tiny_pairs, family, split, monkeypatch):
    if split:  # the tiny models' products are narrower than a split is worth: split them
        monkeypatch.setattr(split_module, "SPLIT_MIN_FEATURES", 0)
    base, donor = tiny_pairs(family)
    rows = rows_of(SPECS)
    hooks = run_grafts(base, donor, rows, batch_size=8, executor=LocalExecutor(hooks=True))
    traced = run_grafts(base, donor, rows, batch_size=8, executor=LocalExecutor(hooks=False))
    assert torch.equal(hooks, traced)


@pytest.mark.parametrize("wrapped", [False, True])
def test_the_models_forwards_are_put_back(tiny_pairs, wrapped):
    base, donor = tiny_pairs("llama")
    if wrapped:  # nnsight keeps a controller as each module's forward: it must stay
        wrap(base)
    before = _forwards(base), _forwards(donor)
    run_grafts(base, donor, rows_of(SPECS), batch_size=8)
    assert (_forwards(base), _forwards(donor)) == before


def test_an_error_inside_a_graft_names_the_module_and_puts_the_forwards_back(
    tiny_pairs, monkeypatch
):
    base, donor = tiny_pairs("gpt2")
    before = _forwards(base)

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(hooked, "graft_cells", broken)
    with pytest.raises(RuntimeError, match="boom") as info:
        run_grafts(base, donor, rows_of(["FE:all:all"]), batch_size=8)
    assert any("graft: raised while grafting" in note for note in info.value.__notes__)
    assert _forwards(base) == before
    monkeypatch.undo()
    assert run_grafts(base, donor, rows_of(["none"])).isfinite().all()


def test_kept_plans_follow_the_donors(tiny_pairs):
    base, donor = tiny_pairs("llama")
    other = perturbed_copy(base, seed=7)
    rows = rows_of(["FE:all:all", "LT^C:all:all", "LT:all:mlp"])
    first = run_grafts(base, donor, rows)
    with_other = run_grafts(base, other, rows)
    with_base = run_grafts(base, {"sft": base}, rows)  # the donor is the base: nothing grafted
    assert not torch.equal(first, with_other)
    plain = run_grafts(base, {"sft": base}, rows_of(["none", "none", "none"]))
    assert torch.equal(with_base, plain)
    assert torch.equal(run_grafts(base, donor, rows), first)  # kept plans: the same numbers


def test_layouts_are_kept_per_scope_and_donor_models(tiny_pairs):
    base, donor = tiny_pairs("gpt2")
    arch = architecture_of(base)
    kept = layouts_for(base, arch, {"sft": donor}, ("traced", None))
    assert layouts_for(base, arch, {"sft": donor}, ("traced", None)) is kept
    assert layouts_for(base, arch, {"sft": donor}, ("step", None)) is not kept
    assert layouts_for(base, arch, {"sft": base}, ("traced", None)) is not kept
    assert layouts_for(base, arch, {"sft": None}, ("traced", None)) is not kept


def test_a_product_is_split_only_where_it_pays():
    wide, narrow = torch.nn.Linear(512, 64), torch.nn.Linear(64, 512)
    assert split_module._split_share(wide) == split_module.SPLIT_SHARE
    assert split_module._split_share(narrow) == split_module.SPLIT_SHARE_MOST
    assert split_module._split_share(torch.nn.LayerNorm(512)) is None
    from transformers.pytorch_utils import Conv1D

    assert (
        split_module._split_share(Conv1D(64, 512)) == split_module.SPLIT_SHARE
    )  # weight [512, 64]
    assert split_module._split_share(Conv1D(512, 64)) == split_module.SPLIT_SHARE_MOST
