"""Crash-consistent writes and verified reads of run folders (issue 24): parts and tables carry
their run key, table, batch, rows and digest; damaged or foreign files are set aside or named in
one line; a full disk is one line and leaves nothing half-written."""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from matplotlib.figure import Figure

from graft.errors import DamagedFileError, StorageError
from graft.results.compare import compare_run
from graft.results.folder import SET_ASIDE_DIR, RunFolder
from graft.results.plots import save_figure
from graft.results.plots.style import new_figure
from graft.results.repair import tables_run_key
from graft.results.report import draw_figures
from graft.storage.tables import frame_digest, is_marked
from graft_experiments.cli import main

KEY = ["seed"]


def batch(i: int) -> pl.DataFrame:
    return pl.DataFrame(
        {"row": [2 * i, 2 * i + 1], "graft": ["FE", "LT"], "top": [[i, 1], [2]], "p": [0.5, -0.0]}
    )


def started(path: Path, seed: int = 0, batches=range(6)) -> RunFolder:
    run = RunFolder(path)
    run.write_config({"seed": seed}, key=KEY)
    for i in batches:
        run.append_batch("examples", batch(i), str(i))
    return run


def part(run: RunFolder, i: int | str) -> Path:
    return run.parts_path / "examples" / f"{i}.parquet"


