"""The engine profile's stack buckets, and a smoke run on a tiny model."""

from __future__ import annotations

import json

import pytest

from benchmarks import profile_engine

ENGINE = "/x/graft/engine.py"
TORCH_LINEAR = "/x/torch/nn/modules/linear.py"


def test_buckets_tell_donor_calls_from_base_compute_and_planning(monkeypatch):
    monkeypatch.setattr(profile_engine.linecache, "getline", lambda f, n: "out = module(x[rows])")
    donor = [(TORCH_LINEAR, "forward", 1), (ENGINE, "graft_trace_body", 5)]
    assert profile_engine.bucket(donor) == "donor module calls"
    assert profile_engine.bucket(donor[1:]) == "gather / scatter / clone in trace body"
    base = [(TORCH_LINEAR, "forward", 1), ("/x/nnsight/envoy.py", "f", 2), (ENGINE, "run_plan", 3)]
    assert profile_engine.bucket(base) == "base forward compute"
    plan = [(ENGINE, "mark", 1), (ENGINE, "plan_batch", 2), (ENGINE, "run_grafts", 3)]
    assert profile_engine.bucket(plan) == "planning (spec resolution, masks, checks)"


def test_buckets_follow_the_trace_body_into_its_module_helper(monkeypatch):
    lines = {5: "donor_out = module(_take(x, rows, cells))", 6: "kept = type(module).forward("}
    monkeypatch.setattr(profile_engine.linecache, "getline", lambda f, n: lines[n])
    trace = "/x/graft/core/execution/trace.py"
    donor = [(TORCH_LINEAR, "forward", 1), (trace, "_graft_module", 5)]
    assert profile_engine.bucket(donor) == "donor module calls"
    gather = [(trace, "_take", 1), (trace, "_graft_module", 5), (trace, "graft_trace_body", 9)]
    assert profile_engine.bucket(gather) == "gather / scatter / clone in trace body"
    own = [(TORCH_LINEAR, "forward", 1), (trace, "_graft_module", 6)]
    assert profile_engine.bucket(own) == "base forward compute"


def test_buckets_know_the_shared_gather(monkeypatch):
    lines = {7: "donor_out = module(_take_once(gathered, x_all, rows, cells, patch.seq_dim))"}
    monkeypatch.setattr(profile_engine.linecache, "getline", lambda f, n: lines[n])
    trace = "/x/graft/core/execution/trace.py"
    donor = [
        (TORCH_LINEAR, "forward", 1),
        ("/x/nnsight/envoy.py", "f", 2),
        (trace, "_graft_module", 7),
    ]
    assert profile_engine.bucket(donor) == "donor module calls"
    gather = [(trace, "_take_once", 1), (trace, "_graft_module", 7)]
    assert profile_engine.bucket(gather) == "gather / scatter / clone in trace body"


def test_smoke_run(tmp_path, capsys):
    out = tmp_path / "profile.json"
    argv = ["--model", "tiny-llama", "--prompts", "2", "--batch-size", "8", "--no-e3"]
    assert profile_engine.main([*argv, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["profile"]["samples"] > 0
    assert abs(sum(data["profile"]["buckets"].values()) - 1) < 1e-9
    assert set(data["per_graft"]) == set(profile_engine.E1_GRAFTS)
    assert "engine time by kind of work" in capsys.readouterr().out


def test_buckets_count_routing_and_step_plans_as_planning():
    for func in ("checked_inputs", "route_rows", "prefix_plans"):
        stack = [(ENGINE, "helper", 1), (ENGINE, func, 2), (ENGINE, "run_grafts", 3)]
        assert profile_engine.bucket(stack) == "planning (spec resolution, masks, checks)"


def test_plan_only_executor_plans_every_row_and_runs_nothing():
    """run_grafts with PlanOnly returns one zero per row, in order: every batch was planned
    (routing, steps and traced batches alike) and no model ran."""
    from graft.core import run_grafts

    _, w = profile_engine.build_workload("tiny-llama", 3, 8)
    calls = []
    for model in (w.base, *w.donors.values()):
        model.register_forward_hook(lambda *a: calls.append(1))
    for rows in (w.e1, w.e3):
        out = run_grafts(w.base, w.donors, rows, batch_size=8, executor=profile_engine.PlanOnly())
        assert out.shape == (len(rows), 1) and not out.any()
    assert calls == []
    timing = profile_engine.planning_alone(w, w.e3, repeats=2)
    assert timing["planning_s"] > 0 and timing["share"] == timing["planning_s"] / timing["engine_s"]


@pytest.mark.slow
def test_smoke_run_on_the_host_bound_proxy(tmp_path, capsys):
    import torch

    threads = torch.get_num_threads()
    out = tmp_path / "profile.json"
    argv = ["--proxy", "llama3.2-1b:1", "--prompts", "2", "--batch-size", "8", "--no-e3"]
    argv += ["--plan-repeats", "1"]
    try:
        assert profile_engine.main([*argv, "--json", str(out)]) == 0
        assert torch.get_num_threads() == 1  # one host thread by default with --proxy
    finally:
        torch.set_num_threads(threads)
    data = json.loads(out.read_text())
    assert data["model"] == "proxy llama3.2-1b:1 x d 64"
    assert set(data["planning_alone"]) == {"e1"}
    assert "planning timed alone" in capsys.readouterr().out


@pytest.mark.parametrize(
    "bad",
    [
        ["--proxy", "llama3.2-1b"],
        ["--proxy", "gpt5:2"],
        ["--proxy", "gpt2-xl:2", "--width", "60"],
        ["--plan-repeats", "0"],
        ["--threads", "0"],
    ],
)
def test_bad_input_exits_2(bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        profile_engine.main(bad)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err
