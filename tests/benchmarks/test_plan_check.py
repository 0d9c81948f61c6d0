"""benchmarks.plan_check runs (on a tiny model) and reports measured against planned peaks."""

from __future__ import annotations

import json

import pytest

from benchmarks import plan_check


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--steps", "2", "--batch-size", "2", "--seq-len", "8"],
        ["train", "--steps", "1", "--batch-size", "2", "--seq-len", "8", "--precision", "bfloat16"],
        ["forward", "--batch-size", "4", "--seq-len", "8", "--donors", "2"],
    ],
)
def test_plan_check_reports_measured_and_planned(args, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert plan_check.main([*args, "--model", "tiny-llama", "--json", str(out)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"{args[0]} tiny-llama: measured ") and "measured/plan" in line
    (result,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert result["plan"]["peak_bytes"] > 0 and result["measured_peak_bytes"] >= 0
    assert result["command"].startswith("python -m benchmarks.plan_check " + args[0])
    if args[0] == "train" and "--precision" not in args:
        # float32: the activations the step saved, counted as the plan traces them (without
        # a padding mask the CPU's fused attention keeps less at this tiny size in bfloat16)
        saved, planned = result["measured_saved_activation_bytes"], result["plan"]
        assert 0.85 * planned["activations_bytes"] <= saved <= 1.15 * planned["activations_bytes"]