@pytest.mark.slow
def test_parts_record_run_table_batch_rows_and_a_digest_stable_across_processes(tmp_path):
    run = started(tmp_path / "run", batches=[3])
    meta = pl.read_parquet_metadata(part(run, 3))
    assert meta["graft.table"] == "examples" and meta["graft.batch"] == "3"
    assert meta["graft.run_key"] == run.run_key and len(run.run_key) == 32
    assert meta["graft.rows"] == "2" and meta["graft.sha256"] == frame_digest(batch(3))
    code = (
        "import polars as pl; from graft.storage.tables import frame_digest; "
        f"print(frame_digest(pl.read_parquet({str(part(run, 3))!r})))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == meta["graft.sha256"]
    assert frame_digest(batch(3).with_columns(p=pl.lit(0.0))) != meta["graft.sha256"]  # -0.0
    # a resumed folder (a new instance, same key fields) has the same run key
    again = RunFolder(tmp_path / "run")
    again.write_config({"seed": 0, "note": "resumed"}, key=KEY)
    assert again.run_key == run.run_key and again.done_batches("examples") == {"3"}


def test_damaged_or_foreign_parts_are_set_aside_and_their_batches_run_again(tmp_path, caplog):
    """A truncated part once made every resume a PAR1 traceback; another run's valid part was
    taken as this run's rows."""
    run = started(tmp_path / "run")
    other = started(tmp_path / "other", seed=1)
    data = part(run, 0).read_bytes()
    part(run, 0).write_bytes(data[: len(data) // 2])  # truncated
    part(run, 1).write_bytes(os.urandom(len(data)))  # random bytes
    part(run, 2).write_bytes(part(other, 2).read_bytes())  # another run's batch 2
    part(run, 3).write_bytes(part(run, 4).read_bytes())  # this run's batch 4 under 3's name
    edited = batch(5).with_columns(p=pl.lit(9.0))
    edited.write_parquet(part(run, 5), metadata=pl.read_parquet_metadata(part(run, 5)))
    pl.DataFrame({"row": [8, 9]}).write_parquet(part(run, 6))  # no marks: another tool's

    resumed = RunFolder(tmp_path / "run")
    resumed.write_config({"seed": 0}, key=KEY)
    with caplog.at_level(logging.WARNING, logger="graft.results.run_tables"):
        assert resumed.done_batches("examples") == {"4"}
    aside = part(run, 0).parent / SET_ASIDE_DIR
    assert sorted(p.name for p in aside.iterdir()) == [f"{i}.parquet" for i in (0, 1, 2, 3, 5, 6)]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 6 and all("runs again" in w and "\n" not in w for w in warned)
    assert any(str(part(run, 6)) in w and "no graft marks" in w for w in warned)
    assert any(str(part(run, 2)) in w and "run_key" in w for w in warned)
    assert any(str(part(run, 3)) in w and "batch '4' where '3'" in w for w in warned)
    assert any(str(part(run, 5)) in w and "digest" in w for w in warned)
    # the set-aside batches are written again; a second bad copy never overwrites the first
    for i in (0, 1, 2, 3, 5, 6):
        resumed.append_batch("examples", batch(i), str(i))
    part(run, 0).write_bytes(b"garbage")
    assert resumed.done_batches("examples") == {"1", "2", "3", "4", "5", "6"}
    assert (aside / "0.2.parquet").read_bytes() == b"garbage"


def test_a_fifo_among_the_parts_is_set_aside_unopened_not_waited_on(tmp_path, caplog):
    """A FIFO in parts/ hung the rerun (holding the run lock): opening it waits for a
    writer. It is refused by its type before anything opens it."""
    run = started(tmp_path / "run", batches=range(3))
    part(run, 1).unlink()
    os.mkfifo(part(run, 1))
    resumed = RunFolder(tmp_path / "run")
    resumed.write_config({"seed": 0}, key=KEY)
    with caplog.at_level(logging.WARNING, logger="graft.results.run_tables"):
        assert resumed.done_batches("examples") == {"0", "2"}  # returns: nothing waited
    assert any("is a FIFO, not a parquet file" in r.getMessage() for r in caplog.records)
    assert stat.S_ISFIFO((part(run, 0).parent / SET_ASIDE_DIR / "1.parquet").lstat().st_mode)
    assert not is_marked(part(run, 0).parent / SET_ASIDE_DIR / "1.parquet")
    # repair's scan of the tables' run keys skips it too
    os.mkfifo(part(run, 1))
    assert tables_run_key(run.path) == run.run_key


def test_derived_tables_are_written_only_when_every_part_checks_out(tmp_path):
    run = started(tmp_path / "run")
    part(run, 2).write_bytes(b"PAR1 truncated")
    with pytest.raises(DamagedFileError, match=r"2\.parquet is not a readable parquet") as info:
        run.finalize("examples")
    assert "same --out" in str(info.value) and "\n" not in str(info.value)
    assert not (run.path / "examples.parquet").exists()
    assert run.done_batches("examples") == {"0", "1", "3", "4", "5"}
    run.append_batch("examples", batch(2), "2")
    table = pl.read_parquet(run.finalize("examples"))
    assert table["row"].to_list() == list(range(12))
    meta = pl.read_parquet_metadata(run.path / "examples.parquet")
    assert meta["graft.sha256"] == frame_digest(table) and meta["graft.run_key"] == run.run_key


def finished(path: Path, seed: int = 0) -> Path:
    """A run folder as a finished run leaves it, without running a model."""
    run = started(path, seed=seed, batches=[])
    examples = pl.DataFrame(
        {
            "graft": ["FE", "PRE"] * 4,
            "group": [""] * 8,
            "template": ["qa"] * 8,
            "prompt_id": [f"p{i // 2}" for i in range(8)],
            "hit@5": [True, False, True, True, False, False, True, False],
            "target_logprob": [-1.0, -2.0, -1.5, -1.0, -3.0, -2.5, -0.5, -2.0],
        }
    )
    for i in range(2):
        run.append_batch("examples", examples[4 * i : 4 * i + 4], str(i))
    run.finalize("examples")
    summary = pl.DataFrame(
        {"group": [""] * 2, "template": ["qa"] * 2, "graft": ["PRE", "FE"], "n": [4, 4]}
    ).with_columns(
        **{"acc@5": pl.lit(0.5), "acc@5_lo": pl.lit(0.1), "acc@5_hi": pl.lit(0.9)},
    )
    run.write_summary(summary)
    config = run.read_config() | {"experiment": "position", "grafts": [{"name": "FE"}]}
    (path / "config.json").write_text(json.dumps(config))
    return path


def damage(file: Path, how: str) -> None:
    if how == "swapped":  # the same table of another run (same rows, another config)
        other = finished(file.parent.parent / "other", seed=1)
        file.write_bytes((other / file.name).read_bytes())
    elif how == "truncated":
        data = file.read_bytes()
        file.write_bytes(data[: len(data) - 20])
    elif how == "garbled":
        file.write_bytes(b"not parquet at all, not even close")
    else:  # valid parquet, its record kept, its numbers edited
        meta = pl.read_parquet_metadata(file)
        table = pl.read_parquet(file)
        table.reverse().write_parquet(file, metadata=meta)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncated", "garbled", "edited", "swapped"])
def test_a_damaged_table_is_one_line_in_compare_and_plot(tmp_path, how):
    run = finished(tmp_path / "run")
    assert compare_run(run, "FE", "PRE", n_boot=20).height == 1
    assert draw_figures(run)
    commands = {"examples": ["compare", str(run), "FE", "PRE"], "summary": ["plot", str(run)]}
    for name, command in commands.items():
        damage(run / f"{name}.parquet", how)
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 2, result.output
        assert result.output.count("Error:") == 1 and "Traceback" not in result.output
        (line,) = [line for line in result.output.splitlines() if "Error:" in line]
        assert f"{name}.parquet" in line and "rerun the experiment with the same --out" in line
    with pytest.raises(DamagedFileError, match="examples.parquet"):
        compare_run(run, "FE", "PRE")
    with pytest.raises(DamagedFileError, match="summary.parquet"):
        draw_figures(run)


def test_a_garbled_run_config_is_one_line_naming_the_fix(tmp_path):
    run = finished(tmp_path / "run")
    for text in ("{not json", "[1, 2]"):
        (run / "config.json").write_text(text)
        for attempt in (
            lambda: RunFolder(run).write_config({"seed": 0}, key=KEY),
            lambda: draw_figures(run),
            lambda: compare_run(run, "FE", "PRE"),
        ):
            with pytest.raises(DamagedFileError, match=r"config\.json .*--overwrite") as info:
                attempt()
            assert "\n" not in str(info.value)
    result = CliRunner().invoke(main, ["plot", str(run)])
    assert result.exit_code == 2 and "--overwrite" in result.output
    assert "Traceback" not in result.output
    fresh = RunFolder(run)
    fresh.write_config({"seed": 1}, key=KEY, overwrite=True)  # the fix works
    assert fresh.read_config()["seed"] == 1


#: What polars raises when the disk fills under it (seen writing to /dev/full).
POLARS_FULL = "parquet: File out of specification: underlying IO error: No space left on device"


def disk_full(monkeypatch, name: str) -> None:
    """Writes of the temp file of ``name`` fail as on a full disk: polars' wrapped error for
    parquet and CSV, ENOSPC for JSON and figures, after writing a few bytes."""

    def full(tmp) -> bool:
        if not Path(tmp).name.startswith(f".{name}."):
            return False
        Path(tmp).write_bytes(b"PAR1 half")
        return True

    def polars_writer(original):
        def write(self, file, *args, **kwargs):
            if full(file):
                raise pl.exceptions.ComputeError(f"{POLARS_FULL} (os error {errno.ENOSPC})")
            return original(self, file, *args, **kwargs)

        return write

    def python_writer(original):
        def write(self, file, *args, **kwargs):
            if full(file):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return original(self, file, *args, **kwargs)

        return write

    def write_text(self, *args, **kwargs):
        if full(self):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original_write_text(self, *args, **kwargs)

    original_write_text = Path.write_text
    for method in ("write_parquet", "write_csv"):
        monkeypatch.setattr(pl.DataFrame, method, polars_writer(getattr(pl.DataFrame, method)))
    monkeypatch.setattr(Figure, "savefig", python_writer(Figure.savefig))
    monkeypatch.setattr(Path, "write_text", write_text)


def no_trace(folder: Path, name: str) -> None:
    assert not (folder / name).exists()
    assert not [p for p in folder.rglob(f".{name}*") if p.is_symlink() or p.exists()]


@pytest.mark.parametrize(
    ("name", "write"),
    [
        ("2.parquet", lambda run: run.append_batch("examples", batch(2), "2")),
        ("examples.parquet", lambda run: run.finalize("examples")),
        ("summary.parquet", lambda run: run.write_summary(batch(0))),
        ("summary.csv", lambda run: run.write_summary(batch(0))),
        ("drops.json", lambda run: run.write_json("drops.json", {"qa": {}})),
        ("x.png", lambda run: save_figure(new_figure(2, 2), run.path / "figures", "x")),
        ("x.pdf", lambda run: save_figure(new_figure(2, 2), run.path / "figures", "x")),
    ],
)
def test_a_full_disk_is_one_line_naming_the_file_and_leaves_nothing(
    tmp_path, monkeypatch, name, write
):
    """Once a polars 'ComputeError ... Invalid thrift' or an OSError traceback."""
    run = started(tmp_path / "run", batches=[0, 1])
    disk_full(monkeypatch, name)
    with pytest.raises(StorageError) as info:
        write(run)
    message = str(info.value)
    assert name in message and "No space left on device" in message and "\n" not in message
    no_trace(run.path, name)
    monkeypatch.undo()  # space freed: the same write succeeds and the run resumes
    write(run)
    assert run.done_batches("examples") >= {"0", "1"}


def test_a_wrapped_polars_error_of_any_errno_is_one_line(tmp_path, monkeypatch):
    """An I/O error (os error 5) is a storage error too (issue #52 item 4: any errno)."""

    def broken(self, *args, **kwargs):
        raise pl.exceptions.ComputeError("parquet: something else (os error 5)")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", broken)
    with pytest.raises(StorageError, match="Input/output error") as raised:
        RunFolder(tmp_path).append_batch("examples", batch(0), "0")
    assert "\n" not in str(raised.value)


def test_a_wrapped_polars_error_that_is_no_storage_error_is_left_alone(tmp_path, monkeypatch):
    def broken(self, *args, **kwargs):
        raise pl.exceptions.ComputeError("parquet: something else")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", broken)
    with pytest.raises(pl.exceptions.ComputeError, match="something else"):
        RunFolder(tmp_path).append_batch("examples", batch(0), "0")


def test_temp_files_of_an_interrupted_write_are_removed_by_the_next_run(tmp_path):
    run = started(tmp_path / "run", batches=[0])
    strays = [
        run.path / ".summary.parquet.123.deadbeef.tmp",
        run.path / ".graft-probe-x1y2.tmp",
        run.parts_path / "examples" / ".1.parquet.99.0a1b2c3d.tmp",
        run.path / "figures" / ".position_qa_acc5.png.7.abcdef01.tmp",
    ]
    mine = [run.path / ".notes.tmp", run.path / "figures" / "notes.tmp"]
    for file in strays + mine:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(b"half")
    RunFolder(run.path).write_config({"seed": 0}, key=KEY)
    assert [f.exists() for f in strays + mine] == [False] * len(strays) + [True] * len(mine)
