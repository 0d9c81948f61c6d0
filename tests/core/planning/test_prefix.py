"""Shared-prefix caches: a step's rows read their prompts' keys and values
(graft.core.planning.prefix)."""

from __future__ import annotations

import pytest
import torch

import graft.core.execution.engine as engine
import graft.core.execution.executor as executor
from graft.core.families.arch import architecture_of
from graft.core.planning.plan import resolve_rows
from graft.core.planning.prefix import prefix_plans, step_rows
from graft.models.tiny import TINY_FAMILIES, perturbed_copy, tiny_model
from tests.core.execution.test_engine_paths import SPECS, prompt_rows


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_every_family_steps_on_prompt_keys_without_copying_them(family, monkeypatch):
    base = tiny_model(family, seed=0)
    donors = {"sft": perturbed_copy(base, seed=1)}
    rows = prompt_rows(SPECS[:5])
    unshared = engine.run_grafts(base, donors, rows, batch_size=4, executor=_NoShortcuts())
    lazy = []
    original = executor.select_rows

    def spying(cache, index, below=None):
        selected = original(cache, index, below)
        lazy.append(all("update" in vars(layer) for layer in selected.layers))
        return selected

    monkeypatch.setattr(executor, "select_rows", spying)
    out = engine.run_grafts(base, donors, rows, batch_size=4)
    assert lazy and all(lazy), f"{family}: a step copied its rows' keys up front"
    assert (out - unshared).abs().max() <= 1e-5


class _NoShortcuts:
    def run(self, base, donors, plans):
        return engine.LocalExecutor(shortcuts=False).run(base, donors, plans)


@pytest.mark.parametrize(("batch", "most"), [(4, 16), (32, 128), (64, 128), (256, 256)])
def test_steps_hold_up_to_four_batches_of_rows_and_128_unless_a_batch_is_larger(batch, most):
    assert step_rows(batch) == most
    base = tiny_model("llama", seed=0)
    arch = architecture_of(base)
    specs = ["LT:all:all", "LT:all:o", "LT:all:ffn", "none"]
    rows = [r for seed in range(80) for r in prompt_rows(specs, lengths=(5,), seed=seed)]
    resolved = resolve_rows(arch, rows, {"sft": perturbed_copy(base, seed=1)})
    steps = prefix_plans(arch, rows, resolved, range(len(rows)), batch, pad_id=0)
    assert sum(len(idx) for idx, _ in steps) == len(rows)
    assert max(len(idx) for idx, _ in steps) == min(most, len(rows))
    assert max(len(plan.prefix.plan.input_ids) for _, plan in steps) <= most


def test_columns_from_is_a_window_of_the_newest_columns_over_the_whole_mask():
    from graft.core.planning.plan import GraftRow, plan_batch
    from graft.core.planning.prefix import columns_from

    base = tiny_model("llama")
    arch = architecture_of(base)
    rows = [
        GraftRow([1, 2, 3, 4, 5, 6], {"FE": [1]}, "FE+LT:all:all"),
        GraftRow([7, 8, 9, 10], {"FE": [1]}, "LT:0:mlp"),
    ]
    full = plan_batch(arch, rows, resolved=resolve_rows(arch, rows, ["sft"]))
    window = columns_from(full, 4)
    assert torch.equal(window.input_ids, full.input_ids[:, 4:])
    assert torch.equal(window.position_ids, full.position_ids[:, 4:])
    assert torch.equal(window.attention_mask, full.attention_mask)  # the cache's columns too
    assert window.last_index.tolist() == [1, 1] and window.keep_last_only
    # FE (column 1 of row 0, column 3 of row 1) is left out; LT (column 5) is kept
    assert window.patches and all(p.rows.shape == (2, 2) for p in window.patches)
    assert all(not p.rows[:, 0].any() and p.rows[:, 1].any() for p in window.patches)
    marked = sum(int(p.rows.sum()) for p in full.patches)
    assert sum(int(p.rows.sum()) for p in window.patches) < marked
