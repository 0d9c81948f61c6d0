"""Resumable run folders (graft.results.folder) and the files they are made of."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch

from graft.errors import ConfigMismatchError, GraftError
from graft.results.folder import MARKER_FILE, RunFolder, RunFolderError
from graft.results.provenance import git_commit, package_versions
from graft.storage.files import flat_table

ROOT = Path(__file__).resolve().parents[2]


def _head() -> str:
    """The checkout's commit, asked of git here (not through graft's helper)."""
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().strip()


BATCHES = {
    f"{i}": pl.DataFrame({"row": [2 * i, 2 * i + 1], "graft": ["(FE+LT)^C", "LT"]})
    for i in range(12)
}


def _run(folder: RunFolder, ids) -> None:
    for batch_id in ids:
        if batch_id not in folder.done_batches("examples"):
            folder.append_batch("examples", BATCHES[batch_id], batch_id)


def test_interrupted_run_resumes_to_the_same_table(tmp_path):
    clean = RunFolder(tmp_path / "clean")
    _run(clean, BATCHES)
    expected = clean.read("examples")
    assert expected["row"].to_list() == list(range(24))  # natural order: 2 before 10

    run = RunFolder(tmp_path / "resumed")
    _run(run, ["0", "1", "2", "3", "4"])
    # "Crash" while writing batch 5: a half-written temp file is left behind.
    part_dir = run.path / "parts" / "examples"
    (part_dir / ".5.parquet.999.deadbeef.tmp").write_bytes(b"PAR1 truncated")
    assert run.done_batches("examples") == {"0", "1", "2", "3", "4"}
    assert run.read("examples").height == 10

    resumed = RunFolder(tmp_path / "resumed")
    _run(resumed, BATCHES)  # skips the done batches
    resumed.append_batch("examples", BATCHES["3"], "3")  # rerunning a batch replaces it
    table = resumed.read("examples")
    assert table.equals(expected)
    assert table["row"].n_unique() == table.height

    final = resumed.finalize("examples")
    assert pl.read_parquet(final).equals(expected)
    assert not list(part_dir.glob("*.tmp"))


def test_batch_ids_with_odd_characters(tmp_path):
    run = RunFolder(tmp_path)
    ids = ["(FE+LT)^C:all:all/3", ".hidden", "a b"]
    for i, batch_id in enumerate(ids):
        run.append_batch("t", pl.DataFrame({"x": [i]}), batch_id)
    assert run.done_batches("t") == set(ids)
    assert sorted(run.read("t", batch_column="batch")["batch"].to_list()) == sorted(ids)
    with pytest.raises(GraftError, match="table name"):
        run.append_batch("../evil", pl.DataFrame({"x": [1]}), "0")


def test_read_missing_table_and_failed_write(tmp_path):
    run = RunFolder(tmp_path)
    assert run.read("nothing").is_empty()

    class Boom(pl.DataFrame):
        def write_parquet(self, *args, **kwargs):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        run.append_batch("t", Boom({"x": [1]}), "0")
    assert run.done_batches("t") == set()
    assert not list((tmp_path / "parts" / "t").iterdir())


def test_config_roundtrip_resume_and_mismatch(tmp_path):
    config = {
        "spec": ["FE:all:all", "LT:all:all"],
        "models": {"sft": {"revision": "abc"}},
        "seed": 0,
    }
    run = RunFolder(tmp_path)
    stored = run.write_config(config, key=["spec", "models.sft.revision", "seed"])
    on_disk = json.loads((tmp_path / "config.json").read_text())
    assert on_disk == stored
    assert set(on_disk["packages"]) >= {"torch", "transformers", "nnsight", "polars", "graft"}
    assert on_disk["git_commit"] == _head() and "created" in on_disk
    # what computed it: the checkout's state, the machine and the command line (the tests
    # run from a checkout, so its state is known)
    assert on_disk["git_dirty"] in (True, False)
    machine = on_disk["machine"]
    assert machine["torch_threads"] == torch.get_num_threads() and machine["cpu"]
    # this process's own command line (pytest's, or an xdist worker's ``-c``), program by name
    assert on_disk["command"] == shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])

    # Same key fields: resume; the original record is kept and the resume noted.
    again = run.write_config(config | {"note": "x"}, key=["spec", "models.sft.revision", "seed"])
    assert again["created"] == stored["created"]
    assert len(again["resumes"]) == 1

    changed = config | {"models": {"sft": {"revision": "def"}}}
    with pytest.raises(ConfigMismatchError, match=r"(?s)models\.sft\.revision.*--overwrite"):
        run.write_config(changed, key=["spec", "models.sft.revision", "seed"])
    # Default key: every non-volatile top-level field.
    with pytest.raises(ConfigMismatchError, match="seed"):
        run.write_config(config | {"seed": 1})


def test_overwrite_discards_old_results(tmp_path):
    run = RunFolder(tmp_path)
    run.write_config({"seed": 0})
    run.append_batch("examples", BATCHES["0"], "0")
    run.finalize("examples")
    run.write_summary(pl.DataFrame({"graft": ["LT"], "acc@5": [0.5]}))
    run.write_summary(pl.DataFrame({"graft_a": ["LT"], "mcnemar_p": [0.5]}), stem="contrasts")
    (tmp_path / "notes.txt").write_text("mine")
    run.write_config({"seed": 1}, overwrite=True)
    assert run.read_config()["seed"] == 1
    assert run.done_batches("examples") == set()
    assert not (tmp_path / "examples.parquet").exists()
    assert not (tmp_path / "summary.csv").exists()
    assert not list(tmp_path.glob("contrasts.*"))
    assert (tmp_path / "notes.txt").exists()  # files the folder did not write are kept


def test_mismatch_message_shows_the_differing_values_in_full(tmp_path):
    run = RunFolder(tmp_path)
    old = ["LT:all:all"] * 20  # far longer than one screen line
    run.write_config({"grafts": old, "seed": 0})
    new = old[:-1] + ["FE:all:all"]
    with pytest.raises(ConfigMismatchError) as info:
        run.write_config({"grafts": new, "seed": 1})
    message = str(info.value)
    assert json.dumps(old) in message and json.dumps(new) in message
    assert "seed stored 0, now 1" in message and "\n" not in message


def test_nothing_is_written_before_the_config(tmp_path):
    run = RunFolder(tmp_path / "a" / "b")
    run.check_writable()
    run.check_config({"seed": 0})
    assert not (tmp_path / "a").exists()  # the probe left no trace
    run.write_config({"seed": 0})
    assert (tmp_path / "a" / "b" / MARKER_FILE).is_file() and run.is_marked()


def test_unwritable_folder_is_refused_without_a_trace(tmp_path):
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path / "file" / "run"):
        with pytest.raises(RunFolderError, match="file|cannot write the run folder"):
            RunFolder(path).check_writable()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_folder_graft_did_not_write_is_never_cleared_or_resumed(tmp_path):
    """--overwrite once deleted the config.json of a model folder given as --out."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "model.safetensors").write_bytes(b"weights")
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    run = RunFolder(model)
    for attempt in (
        lambda: run.write_config({"seed": 0}, overwrite=True),
        lambda: run.write_config({"seed": 0}),
        run.clear,
    ):
        with pytest.raises(RunFolderError, match=f"no {MARKER_FILE} marker"):
            attempt()
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before
    # a run folder of a graft version before the marker: its config says who wrote it
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text('{"experiment": "x", "packages": {"graft": "0.1"}}')
    RunFolder(legacy).write_config({"seed": 0}, overwrite=True)
    assert RunFolder(legacy).read_config()["seed"] == 0
    # a folder without a config of any kind may be used (nothing of it is deleted)
    other = tmp_path / "notes"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    RunFolder(other).write_config({"seed": 0}, overwrite=True)
    assert (other / "notes.txt").read_text() == "mine"


