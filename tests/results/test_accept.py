"""No unverified read by default (issue 35): a table without graft's marks is refused or set
aside, never read as it is, unless the user accepts the folder (graft-exp accept), which is
recorded; CSV mirrors are checked against their tables; config.json states the options the
tables were last computed with; a full disk whose writer's message carries no errno is still
one line."""

from __future__ import annotations

import errno
import json
import logging
import os
import sys

import polars as pl
import pytest
from click.testing import CliRunner

from graft.errors import DamagedFileError, StorageError
from graft.results.accept import accept_run_tables, unmarked_tables
from graft.results.folder import RunFolder
from graft.results.run_tables import refresh_mirrors
from graft.storage.tables import read_table, save_table
from graft_experiments.cli import main

KEY = ["seed"]


def finished(path) -> RunFolder:
    run = RunFolder(path)
    run.write_config({"seed": 0, "options": {"n_boot": 50}}, key=KEY)
    for i in range(3):
        run.append_batch("examples", pl.DataFrame({"row": [i], "hit": [i % 2 == 0]}), str(i))
    run.finalize("examples")
    run.write_summary(pl.DataFrame({"graft": ["SFT"], "acc@5": [0.9]}))
    return run


def test_a_table_rewritten_by_another_tool_is_refused_with_the_ways_out(tmp_path):
    run = finished(tmp_path / "run")
    pl.DataFrame({"graft": ["SFT"], "acc@5": [0.0]}).write_parquet(run.path / "summary.parquet")
    with pytest.raises(DamagedFileError) as info:
        read_table(run.path / "summary.parquet", "summary", run.run_key)
    message = str(info.value)
    assert "carries no graft marks" in message and "same --out" in message
    assert f"graft-exp accept {run.path}" in message and "\n" not in message


def test_accepting_marks_the_tables_as_they_are_and_records_it(tmp_path, monkeypatch):
    run = finished(tmp_path / "run")
    pl.DataFrame({"graft": ["SFT"], "acc@5": [0.0]}).write_parquet(run.path / "summary.parquet")
    part = run.path / "parts" / "examples" / "1.parquet"
    pl.DataFrame({"row": [1], "hit": [True]}).write_parquet(part)
    assert unmarked_tables(run.path) == [run.path / "summary.parquet", part]
    argv = ["/venv/bin/graft-exp", "accept", str(run.path), "--quiet"]
    monkeypatch.setattr(sys, "argv", argv)  # the command line the record names
    result = CliRunner().invoke(main, argv[1:])
    assert result.exit_code == 0, result.output
    assert f"warning: accepted {run.path / 'summary.parquet'}" in result.output  # --quiet too
    assert read_table(run.path / "summary.parquet", "summary", run.run_key)["acc@5"][0] == 0.0
    assert run.done_batches("examples") == {"0", "1", "2"}  # the part is this run's now
    record = json.loads((run.path / "config.json").read_text())["accepted"]
    copy = json.loads((run.path / ".graft-run").read_text())["config"]  # repair's copy, in step
    assert copy["accepted"] == record
    assert record[0]["files"] == ["summary.parquet", "parts/examples/1.parquet"]
    assert record[0]["command"] == f"graft-exp accept {run.path} --quiet"
    assert accept_run_tables(run.path) == []  # nothing left to accept: nothing recorded
    assert len(json.loads((run.path / "config.json").read_text())["accepted"]) == 1


def test_accept_refuses_a_folder_that_is_neither(tmp_path):
    result = CliRunner().invoke(main, ["accept", str(tmp_path)])
    assert result.exit_code == 2 and "neither a run folder" in result.output


def test_an_edited_or_stale_csv_mirror_is_rewritten_from_its_table(tmp_path, caplog):
    run = finished(tmp_path / "run")
    mirror = run.path / "summary.csv"
    clean = mirror.read_text()
    mirror.write_text(clean.replace("0.9", "0.1"))
    (run.path / "scores.csv").write_text("mine\n1\n")  # a CSV of the user's: no mirror
    with caplog.at_level(logging.WARNING):
        assert refresh_mirrors(run.path, run.run_key) == [mirror]
    assert mirror.read_text() == clean and "edited or stale" in caplog.text
    assert refresh_mirrors(run.path, run.run_key) == []
    assert (run.path / "scores.csv").read_text() == "mine\n1\n"


