"""Shared prefix + single-token step gives the plain forward's last-token logits."""

from __future__ import annotations

import pytest

from benchmarks.prefix_floor import main, prefix_and_step
from benchmarks.workload import graft_rows, headline_prompts, plain_forward


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_prefix_and_step_equals_plain_forward(tiny_pairs, family):
    from graft.models import tiny_tokenizer

    base, _ = tiny_pairs(family)
    prompts = headline_prompts(tiny_tokenizer(), 5, 64)
    assert len({len(p.input_ids) for p in prompts}) > 1  # left padding is exercised
    rows = graft_rows(prompts, {"a": "none", "b": "none", "c": "none"})
    plain = plain_forward(base, rows, 4, 0)
    shared = prefix_and_step(base, prompts, 3, 2, 0)
    assert plain.abs().max() > 0.1
    assert (plain - shared).abs().max() <= 1e-5


def test_cli_smoke(tmp_path, capsys):
    out = tmp_path / "floor.json"
    argv = ["--model", "tiny-llama", "--prompts", "4", "--batch-size", "8", "--repeats", "1"]
    assert main([*argv, "--group", "2", "--json", str(out)]) == 0
    assert "prefix + step" in capsys.readouterr().out
    assert out.exists()
