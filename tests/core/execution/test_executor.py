"""The one execution loop and its executors: what run_grafts hands an executor, what it
does with the results, and the one place that decides whether only the last position's
logits are computed."""

from __future__ import annotations

import pytest
import torch

import graft.core.execution.trace as trace
from graft.core.execution.engine import LocalExecutor, run_grafts
from graft.core.planning.carrier import BASE
from graft.core.planning.plan import GraftRow
from graft.errors import GraftError, RemoteError, SpecError
from graft.models.tiny import perturbed_copy, tiny_model
from graft.remote.config import RemoteConfig
from graft.remote.executor import RemoteExecutor
from tests.engine_cases import random_rows

TOL = 1e-5


@pytest.fixture(scope="module")
def llama():
    base = tiny_model("llama", seed=0)
    return base, perturbed_copy(base, seed=1)


def rows_of(specs, lengths=(9, 4, 7, 5, 11)) -> list[GraftRow]:
    return random_rows(specs, lengths)


class Recording(LocalExecutor):
    """A local executor that keeps the plans it was given."""

    def __init__(self) -> None:
        self.plans = []

    def run(self, base, donors, plans):
        for plan in plans:
            self.plans.append(plan)
            yield self.run_plan(base, donors, plan)


def test_the_engine_plans_sorted_batches_and_restores_input_order(llama):
    base, donor = llama
    rows = rows_of(["FE:all:all", "none"])
    executor = Recording()
    out = run_grafts(base, donor, rows, batch_size=4, executor=executor)
    assert [p.input_ids.shape[0] for p in executor.plans] == [4, 4, 2]
    widths = [p.input_ids.shape[1] for p in executor.plans]
    assert widths == sorted(widths)  # rows of similar length batched together
    for i, row in enumerate(rows):  # each result is its own row's, whatever its batch
        alone = run_grafts(base, donor, [row])
        assert (out[i] - alone[0]).abs().max() <= TOL


def test_a_donor_that_is_the_base_reaches_no_executor(llama):
    base, donor = llama
    executor = Recording()
    run_grafts(
        base,
        {"sft": base, "task": donor},
        rows_of(["FE:all:all; LT:all:all@task"]),
        executor=executor,
    )
    donors = {p.donor for plan in executor.plans for p in plan.patches}
    # 'sft' never: its cells are the base's own. The LT step runs on 'task' (it computes the
    # whole last token), with only the base's head grafted back, under the base's own name
    assert donors == {BASE} and {plan.step_model for plan in executor.plans} == {"task"}


@pytest.mark.parametrize("mode", ["local", "simulate"])
def test_whether_logits_to_keep_is_used_is_decided_in_one_place(llama, monkeypatch, mode):
    base, donor = llama
    rows = rows_of(["FE:all:all", "LT:all:o"])

    def run():
        executor = RemoteExecutor(RemoteConfig(mode="simulate")) if mode == "simulate" else None
        return run_grafts(base, donor, rows, batch_size=4, executor=executor)

    seen = []
    original = trace.trace_batch

    def spy(plan, model, device):
        batch = original(plan, model, device)
        seen.append("logits_to_keep" in batch.inputs)
        return batch

    monkeypatch.setattr("graft.core.execution.executor.trace_batch", spy)
    monkeypatch.setattr("graft.remote.executor.trace_batch", spy)
    with_keep = run()
    assert seen and all(seen)
    seen.clear()
    monkeypatch.setattr(trace, "accepts_logits_to_keep", lambda model: False)
    without = run()
    assert seen and not any(seen)  # every position's logits, then the last one picked
    assert (with_keep - without).abs().max() <= TOL


def test_donor_names_alone_are_refused_where_their_weights_are_needed(llama):
    base, _ = llama
    plain = run_grafts(base, ["sft"], rows_of(["none"]))  # nothing grafted: no weights needed
    assert torch.equal(plain, run_grafts(base, {}, rows_of(["none"])))
    with pytest.raises(SpecError, match="donor 'sft' but its weights were not given"):
        run_grafts(base, ["sft"], rows_of(["LT:all:all"]))
    with pytest.raises(RemoteError, match="ship mode sends donor 'sft'"):
        simulate = RemoteExecutor(RemoteConfig(mode="simulate"))
        run_grafts(base, {"sft": None}, rows_of(["LT:all:all"]), executor=simulate)


def test_bad_donors_and_a_remote_executor_for_a_local_run_are_one_line_errors(llama):
    base, _ = llama
    with pytest.raises(GraftError, match="donors must be a model, a {name: model} mapping"):
        run_grafts(base, 3, rows_of(["none"]))
    with pytest.raises(RemoteError, match="needs mode 'remote' or 'simulate'") as info:
        RemoteExecutor(RemoteConfig(mode="local"))
    assert info.value.kind == "config"
