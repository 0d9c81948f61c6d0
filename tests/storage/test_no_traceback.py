"""No hang and no traceback on storage (issue #52 item 4): special files are refused before
they are opened, a storage error of any errno (an ``OSError``'s field, or only the text of
polars' and safetensors' errors) is one line, an ``--out`` that no file system takes is one
line, and a run folder removed mid-run stops the run without re-creating part of it."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import polars as pl
import pytest
from click.testing import CliRunner

from graft.errors import DamagedFileError, RunFolderError, StorageError
from graft.results.folder import RunFolder
from graft.storage.failures import (
    resumable,
    storage_errno,
    storage_error,
    storage_errors,
    uncaught_storage_error,
)
from graft.storage.files import refuse_special_under
from graft.storage.paths import path_problem
from graft.storage.tables import table_problem
from graft_experiments import common

ROOT = Path(__file__).resolve().parents[2]
#: polars' error on a file it may not open: a PermissionError whose errno field is None.
POLARS_DENIED = "Permission denied (os error 13): /data/run/summary.parquet"


def test_the_errno_of_polars_permission_error_is_read_from_its_text():
    err = PermissionError(POLARS_DENIED)
    assert err.errno is None
    assert storage_errno(err) == errno.EACCES
    assert storage_errno(OSError(errno.EIO, "Input/output error")) == errno.EIO
    assert storage_errno(pl.exceptions.ComputeError("disk (os error 28)")) == errno.ENOSPC
    assert storage_errno(ValueError("no errno here")) is None


@pytest.mark.parametrize(
    "err",
    [
        PermissionError(POLARS_DENIED),
        OSError(errno.EIO, "Input/output error", "/data/x"),
        OSError(errno.ENOENT, "No such file or directory", "/data/gone/x"),
        pl.exceptions.ComputeError("failed (os error 13): /data/x"),
    ],
    ids=["polars-permission", "eio", "enoent", "polars-wrapped"],
)
def test_a_storage_error_of_any_errno_is_one_line(err):
    wrapped = (pl.exceptions.PolarsError,)
    with pytest.raises(StorageError) as raised, storage_errors("the table", "/data/x", wrapped):
        raise err
    assert "\n" not in str(raised.value)
    assert "/data/" in str(raised.value)


def test_an_error_that_is_no_storage_error_passes_through():
    wrapped = (pl.exceptions.PolarsError,)
    with pytest.raises(ValueError), storage_errors("the table", "/data/x", wrapped):
        raise ValueError("a bug")
    assert uncaught_storage_error(ValueError("a bug")) is None
    assert uncaught_storage_error(BrokenPipeError(errno.EPIPE, "Broken pipe")) is None


def test_the_command_line_says_a_storage_error_no_reader_caught_in_one_line():
    @click.command(cls=common.GraftCommand)
    def broken():
        raise PermissionError(POLARS_DENIED)

    result = CliRunner().invoke(broken, [])
    assert result.exit_code == 2
    assert result.output.count("Error") == 1
    assert "Permission denied" in result.output and "/data/run/summary.parquet" in result.output


def test_only_work_its_rerun_resumes_says_it_resumes():
    """plot's disk-full and permission errors said "then rerun: it resumes" (#52 item 5)."""
    full = OSError(errno.ENOSPC, "No space left on device", "/data/run/figures/x.png")
    said = str(storage_error(full, "the figure"))
    assert said.endswith("free space or choose a writable place, then rerun")
    with resumable():  # a run's batches, a finetune's checkpoints
        resumed = str(storage_error(full, "the table examples"))
    assert resumed.endswith("then rerun: it resumes where this run stopped")
    assert "resumes" not in str(storage_error(full, "the figure"))  # only inside


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_read_only_commands_never_say_it_resumes(tmp_path, monkeypatch, code):
    """plot, compare, publish, accept and repair write no run: a failed write is one line
    that does not promise a resume."""
    import graft.results
    import graft.study
    from graft_experiments.cli import main

    def fails(*args, **kwargs):
        with storage_errors("the figure", tmp_path / "x.png"):
            raise OSError(code, os.strerror(code), str(tmp_path / "x.png"))

    commands = {
        "plot": (graft.study, "draw_run_figures", ["plot", str(tmp_path)]),
        "compare": (graft.results, "compare_run", ["compare", str(tmp_path), "A", "B"]),
        "publish": (graft.results, "publish_run", ["publish", str(tmp_path), "--to", "r"]),
        "accept": (graft.results, "accept_run_tables", ["accept", str(tmp_path)]),
        "repair": (graft.results, "repair_run_folder", ["repair", str(tmp_path)]),
    }
    (tmp_path / ".graft-run").write_text("graft\n")  # accept: a run folder
    (tmp_path / "config.json").write_text("{}")
    for name, (module, attr, args) in commands.items():
        monkeypatch.setattr(module, attr, fails)
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (name, result.output)
        (line,) = [line for line in result.output.splitlines() if line.startswith("Error")]
        assert "then rerun" in line and "resumes" not in line, (name, line)