def test_the_record_states_the_options_the_tables_were_last_computed_with(tmp_path):
    run = finished(tmp_path / "run")
    again = RunFolder(run.path)
    again.write_config({"seed": 0, "options": {"n_boot": 20}}, key=KEY)
    again.commit_config()  # the runner's step once the tables are rewritten
    config = json.loads((run.path / "config.json").read_text())
    assert config["options"] == {"n_boot": 20}
    assert config["resumes"][-1]["before"] == {"options": {"n_boot": 50}}
    assert config["resumes"][-1]["changed"]["options"] == {"n_boot": 20}


def test_a_full_disk_the_writer_does_not_name_is_one_line(tmp_path, monkeypatch):
    """polars' parquet writer on a nearly full disk said "Invalid thrift: transport error"
    with no errno; the disk itself is asked then (a probe write beside the file)."""
    df = pl.DataFrame({"a": [1, 2]})

    def thrift(self, *args, **kwargs):
        raise pl.exceptions.ComputeError(
            "parquet: File out of specification: Invalid thrift: transport error"
        )

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pl.DataFrame, "write_parquet", thrift)
    with pytest.raises(pl.exceptions.ComputeError):  # a disk with room: the error stays
        save_table(df, tmp_path / "t.parquet", "t")
    monkeypatch.setattr("graft.storage.failures.os.write", full)
    with pytest.raises(StorageError, match="No space left on device") as info:
        save_table(df, tmp_path / "t.parquet", "t")
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temp or probe file left


def test_a_replaced_config_is_restored_by_repair_and_the_loop_is_gone(tmp_path):
    """config.json replaced by another run's: plot said "rerun", the rerun refused the folder
    as another configuration's; only --overwrite (recompute all) got out."""
    run = finished(tmp_path / "run")
    other = RunFolder(tmp_path / "other")
    other.write_config({"seed": 1, "options": {"n_boot": 50}}, key=KEY)
    own = (run.path / "config.json").read_text()
    (run.path / "config.json").write_text((other.path / "config.json").read_text())
    with pytest.raises(DamagedFileError, match=f"graft-exp repair {run.path}"):
        read_table(
            run.path / "summary.parquet",
            "summary",
            json.loads((run.path / "config.json").read_text())["run_key"],
        )
    with pytest.raises(Exception, match=f"graft-exp repair {run.path}"):  # the rerun's refusal
        RunFolder(run.path).write_config({"seed": 0, "options": {"n_boot": 50}}, key=KEY)
    result = CliRunner().invoke(main, ["repair", str(run.path)])
    assert result.exit_code == 0 and "another run's; restored" in result.output
    assert (run.path / "config.json").read_text() == own
    assert "nothing to repair" in CliRunner().invoke(main, ["repair", str(run.path)]).output
    (run.path / "config.json").write_text("{garbage")  # damaged: restored the same way
    assert "was damaged; restored" in CliRunner().invoke(main, ["repair", str(run.path)]).output
    again = RunFolder(run.path)  # the rerun resumes: every part is this run's
    again.write_config({"seed": 0, "options": {"n_boot": 50}}, key=KEY)
    assert again.done_batches("examples") == {"0", "1", "2"}


def test_repair_without_a_fitting_copy_names_the_ways_out(tmp_path):
    run = finished(tmp_path / "run")
    (run.path / ".graft-run").write_text('{"note": "a marker of a graft before copies"}')
    (run.path / "config.json").write_text('{"run_key": "another"}')
    result = CliRunner().invoke(main, ["repair", str(run.path)])
    assert result.exit_code == 2 and "--overwrite" in result.output and "new --out" in result.output
    assert "Usage:" not in result.output
