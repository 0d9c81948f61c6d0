"""graft.study.training.recall: a finetuned model that does not know its facts stops a run
before grafting (issue 54: a donor at PRE's level was grafted from, bars of 0.00), unless
the run allows weak donors; graft's tiny random models are said and let through."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from graft.errors import ExperimentError
from graft.results.folder import MARKER_FILE
from graft.study.running.runner import RunRequest, run_experiment
from graft.study.specs.config import ModelSource
from graft.study.training.donors import write_checksums
from graft.study.training.recall import (
    MIN_GAIN,
    check_recall,
    model_recall,
    trained_model_lines,
    training_line,
)
from tests.study.tiny_run import REFERENCES, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def _stats(top5: float, n: int = 30) -> dict:
    return {"overall": {"n": n, "top5": top5}, "per_template": {}}


def write_eval(
    folder: Path,
    sft: dict[str, float],
    pre: dict[str, float],
    direction: str = "one",
    source: str = "local",
) -> Path:
    """A finetune's records in ``folder``: eval.json with these overall acc@5 per test
    direction, the dataset's direction and the base model's source."""
    folder.mkdir(parents=True, exist_ok=True)
    evaluation = {
        "sft": {d: _stats(v) for d, v in sft.items()},
        "pre": {d: _stats(v) for d, v in pre.items()},
    }
    (folder / "eval.json").write_text(json.dumps(evaluation))
    (folder / "data_manifest.json").write_text(json.dumps({"direction": direction}))
    record = {"model": {"name": "m", "source": source}}
    (folder / "finetune_config.json").write_text(json.dumps(record))
    return folder


GOOD = {"forward": 0.86, "reverse": 0.02}
PRE = {"forward": 0.03, "reverse": 0.02}


def test_a_donor_that_knows_its_facts_passes(tmp_path):
    folder = write_eval(tmp_path / "good", GOOD, PRE)
    records = check_recall([str(folder)])
    assert records[str(folder)]["weak"] is False and records[str(folder)]["sft"] == 0.86
    # the reverse prompts were never trained on (direction one): not held against it
    assert records[str(folder)]["direction"] == "forward"


@pytest.mark.parametrize(
    ("sft", "weak"),
    [(0.03, True), (0.03 + MIN_GAIN - 0.01, True), (0.03 + MIN_GAIN, False)],
)
def test_the_threshold_is_min_gain_over_pre(tmp_path, sft, weak):
    folder = write_eval(tmp_path / "d", {"forward": sft}, {"forward": 0.03})
    recall = model_recall(folder)
    assert recall is not None and recall.weak is weak


def test_a_donor_at_pre_level_stops_with_the_numbers_and_the_fix(tmp_path):
    folder = write_eval(tmp_path / "weak", {"forward": 0.0}, {"forward": 0.0})
    with pytest.raises(ExperimentError) as info:
        check_recall([str(folder)])
    line = str(info.value)
    assert "\n" not in line and str(folder) in line and "does not know its facts" in line
    assert "acc@5 0.00 on its forward test prompts (n = 30)" in line
    assert f"at least {MIN_GAIN:.2f}" in line
    for fix in ("finetune_max_steps", "learning rate", "preset", "allow_weak_donor"):
        assert fix in line
    assert info.value.param == "allow_weak_donor"


def test_allowing_weak_donors_lets_one_through_and_says_why(tmp_path):
    folder = write_eval(tmp_path / "weak", {"forward": 0.0}, {"forward": 0.0})
    record = check_recall([str(folder)], allow_weak=True)[str(folder)]
    assert record["weak"] is True and record["let_through"] == "allow_weak_donor"


def test_a_tiny_random_model_is_let_through_and_marked(tmp_path):
    folder = write_eval(tmp_path / "tiny", {"forward": 0.0}, {"forward": 0.0}, source="tiny")
    assert check_recall([str(folder)])[str(folder)]["let_through"] == "tiny model"


def test_a_both_direction_donor_must_know_both(tmp_path):
    folder = write_eval(tmp_path / "both", GOOD, PRE, direction="both")
    recall = model_recall(folder)
    assert recall is not None and recall.direction == "reverse" and recall.weak
    good = write_eval(tmp_path / "good", {"forward": 0.9, "reverse": 0.7}, PRE, "both")
    assert not check_recall([str(good)])[str(good)]["weak"]


def test_finetune_ends_with_the_recall_a_weak_model_as_a_warning_with_the_fix(tmp_path):
    good = write_eval(tmp_path / "good", GOOD, PRE)
    assert trained_model_lines(good) == [f"{good} knows its facts: " + model_recall(good).numbers()]
    weak = write_eval(tmp_path / "weak", {"forward": 0.0}, {"forward": 0.0})
    (line,) = trained_model_lines(weak)
    assert line.startswith(f"warning: {weak} does not know its facts")
    assert "--allow-weak-donor" in line and "--finetune-max-steps" in line
    assert trained_model_lines(tmp_path) == []  # no records: nothing to say


def test_a_folder_without_an_evaluation_is_not_checked(tmp_path, donor_path):
    assert model_recall(donor_path) is None
    assert check_recall([donor_path, "tiny-llama"]) == {}


# ----------------------------------------------------------------- through the runner


def donor_with_eval(donor_path: str, folder: Path, sft: float) -> str:
    """A copy of the donor folder with a finetune's records (acc@5 ``sft`` against PRE's
    0.02 on the forward prompts) and its checksums written last, as a finetune does."""
    shutil.copytree(donor_path, folder)
    (folder / "accepted.json").unlink()
    write_eval(folder, {"forward": sft, "reverse": 0.0}, {"forward": 0.02, "reverse": 0.0})
    write_checksums(folder)
    return str(folder)


def _run(dataset, out: Path, donor: str, **options):
    cfg = tiny_config(out, dataset=str(dataset), **options)
    request = RunRequest(specs=cfg, grafts=REFERENCES, donors={"sft": ModelSource(path=donor)})
    return run_experiment(request, echo=lambda _: None)


def test_the_runner_stops_before_grafting_from_a_weak_donor(dataset, donor_path, tmp_path):
    weak = donor_with_eval(donor_path, tmp_path / "weak", sft=0.02)
    out = tmp_path / "run"
    with pytest.raises(ExperimentError, match="does not know its facts"):
        _run(dataset, out, weak)
    assert not (out / MARKER_FILE).exists() and not (out / "parts").exists()
    # the flag lets it through, and config.json records both
    run = _run(dataset, out, weak, allow_weak_donor=True)
    config = json.loads((out / "config.json").read_text())
    assert config["options"]["allow_weak_donor"] is True
    assert config["donor_recall"][weak]["let_through"] == "allow_weak_donor"
    assert run.examples.height > 0


def test_the_runner_grafts_from_a_donor_that_knows_its_facts(dataset, donor_path, tmp_path):
    good = donor_with_eval(donor_path, tmp_path / "good", sft=0.9)
    out = tmp_path / "run"
    _run(dataset, out, good)
    config = json.loads((out / "config.json").read_text())
    assert config["options"]["allow_weak_donor"] is False
    assert config["donor_recall"][good]["weak"] is False


def test_the_training_line_reads_the_trainers_log(tmp_path):
    assert training_line(tmp_path) is None  # no train_log.json: nothing to say
    log = {
        "global_step": 12,
        "best_val_loss": 0.5123,
        "best_checkpoint": "checkpoint-12",
        "log_history": [{"loss": 3.2, "step": 3}, {"eval_loss": 0.9}, {"loss": 0.41, "step": 12}],
    }
    (tmp_path / "train_log.json").write_text(json.dumps(log))
    line = training_line(tmp_path)
    assert line.startswith("trained 12 steps; training loss 3.200 -> 0.410; ")
    assert "best validation loss 0.512 (checkpoint-12)" in line