def test_a_table_this_user_may_not_read_is_a_storage_line_not_damage(tmp_path, monkeypatch):
    table = tmp_path / "t.parquet"
    pl.DataFrame({"a": [1]}).write_parquet(table)

    def denied(*args, **kwargs):
        raise PermissionError(POLARS_DENIED)

    monkeypatch.setattr(pl, "read_parquet_metadata", denied)
    with pytest.raises(StorageError, match="cannot read a table .*read access") as raised:
        table_problem(table, {})
    assert not isinstance(raised.value, DamagedFileError)


def test_special_files_are_refused_before_they_are_opened(tmp_path):
    (tmp_path / "parts" / "examples" / ".set-aside").mkdir(parents=True)
    os.mkfifo(tmp_path / "parts" / "examples" / ".set-aside" / "0.parquet")
    refuse_special_under(tmp_path, skip=(".set-aside",))  # what was set aside stays aside
    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(DamagedFileError, match="config.json is a FIFO"):
        refuse_special_under(tmp_path, skip=(".set-aside",))


def test_a_fifo_in_a_run_folder_is_one_line_not_a_hang(tmp_path):
    """Was a hang (FIFO read as config.json, a mirror or a table) in the rerun, holding the
    run's lock, and in repair, accept, plot and compare."""
    run = RunFolder(tmp_path / "run")
    run.write_config({"seed": 0}, key=["seed"])
    run.append_batch("examples", pl.DataFrame({"a": [1]}), 0)
    os.mkfifo(run.path / "summary.csv")
    with pytest.raises(DamagedFileError, match="summary.csv is a FIFO"):
        RunFolder(run.path).check_owned()
    for command in (["repair"], ["accept"], ["plot"], ["compare", "--n-boot", "10"]):
        args = [*command, str(run.path)] + (["A", "B"] if command[0] == "compare" else [])
        done = subprocess.run(
            [sys.executable, "-m", "graft_experiments.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert done.returncode == 2, (command, done.stderr)
        assert "Traceback" not in done.stderr
        assert "summary.csv is a FIFO" in done.stderr, (command, done.stderr)


def test_out_paths_no_file_system_takes_are_one_line(tmp_path):
    bad_utf8 = os.fsdecode(bytes(tmp_path) + b"/bad\xffname")
    too_long = tmp_path / ("x" * 300) / "run"
    assert path_problem(tmp_path / "fine") == ""
    assert "UTF-8" in path_problem(bad_utf8)
    assert "300 bytes" in path_problem(too_long)
    for out in (bad_utf8, too_long):
        with pytest.raises(RunFolderError) as raised:
            RunFolder(out).check_writable()
        str(raised.value).encode("utf-8")  # printable: no surrogate escapes
    assert sorted(os.listdir(tmp_path)) == []  # nothing written


def test_a_run_folder_removed_mid_run_stops_the_run_and_is_not_recreated(tmp_path):
    run = RunFolder(tmp_path / "run")
    run.write_config({"seed": 0}, key=["seed"])
    run.append_batch("examples", pl.DataFrame({"a": [1]}), 0)
    shutil.rmtree(run.path)
    for write in (
        lambda: run.append_batch("examples", pl.DataFrame({"a": [2]}), 1),
        lambda: run.write_summary(pl.DataFrame({"a": [2]})),
        lambda: run.write_json("drops.json", {}),
    ):
        with pytest.raises(RunFolderError, match="removed or moved while this run wrote it"):
            write()
    assert not run.path.exists()  # the rerun finds no folder and starts anew
    again = RunFolder(run.path)
    again.check_owned()
    again.write_config({"seed": 0}, key=["seed"])
    assert again.append_batch("examples", pl.DataFrame({"a": [1]}), 0).is_file()
