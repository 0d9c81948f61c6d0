"""The record always describes the tables (issue 52, item 3): derived tables carry the digest
of the options they were computed with and readers refuse one that is not config.json's; a
resumed run's changed options are recorded only after the tables they shape; accept lists
every file before it marks any. Each test stops the writes at every step (a raise where a
kill would land) and checks the invariant holds at each."""

from __future__ import annotations

import json
import os
import shutil

import polars as pl
import pytest

from graft.errors import DamagedFileError, RunFolderError
from graft.results import accept as accept_module
from graft.results.accept import accept_run_tables, unmarked_tables
from graft.results.folder import RunFolder
from graft.results.run_config import recorded_options, recorded_run_key
from graft.results.run_tables import refresh_mirrors
from graft.storage.tables import is_marked, read_table, save_table

KEY = ["seed"]


class Killed(BaseException):
    """Stands in for a kill: nothing after it runs."""


def run_with(path, n_boot: int) -> RunFolder:
    """What the runner does, for a run whose derived tables depend on ``n_boot``: config,
    parts, the combined table, the summary and contrasts, then the record's commit."""
    run = RunFolder(path)
    run.write_config({"seed": 0, "options": {"n_boot": n_boot}}, key=KEY)
    for i in range(2):
        run.append_batch("examples", pl.DataFrame({"row": [i]}), str(i))
    run.finalize("examples")
    run.write_summary(pl.DataFrame({"graft": ["SFT"], "n_boot": [n_boot]}))
    run.write_summary(pl.DataFrame({"pair": ["a-b"], "n_boot": [n_boot]}), stem="contrasts")
    run.commit_config()
    return run


def recorded_n_boot(path) -> int:
    return json.loads((path / "config.json").read_text())["options"]["n_boot"]


def readable(path, stem: str) -> pl.DataFrame | None:
    """The table as plot/compare read it (checked against config.json), None if refused."""
    try:
        return read_table(
            path / f"{stem}.parquet",
            stem,
            recorded_run_key(path),
            options=recorded_options(path),
        )
    except DamagedFileError as err:
        assert "same --out" in str(err) and "\n" not in str(err)
        return None


def kill_at_replace(monkeypatch, at: int) -> None:
    """Raise :class:`Killed` instead of the ``at``-th file commit (``os.replace``)."""
    calls = {"n": 0}
    real = os.replace

    def replace(src, dst):
        calls["n"] += 1
        if calls["n"] == at:
            raise Killed
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_a_rerun_with_other_options_records_them_after_its_tables(tmp_path):
    run = run_with(tmp_path / "run", 50)
    again = RunFolder(run.path)
    again.write_config({"seed": 0, "options": {"n_boot": 20}}, key=KEY)
    assert recorded_n_boot(run.path) == 50  # stopped here: the old record over the old tables
    assert readable(run.path, "summary")["n_boot"][0] == 50
    again.write_summary(pl.DataFrame({"graft": ["SFT"], "n_boot": [20]}))
    assert readable(run.path, "summary") is None  # stopped here: the new table is refused
    again.commit_config()
    assert recorded_n_boot(run.path) == 20
    assert readable(run.path, "summary")["n_boot"][0] == 20
    config = json.loads((run.path / "config.json").read_text())
    assert config["resumes"][-1]["before"] == {"options": {"n_boot": 50}}


@pytest.mark.parametrize("at", range(1, 12))
def test_a_rerun_with_other_options_killed_at_any_write_never_shows_a_mismatch(
    tmp_path, monkeypatch, at
):
    path = tmp_path / "run"
    run_with(path, 50)
    kill_at_replace(monkeypatch, at)
    finished = True
    try:
        run_with(path, 20)
    except Killed:
        finished = False
    monkeypatch.undo()
    said = recorded_n_boot(path)
    for stem in ("summary", "contrasts"):
        table = readable(path, stem)
        # a table is either refused or computed with what config.json says
        assert table is None or table["n_boot"][0] == said
    if finished:
        assert said == 20 and readable(path, "summary") is not None
    # the fix the message names: rerun with the same --out
    run_with(path, 20)
    assert recorded_n_boot(path) == 20
    assert readable(path, "summary")["n_boot"][0] == 20
    assert refresh_mirrors(path, recorded_run_key(path), recorded_options(path)) == []