def test_summary_parquet_and_csv(tmp_path):
    df = pl.DataFrame(
        {
            "graft": ["FE", "LT"],
            "acc@5": [0.1, 0.9],
            "top10_ids": [[1, 2], [3]],
            "tokens": [["a"], ["b,c"]],
        }
    )
    parquet, csv = RunFolder(tmp_path).write_summary(df)
    assert pl.read_parquet(parquet).equals(df)
    back = pl.read_csv(csv)
    assert back["acc@5"].to_list() == [0.1, 0.9]
    assert [json.loads(v) for v in back["top10_ids"]] == [[1, 2], [3]]
    assert [json.loads(v) for v in back["tokens"]] == [["a"], ["b,c"]]
    assert flat_table(df.select("graft")).equals(df.select("graft"))


def test_environment_helpers(tmp_path):
    versions = package_versions(("polars", "surely-not-installed-pkg"))
    assert versions["polars"] == pl.__version__
    assert versions["surely-not-installed-pkg"] is None
    assert git_commit() == _head()  # the tests run from a checkout of graft's
    assert git_commit(tmp_path) is None  # not a git checkout


def test_provenance_names_the_command_and_the_checkout(tmp_path):
    from graft.results.provenance import command_line, git_commit, git_dirty, machine_info

    assert command_line(["/usr/bin/graft-exp", "position", "--n", "5", "a b"]) == (
        "graft-exp position --n 5 'a b'"
    )
    assert git_commit(tmp_path) is None and git_dirty(tmp_path) is None  # not a checkout
    info = machine_info("cpu")
    assert info["gpu"] is None and info["cpu_count"] >= 1 and info["python"]
