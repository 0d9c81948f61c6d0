"""A remote run's plan (graft.study.planning.remote_plan) against what the remote executor
then sends: its requests, rows and donor weights, split between layers or not; and the
model key the run would derive."""

from __future__ import annotations

import dataclasses

import pytest

from graft.core import parse_spec
from graft.models.tiny import tiny_config as tiny_model_config
from graft.models.tiny import tiny_model
from graft.remote.config import RemoteConfig, hf_model_key
from graft.remote.executor import RemoteExecutor
from graft.remote.payload import estimate_payload_bytes
from graft.study import RunRequest
from graft.study.planning.remote_plan import BatchShape, RemotePlan, plan_remote, planned_model_key
from graft.study.planning.run_plan import plan_experiment
from graft.study.running.runner import ModelSource, run_experiment
from graft.study.specs.grafts import NamedGraft, reference
from tests.study.tiny_run import REFERENCES, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

GRAFTS = [
    *REFERENCES,
    NamedGraft("LT q4", parse_spec("LT:q4:o,ffn@sft")),
    NamedGraft("FE attn", parse_spec("FE:all:attn@sft")),
]


@pytest.mark.slow  # a tiny run through nnsight's serialisation
@pytest.mark.parametrize("max_payload_mb", [448.0, 0.15])
def test_the_plan_is_what_the_executor_sends(tmp_path, dataset, donor_path, max_payload_mb):
    """Every request, its rows and its donor weights as planned, with batches under the
    limit (one request each) and over it (split between layers)."""
    cfg = tiny_config(
        tmp_path / "run", dataset=str(dataset), templates=("headline", "qa"), batch_size=3
    )
    donors = {"sft": ModelSource(path=donor_path)}

    def request(mode: str, executor=None) -> RunRequest:
        remote = RemoteConfig(mode=mode, model_key="k", max_payload_mb=max_payload_mb)
        specs = dataclasses.replace(cfg, remote=remote)
        return RunRequest(specs=specs, grafts=GRAFTS, donors=donors, executor=executor)

    plan = plan_experiment(request("remote"))
    assert plan.grafting is None and plan.remote is not None
    executor = RemoteExecutor(RemoteConfig(mode="simulate", max_payload_mb=max_payload_mb))
    run_experiment(request("simulate", executor), echo=lambda _: None)
    sent = executor.sent
    remote = plan.remote
    assert remote.exact and remote.refused is None
    assert remote.requests == len(sent) and remote.rows == plan.rows
    assert remote.batches == plan.batches == sum(s.block is None or "head" in s.block for s in sent)
    assert remote.payload_total == sum(s.payload for s in sent) > 0
    assert remote.payload_max == max(s.payload for s in sent)
    assert remote.split == sum(s.block is not None and "head" in s.block for s in sent)
    assert (remote.split > 0) == (max_payload_mb < 1)
    text = "\n".join(plan.lines())
    assert "no grafting pass runs here" in text and "model key: k" in text


def test_the_model_key_is_derived_as_the_run_derives_it():
    ship = RemoteConfig(mode="remote")
    assert planned_model_key(ship, "org/model", "x") == (hf_model_key("org/model"), None)
    key, problem = planned_model_key(ship, None, "the folder /m")
    assert key is None and "the folder /m" in problem and "set model_key" in problem
    hosted = RemoteConfig(mode="remote", donor_mode="hosted", hosted_donors={"sft": "/s"})
    key, _ = planned_model_key(hosted, "org/model", "x")
    assert key.startswith("graft.remote.hosted.GraftPairModel:") and '"/s"' in key
    bare = RemoteConfig(mode="remote", donor_mode="hosted")
    assert "hosted_donors" in planned_model_key(bare, "org/model", "x")[1]
    given = RemoteConfig(mode="remote", model_key="mine")
    assert planned_model_key(given, None, "x") == ("mine", None)


def _plan(**remote) -> RemotePlan:
    grafts = [reference("SFT", "sft")]
    batches = [BatchShape(4, frozenset({0}), 10), BatchShape(2, frozenset({0}), 6)]
    config = RemoteConfig(mode="remote", **remote)
    return plan_remote(
        config, tiny_model_config("llama"), "float32", grafts, batches, 10, ("k", None)
    )


def test_hosted_mode_sends_no_weights_and_ship_mode_the_donor():
    whole = estimate_payload_bytes(tiny_model("llama"), reference("SFT", "sft").spec)
    ship, hosted = _plan(), _plan(donor_mode="hosted")
    assert (ship.requests, ship.payload_max, ship.payload_total) == (2, whole, 2 * whole)
    assert (hosted.requests, hosted.payload_max, hosted.payload_total) == (2, 0, 0)
    assert hosted.other_total == ship.other_total > 2 * 64 * 1024  # the trace, twice
    assert any("no weights" in line for line in hosted.lines())


def test_a_batch_that_cannot_be_split_shows_the_runs_refusal():
    plan = _plan(max_payload_mb=0.08)  # over the trace and residual, under the embedding
    assert plan.refused and "alone is" in plan.refused and "max_payload_mb" in plan.refused
    assert any(line.startswith("  refused before sending: ") for line in plan.lines())
    assert "no room for donor weights" in _plan(max_payload_mb=0.01).refused
