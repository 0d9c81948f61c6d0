"""The engine profile's stack buckets, and a smoke run on a tiny model."""

from __future__ import annotations

import json

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
    trace = "/x/graft/core/trace.py"
    donor = [(TORCH_LINEAR, "forward", 1), (trace, "_graft_module", 5)]
    assert profile_engine.bucket(donor) == "donor module calls"
    gather = [(trace, "_take", 1), (trace, "_graft_module", 5), (trace, "graft_trace_body", 9)]
    assert profile_engine.bucket(gather) == "gather / scatter / clone in trace body"
    own = [(TORCH_LINEAR, "forward", 1), (trace, "_graft_module", 6)]
    assert profile_engine.bucket(own) == "base forward compute"


def test_buckets_know_the_shared_gather(monkeypatch):
    lines = {7: "donor_out = module(_take_once(gathered, x_all, rows, cells, patch.seq_dim))"}
    monkeypatch.setattr(profile_engine.linecache, "getline", lambda f, n: lines[n])
    trace = "/x/graft/core/trace.py"
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
