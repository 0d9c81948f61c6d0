"""Rows run from their first changed layer (graft.core.execution.resume): a sweep of one-layer
grafts against the token-by-token reference and the whole-forward path on every family, and
the pieces (first changed layers, the sort, the cut)."""

from __future__ import annotations

import types

import pytest
import torch

from graft.core.execution import resume, windows
from graft.core.execution.engine import LocalExecutor, run_grafts
from graft.core.families.arch import architecture_of
from graft.models.tiny import TINY_FAMILIES, perturbed_copy, tiny_model
from tests.core.execution.test_engine_paths import TOL, prompt_rows, reference
from tests.engine_cases import layer_sweep, spied
from tests.fast_tier import slow_except

pytestmark = pytest.mark.usefixtures("one_thread")

AFTER = ("model.norm", "lm_head")
#: A sweep's cells: units x single layers x kinds, the references and whole-depth cells.
SWEEP = layer_sweep(["LT:3:o; head=donor"], ("ln_1,q,k,v,o", "ln_2,ffn", "q"))


@pytest.mark.parametrize("family", slow_except(TINY_FAMILIES, "llama"))
def test_a_sweep_resumed_is_the_reference_and_the_whole_forward(family, monkeypatch):
    base = tiny_model(family, seed=0)
    donors = {"sft": perturbed_copy(base, seed=1)}
    rows = prompt_rows(SWEEP, lengths=(6, 9))
    seen = spied(monkeypatch, resume, "prepare")["prepare"]
    steps = spied(monkeypatch, windows, "windowed")["windowed"]
    out = run_grafts(base, donors, rows, batch_size=40, executor=LocalExecutor(resume_layers=True))
    used = [r for r in seen if r is not None]
    assert used, f"{family}: no batch ran from its rows' first layers"
    # rows from a column past the first, at more than one column (FE[-1], (FE+LT)^C, LT)
    assert len({step.inputs["input_ids"].shape[1] for step in steps}) >= 2
    assert any(0 < c < r.counts[-1] for r in used for c in r.counts), "no layer ran fewer rows"
    whole = run_grafts(base, donors, rows, batch_size=40)
    assert (out - whole).abs().max() <= TOL
    expected = reference(base, donors, architecture_of(base), rows)
    assert (out - expected).abs().max() <= TOL


def test_resuming_from_wrong_states_is_caught(monkeypatch):
    # the comparison above can fail: layer inputs one column late move the numbers
    base = tiny_model("llama", seed=0)
    donors = {"sft": perturbed_copy(base, seed=1)}
    rows = prompt_rows(SWEEP, lengths=(6, 9))
    original = resume.plain_layer_inputs

    def shifted(*args):
        return [s.roll(1, dims=1) for s in original(*args)]  # each state one column late

    monkeypatch.setattr(resume, "plain_layer_inputs", shifted)
    out = run_grafts(base, donors, rows, batch_size=80, executor=LocalExecutor(resume_layers=True))
    assert (out - run_grafts(base, donors, rows, batch_size=80)).abs().max() > 1e-3


def patch(path: str, rows: list[list[bool]], slices=()) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        path=path,
        donor="sft",
        rows=torch.tensor(rows).bool(),
        fused=None,
        slices=list(slices),
        n_heads=1,
        seq_dim=1,
        cells=None,
    )


def test_first_changed_layers():
    patches = [
        patch("model.layers.2.mlp.down_proj", [[0, 1], [0, 0], [1, 1], [0, 0]]),
        patch("model.layers.1.self_attn.o_proj", [[0, 0], [0, 0], [1, 0], [0, 0]]),
        patch("lm_head", [[0, 0], [0, 1], [0, 0], [0, 0]]),
    ]
    start = resume.first_changed_layers(patches, 4, "model.layers", 4, AFTER)
    assert start.tolist() == [2, 4, 1, 4]
    embed = [patch("model.embed_tokens", [[True, False]])]
    assert resume.first_changed_layers(embed, 1, "model.layers", 4, AFTER).tolist() == [0]


def test_resuming_pays_only_above_the_first_layers():
    assert resume.worth_resuming(torch.tensor([20, 25, 30, 28]), 1, 30)
    assert not resume.worth_resuming(torch.tensor([0, 0, 1, 2]), 1, 30)
    assert not resume.worth_resuming(torch.tensor([15, 15]), 2, 30)  # two prompts, two rows


def test_sorting_keeps_a_fused_sites_slices_on_their_cells():
    rows = [[True, False, True], [False, False, False], [False, True, True]]
    # three marked cells of row 0 and row 2, in row-major order: (0,0) (0,2) (2,1) (2,2)
    site = patch("transformer.h.1.attn.c_attn", rows, [(0, torch.tensor([1, 0, 0, 1]).bool())])
    ids = torch.arange(9).view(3, 3)
    batch = types.SimpleNamespace(
        inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids)},
        patches=[site],
        rows=torch.arange(3),
        pick=torch.full((3,), -1),
        targets=None,
    )
    order = torch.tensor([2, 0, 1])
    moved = resume.permuted(batch, order)
    assert moved.inputs["input_ids"].tolist() == ids[order].tolist()
    (p,) = moved.patches
    assert p.rows.tolist() == [rows[2], rows[0], rows[1]]
    # now row-major: (0,1) (0,2) from old row 2, then (1,0) (1,2) from old row 0
    assert p.slices[0][1].tolist() == [False, True, True, False]


def test_the_saved_states_are_sized():
    assert resume.saved_bytes(30, 4, 20, 576, 4) == 31 * 4 * 20 * 576 * 4
    keys_values = 30 * 2 * 192 * 4 * 20 * 4  # SmolLM2: 3 key/value heads of 64
    assert (
        resume.saved_bytes(30, 4, 20, 576, 4, kv_width=192) == 31 * 4 * 20 * 576 * 4 + keys_values
    )
