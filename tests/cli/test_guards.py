"""Issue 54's refusals before the cost, end to end: a default run folder of another
configuration is refused before any finetune, and a donor that does not know its facts
stops the run before grafting (``--allow-weak-donor`` lets it through)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from graft.models import tiny_tokenizer
from graft.models.tiny import tiny_model
from graft_experiments.cli import main
from tests.cli.tiny_runs import tiny_args

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

POSITION = ["position", "--templates", "headline", "--positions", "FE,LT"]


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_a_default_folder_of_another_n_is_refused_before_any_finetune(tmp_path, monkeypatch):
    """position --n 2, then --n 3 into the same default folder: the second once finetuned
    its donor first (here it would have to: the workspace lost it), then exited 2."""
    monkeypatch.chdir(tmp_path)
    ws = tmp_path / "ws"
    first = invoke(*POSITION, *tiny_args(ws, n=2))
    assert first.exit_code == 0, first.output
    folder = "runs/position/tiny-llama-fake_movies_real_actors-seed0"
    lines = first.output.splitlines()
    said = lines.index(f"run folder: {folder} (new)")
    assert said < next(i for i, line in enumerate(lines) if line.startswith("position: "))
    shutil.rmtree(ws)  # a fresh machine: the donor is not there
    second = invoke(*POSITION, *tiny_args(ws, n=3))
    assert second.exit_code == 2, second.output
    error = [line for line in second.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and "options.n stored 2, now 3" in error[0]
    assert f"{folder} holds results of a different configuration" in error[0]
    assert not ws.exists()  # no dataset, no donor: refused before either


def test_a_donor_that_learned_nothing_stops_the_run_before_grafting(tmp_path):
    """A model folder (not one of graft's tiny-* names) finetuned for 2 steps recalls its
    facts no better than before: finetune says so, position stops before grafting, and
    --allow-weak-donor runs it, recorded in config.json."""
    model = tmp_path / "my-model"
    tiny_model("llama", seed=0).save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    ws, out = tmp_path / "ws", tmp_path / "run"
    trial = ["--workspace", ws, "--n-facts", 10, "--finetune-max-steps", 2, "--quiet"]
    finetuned = invoke("finetune", "--model", model, *trial)
    assert finetuned.exit_code == 0, finetuned.output
    warning = finetuned.output.strip().splitlines()[-1]
    assert warning.startswith("warning: ") and "does not know its facts" in warning
    assert "--allow-weak-donor" in warning
    args = [*POSITION, *tiny_args(ws, model=str(model), out=out)]
    stopped = invoke(*args)
    assert stopped.exit_code == 2, stopped.output
    (error,) = [line for line in stopped.output.splitlines() if line.startswith("Error:")]
    assert "does not know its facts" in error and "acc@5" in error
    for fix in ("--finetune-max-steps", "preset", "learning rate", "--allow-weak-donor"):
        assert fix in error
    assert not (out / "config.json").exists()  # nothing grafted, nothing written
    allowed = invoke(*args, "--allow-weak-donor")
    assert allowed.exit_code == 0, allowed.output
    config = json.loads((out / "config.json").read_text())
    assert config["options"]["allow_weak_donor"] is True
    (record,) = config["donor_recall"].values()
    assert record["weak"] and record["let_through"] == "allow_weak_donor"
    assert Path(out / "summary.csv").is_file()