def test_a_table_copied_from_a_run_with_other_options_is_refused(tmp_path):
    ours = run_with(tmp_path / "ours", 50)
    other = run_with(tmp_path / "other", 20)
    assert ours.run_key == other.run_key  # the same run key: only the options differ
    shutil.copy(other.path / "summary.parquet", ours.path / "summary.parquet")
    with pytest.raises(DamagedFileError, match="other options than config.json records"):
        read_table(
            ours.path / "summary.parquet", "summary", ours.run_key, options=ours.options_digest
        )
    assert readable(ours.path, "contrasts") is not None  # its own table still reads


def test_a_table_without_an_options_mark_is_read_as_before(tmp_path):
    run = run_with(tmp_path / "run", 50)
    file = run.path / "summary.parquet"
    save_table(pl.DataFrame({"graft": ["SFT"]}), file, "summary", run.run_key)  # no options
    assert readable(run.path, "summary") is not None


def unmarked_run(path) -> RunFolder:
    run = run_with(path, 50)
    for stem in ("summary", "contrasts"):
        pl.read_parquet(path / f"{stem}.parquet").write_parquet(path / f"{stem}.parquet")
    pl.DataFrame({"row": [1]}).write_parquet(path / "parts" / "examples" / "1.parquet")
    return run


@pytest.mark.parametrize("at", range(1, 5))
def test_an_accept_killed_at_any_step_leaves_nothing_marked_unlisted(tmp_path, monkeypatch, at):
    run = unmarked_run(tmp_path / "run")
    files = unmarked_tables(run.path)
    assert len(files) == 3
    calls = {"n": 0}
    real = accept_module.mark_table

    def mark(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == at:
            raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(accept_module, "mark_table", mark)
    if at <= len(files):
        with pytest.raises(Killed):
            accept_run_tables(run.path)
    else:
        accept_run_tables(run.path)
    monkeypatch.undo()
    config = json.loads((run.path / "config.json").read_text())
    listed = {f for e in config.get("accepted", []) for f in e["files"]}
    for file in files:
        if is_marked(file):
            assert str(file.relative_to(run.path)) in listed
    # the next accept completes the stopped one: one record, done, listing every file
    accept_run_tables(run.path)
    entries = json.loads((run.path / "config.json").read_text())["accepted"]
    assert len(entries) == 1 and "pending" not in entries[0]
    assert sorted(entries[0]["files"]) == sorted(str(f.relative_to(run.path)) for f in files)
    assert unmarked_tables(run.path) == []
    assert readable(run.path, "summary") is not None
    assert accept_run_tables(run.path) == []


def test_an_accept_killed_before_its_record_marks_nothing(tmp_path, monkeypatch):
    run = unmarked_run(tmp_path / "run")
    files = unmarked_tables(run.path)

    def store(config):
        raise Killed

    monkeypatch.setattr(RunFolder, "store_config", lambda self, config: store(config))
    with pytest.raises(Killed):
        accept_run_tables(run.path)
    assert unmarked_tables(run.path) == files  # nothing marked without its record


def test_a_resumed_run_whose_folder_is_removed_stops_and_recreates_nothing(tmp_path):
    """A resume stores no record at its start: it still knows the folder is its own."""
    run = run_with(tmp_path / "run", 50)
    again = RunFolder(run.path)
    again.write_config({"seed": 0, "options": {"n_boot": 20}}, key=KEY)
    shutil.rmtree(run.path)
    with pytest.raises(RunFolderError, match="removed or moved while this run wrote it"):
        again.write_summary(pl.DataFrame({"graft": ["SFT"], "n_boot": [20]}))
    with pytest.raises(RunFolderError, match="removed or moved"):
        again.commit_config()
    assert not run.path.exists()


def test_a_resume_of_a_folder_without_its_marker_gives_it_one_with_the_old_record(tmp_path):
    run = run_with(tmp_path / "run", 50)
    run.marker_path.unlink()  # a graft before the marker: known by its config
    (run.path / "config.json").write_text(
        json.dumps(
            json.loads((run.path / "config.json").read_text())
            | {"experiment": "x", "packages": {"graft": "0"}}
        )
    )
    again = RunFolder(run.path)
    again.write_config({"seed": 0, "options": {"n_boot": 20}}, key=KEY)
    copy = json.loads(run.marker_path.read_text())["config"]
    assert copy["options"] == {"n_boot": 50} and "resumes" not in copy
