"""Grafted batches' logits computed by the engine from the head's inputs
(graft.core.execution.head): the same numbers bit for bit as the model's own head, and only where
that holds."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import graft.core.execution.executor as executor
import graft.core.execution.head as head
from graft.core.execution.engine import (
    GraftRow,
    LocalExecutor,
    engine_path,
    run_grafts,
    score_grafts,
)
from graft.core.execution.head import DeferredLogits, HeadProducts, deferrable_head
from graft.core.language.spec import parse_spec
from graft.errors import SlowPathWarning
from graft.models.tiny import TINY_FAMILIES, perturbed_copy, tiny_model
from tests.fast_tier import slow_except

pytestmark = pytest.mark.usefixtures("one_thread")

SPECS = ["none", "LT:all:all", "FE+LT:all:all", "LT:all:o,ffn", "FE:all:attn", "LT^C:all:all"]


def _rows() -> list[GraftRow]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for n in (5, 8, 11):
        ids = [1] + torch.randint(3, 96, (n - 1,), generator=g).tolist()
        rows += [GraftRow(ids, {"FE": [1, 2]}, parse_spec(s)) for s in SPECS]
    return rows


@pytest.fixture
def counted(monkeypatch):
    """How many batches had their logits computed from the head's inputs."""
    calls = []
    original = HeadProducts.__call__

    def call(self, deferred):
        calls.append(deferred.hidden.shape[0])
        return original(self, deferred)

    monkeypatch.setattr(HeadProducts, "__call__", call)
    return calls


@pytest.fixture
def fresh_record(monkeypatch):
    """An empty record of model classes seen to change their head's output."""
    monkeypatch.setattr(head, "_changed", set())


def _per_batch(monkeypatch, *args, **kwargs) -> torch.Tensor:
    """``run_grafts`` with every batch's logits made by the model's own head."""
    with monkeypatch.context() as m:
        m.setattr(executor, "deferrable_head", lambda model: None)
        return run_grafts(*args, **kwargs)


@pytest.mark.parametrize("family", slow_except(TINY_FAMILIES, "llama", "gemma2"))
def test_logits_from_the_heads_inputs_equal_the_models_own_bit_for_bit(
    family, counted, monkeypatch
):
    base = tiny_model(family, seed=0)
    donors = {"sft": perturbed_copy(base, seed=1)}
    rows = _rows()
    out = run_grafts(base, donors, rows, batch_size=4)
    own = _per_batch(monkeypatch, base, donors, rows, batch_size=4)
    assert torch.equal(out, own)
    if family == "gemma2":  # soft-capped logits: never computed from the head's inputs
        assert deferrable_head(base) is None and not counted
    else:
        assert deferrable_head(base) is base.get_output_embeddings()
        assert counted and sum(counted) < len(rows)  # "none" rows keep the plain forward


def test_what_keeps_the_models_own_head(counted):
    base = tiny_model("llama", seed=0)
    donors = {"sft": perturbed_copy(base, seed=1)}
    rows = _rows()
    score_grafts(base, donors, rows, [5] * len(rows), batch_size=4)  # metrics
    run_grafts(base, donors, rows, batch_size=4, padding_side="right")  # every position
    run_grafts(base, donors, rows, batch_size=4, executor=LocalExecutor(hooks=False))
    grafted_head = [
        GraftRow(r.input_ids, r.spans, parse_spec("LT:all:all; head=donor")) for r in rows
    ]
    run_grafts(base, donors, grafted_head, batch_size=4)
    assert not counted
    assert deferrable_head(copy.deepcopy(base).to(torch.bfloat16)) is None
    assert deferrable_head(torch.nn.Linear(2, 2)) is None  # not a causal LM


