"""benchmarks.generate_speed: graft.generate against the plain model's generate, on a tiny
model (the command line, its lines and the check that grafting nothing is the plain model)."""

from __future__ import annotations

import re

import pytest

from benchmarks.generate_speed import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_cli_prints_each_time_its_ratio_and_the_plain_check(capsys):
    argv = ["--model", "tiny-llama", "--prompts", "3", "--new-tokens", "4"]
    assert main([*argv, "--grafts", "none|FE+LT:all:o,ffn", "--recompute", "LT:all:all"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"plain model\.generate \(cache\)\s+\d+\.\d+ s", out)
    for label in ("none", "FE+LT:all:o,ffn", "LT:all:all (recompute)"):
        assert re.search(
            rf"graft\.generate {re.escape(label)}\s+\d+\.\d+ s\s+ratio\s+\d+\.\d+", out
        )
    assert "'none' writes the plain model's tokens: True" in out


def test_bad_counts_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "tiny-llama", "--new-tokens", "0"])
    assert exit_info.value.code == 2
    assert "--new-tokens" in capsys.readouterr().err
