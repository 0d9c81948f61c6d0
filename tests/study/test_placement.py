"""What a folder is, and where a run may write (issue 52): ``accept`` acts only on a run or a
model folder and says which; ``--out`` inside another run folder (its ``parts/``), a model or
a dataset folder, or at a workspace's root is refused before anything is written; a user
dataset's facts are checked before the first batch."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

import graft.study.running.batches as batches
from graft.errors import DatasetError, RunFolderError
from graft.results.folder import RunFolder
from graft.study.running.placement import (
    DATASET_FOLDER,
    MODEL_FOLDER,
    RUN_FOLDER,
    WORKSPACE,
    check_out_placement,
    folder_kind,
)
from graft_experiments.cli import main
from tests.study.test_runner import config, run

pytestmark = pytest.mark.usefixtures("one_thread")


def a_run(path, **config) -> RunFolder:
    folder = RunFolder(path)
    folder.write_config({"experiment": "custom", **config}, key=["experiment"])
    return folder


def an_older_run(path):
    """A run folder of a graft before the .graft-run marker: known by its config.json."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(
        json.dumps({"experiment": "position", "packages": {"graft": "0.1.0"}})
    )
    return path


def test_each_kind_of_folder_is_told_apart(tmp_path, dataset, donor_path):
    (tmp_path / "ws" / "datasets").mkdir(parents=True)
    (tmp_path / "plain").mkdir()
    assert folder_kind(a_run(tmp_path / "run").path) == RUN_FOLDER
    assert folder_kind(an_older_run(tmp_path / "old")) == RUN_FOLDER
    assert folder_kind(donor_path) == MODEL_FOLDER
    assert folder_kind(dataset) == DATASET_FOLDER
    assert folder_kind(tmp_path / "ws") == WORKSPACE
    assert folder_kind(tmp_path / "plain") is None
    assert folder_kind(tmp_path / "missing") is None


def test_out_inside_another_run_is_refused_but_a_sweeps_own_runs_are_not(tmp_path):
    outer = a_run(tmp_path / "sweep", runs=["restore-weights"]).path
    check_out_placement(outer)  # the run itself: resumed, not refused
    check_out_placement(outer / "restore-weights")  # listed in its config's runs
    check_out_placement(tmp_path / "elsewhere" / "run")
    for inside in (outer / "parts" / "examples", outer / "restore-other", outer / "a" / "b"):
        with pytest.raises(
            RunFolderError, match="inside the run folder .*sweep.*outside it"
        ) as info:
            check_out_placement(inside)
        assert "\n" not in str(info.value)


def test_out_in_a_model_a_dataset_or_a_workspace_root_is_refused(tmp_path, dataset, donor_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    cases = {
        dataset: "is a dataset folder",
        dataset / "sub": "inside the dataset folder",
        donor_path: "is a model folder",
        f"{donor_path}/runs/x": "inside the model folder",
        ws: "is a workspace",
    }
    for out, said in cases.items():
        with pytest.raises(RunFolderError, match=said):
            check_out_placement(out, workspace=ws)
    check_out_placement(ws / "runs" / "mine", workspace=ws)  # inside a workspace: fine


def test_a_run_inside_another_runs_parts_is_refused_before_anything_is_written(
    dataset, donor_path, tmp_path
):
    outer = a_run(tmp_path / "outer").path
    out = outer / "parts" / "mine"
    with pytest.raises(RunFolderError, match="inside the run folder"):
        run(config(dataset, out), donor_path)
    assert not out.exists()


def test_a_bad_facts_line_is_refused_before_the_first_batch(
    dataset, donor_path, tmp_path, monkeypatch
):
    """Read only by the top-1 kinds after every batch had run, before."""
    mine = tmp_path / "mine"
    shutil.copytree(dataset, mine)
    manifest = json.loads((mine / "manifest.json").read_text())
    manifest.pop("files")  # hand edits kept, as the dataset's own message says
    (mine / "manifest.json").write_text(json.dumps(manifest))
    lines = (mine / "facts.jsonl").read_text().splitlines()
    fact = json.loads(lines[1])
    fact.pop("second_actor")
    lines[1] = json.dumps(fact)
    (mine / "facts.jsonl").write_text("\n".join(lines) + "\n")
    calls: list[int] = []
    original = batches._row_metrics
    monkeypatch.setattr(batches, "_row_metrics", lambda *a: calls.append(1) or original(*a))
    out = tmp_path / "run"
    with pytest.raises(
        DatasetError, match=r"facts\.jsonl line 2 is no fact: it lacks second_actor"
    ):
        run(config(mine, out), donor_path)
    assert calls == [] and not out.exists()


def test_accept_says_what_a_folder_is_and_acts_only_on_runs_and_models(tmp_path, dataset):
    old = an_older_run(tmp_path / "old")
    result = CliRunner().invoke(main, ["accept", str(old), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "is a run folder" in result.output
    assert (old / ".graft-run").is_file() and not (old / "checksums.json").exists()
    before = sorted(p.name for p in dataset.iterdir())
    result = CliRunner().invoke(main, ["accept", str(dataset)])
    assert result.exit_code == 2 and "is a dataset folder: accept takes" in result.output
    assert sorted(p.name for p in dataset.iterdir()) == before