def test_the_executor_yields_logits_outside_the_engines_block():
    base = tiny_model("llama", seed=0)
    donors = {"sft": perturbed_copy(base, seed=1)}
    runs = []

    class Recording(LocalExecutor):
        def run(self, base, donors, plans):
            for plan in plans:
                runs.append((base, donors, plan))
                yield self.run_plan(base, donors, plan)

    row = _rows()[0]
    run_grafts(
        base,
        donors,
        [GraftRow(row.input_ids, row.spans, parse_spec("LT:q4:o"))],
        executor=Recording(),
    )
    (args,) = runs
    local = LocalExecutor()
    assert isinstance(local.run_plan(*args), torch.Tensor)
    with local.deferring_head():
        deferred = local.run_plan(*args)
    runner = args[0] if args[2].step_model is None else args[1][args[2].step_model]
    assert isinstance(deferred, DeferredLogits) and deferred.head is runner.lm_head
    assert isinstance(local.run_plan(*args), torch.Tensor)  # the flag put back
    assert torch.equal(HeadProducts()(deferred), local.run_plan(*args))


def test_a_model_that_changes_its_heads_output_is_found_and_warned_once(
    counted, monkeypatch, fresh_record
):
    base = copy.deepcopy(tiny_model("llama", seed=0))

    class Doubled(type(base)):
        def forward(self, input_ids=None, cache=None, logits_to_keep=0, **kwargs):
            out = super().forward(
                input_ids=input_ids,
                cache=cache,
                logits_to_keep=logits_to_keep,
                **kwargs,
            )
            out.logits = out.logits * 2  # after the head: not head(hidden)
            return out

    base.__class__ = Doubled
    donors = {"sft": perturbed_copy(tiny_model("llama", seed=0), seed=1)}
    rows = _rows()
    assert deferrable_head(base) is not None  # nothing in its config says so
    with pytest.warns(SlowPathWarning, match="changes its head's output"):
        out = run_grafts(base, donors, rows, batch_size=4)
    assert torch.equal(out, _per_batch(monkeypatch, base, donors, rows, batch_size=4))
    assert deferrable_head(base) is None and not counted
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        run_grafts(base, donors, rows, batch_size=4)


def test_the_run_record_says_where_logits_are_made():
    base = tiny_model("llama", seed=0)
    assert engine_path(base)["logits_after_batches"] is True
    assert engine_path(base, shortcuts=False)["logits_after_batches"] is False
    assert engine_path(base, remote=True)["logits_after_batches"] is False
    assert engine_path(tiny_model("gemma2", seed=0))["logits_after_batches"] is False


def _kept_llama():
    base = tiny_model("llama", seed=0)
    return base, {"sft": perturbed_copy(base, seed=1)}


def test_the_heads_buffer_is_kept_across_calls_and_given_back(counted):
    base, donors = _kept_llama()
    rows = _rows()
    first = run_grafts(base, donors, rows, batch_size=4)
    kept = head._kept[base.lm_head]
    pointer = kept.data_ptr()
    second = run_grafts(base, donors, rows, batch_size=4)
    assert counted and torch.equal(first, second)
    assert head._kept[base.lm_head].data_ptr() == pointer  # the same buffer, not a fresh one
    assert not head._lock_of(base.lm_head).locked()  # given back at the end of the call
    head.release_buffers()
    assert base.lm_head not in head._kept


def test_while_another_call_holds_the_buffer_a_call_uses_its_own(counted):
    base, donors = _kept_llama()
    rows = _rows()
    expected = run_grafts(base, donors, rows, batch_size=4)
    kept = head._kept[base.lm_head]
    kept.fill_(float("nan"))  # what the holder would have written
    lock = head._lock_of(base.lm_head)
    assert lock.acquire(blocking=False)
    try:
        assert torch.equal(run_grafts(base, donors, rows, batch_size=4), expected)
    finally:
        lock.release()
    assert counted and kept.isnan().all()  # untouched by the second call


def test_the_kept_buffer_goes_with_its_model():
    import gc

    base, donors = _kept_llama()
    run_grafts(base, donors, _rows(), batch_size=4)
    heads = len(head._kept)
    assert base.lm_head in head._kept
    del base, donors
    gc.collect()
    assert len(head._kept) == heads - 1


def test_a_buffer_larger_than_the_cap_is_not_kept(counted, monkeypatch):
    base, donors = _kept_llama()
    rows = _rows()
    expected = run_grafts(base, donors, rows, batch_size=4)
    head.release_buffers()
    monkeypatch.setattr(head, "KEEP_MAX_BYTES", 0)
    assert torch.equal(run_grafts(base, donors, rows, batch_size=4), expected)
    assert counted and base.lm_head not in head._kept
