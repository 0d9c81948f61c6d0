"""A run's stored batches and tables are checked (issue 24): a damaged or foreign part is set
aside and computed again, a damaged table is rebuilt by the rerun, a full disk is one line
and the rerun resumes, repeated row keys are refused before any row runs, and a run whose
first batch fails leaves no trace."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import socket
import threading
from collections.abc import Iterator

import polars as pl
import pytest

import graft.study.running.batches as batches
import graft.study.running.runner as runner
from graft.errors import DamagedFileError, ExperimentError, GraftError, StorageError
from graft.remote.config import RemoteConfig
from graft.results.compare import compare_run
from graft.results.folder import SET_ASIDE_DIR
from tests.study.test_runner import config, run, sort

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_a_resume_sets_aside_damaged_and_foreign_parts_and_computes_them_again(
    dataset, donor_path, tmp_path, caplog
):
    """A truncated part once made every resume a PAR1 traceback, and another run's valid
    part went into examples.parquet and the summary."""
    out = tmp_path / "run"
    expected = sort(run(config(dataset, out), donor_path).examples)
    other = tmp_path / "other"
    run(config(dataset, other, seed=1), donor_path)  # another run: the same batch ids
    parts = out / "parts/examples"
    data = (parts / "0.parquet").read_bytes()
    (parts / "0.parquet").write_bytes(data[: len(data) // 2])
    (parts / "1.parquet").write_bytes(os.urandom(len(data)))
    (parts / "2.parquet").write_bytes((other / "parts/examples/2.parquet").read_bytes())

    lines: list[str] = []
    with caplog.at_level(logging.WARNING, logger="graft.results.run_tables"):
        resumed = run(config(dataset, out), donor_path, echo=lines.append)
    assert "(2 already done)" in lines[1]
    names = ["0.parquet", "1.parquet", "2.parquet"]
    assert sorted(p.name for p in (parts / SET_ASIDE_DIR).iterdir()) == names
    warned = [r.getMessage() for r in caplog.records if "runs again" in r.getMessage()]
    assert [any(str(parts / n) in w for w in warned) for n in names] == [True] * 3
    assert sort(resumed.examples).equals(expected)
    assert sort(pl.read_parquet(out / "examples.parquet")).equals(expected)


@pytest.mark.slow
def test_a_damaged_table_is_one_line_and_the_rerun_rebuilds_it(dataset, donor_path, tmp_path):
    out = tmp_path / "run"
    first = run(config(dataset, out), donor_path)
    contrast = compare_run(out, "FE", "PRE", n_boot=20)
    (out / "examples.parquet").write_bytes(b"PAR1 garbled")
    data = (out / "summary.parquet").read_bytes()
    (out / "summary.parquet").write_bytes(data[:-30])
    with pytest.raises(DamagedFileError, match=r"examples\.parquet .*same --out to rebuild"):
        compare_run(out, "FE", "PRE", n_boot=20)
    again = run(config(dataset, out), donor_path)  # every batch is done: only the tables
    assert again.examples.equals(first.examples) and again.summary.equals(first.summary)
    assert pl.read_parquet(out / "summary.parquet").equals(first.summary)
    assert compare_run(out, "FE", "PRE", n_boot=20).equals(contrast)


@pytest.mark.slow
def test_a_full_disk_while_storing_a_batch_is_one_line_and_the_rerun_resumes(
    dataset, donor_path, tmp_path, monkeypatch
):
    """Once a polars 'ComputeError ... (os error 28)' traceback."""
    expected = sort(run(config(dataset, tmp_path / "full"), donor_path).examples)
    write_parquet = pl.DataFrame.write_parquet

    def full_at_batch_2(self, file, *args, **kwargs):
        if str(file).split("/")[-1].startswith(".2.parquet."):
            with open(file, "wb") as handle:
                handle.write(b"PAR1 half")
            raise pl.exceptions.ComputeError(
                "parquet: File out of specification: underlying IO error: No space left on "
                f"device (os error {errno.ENOSPC})"
            )
        return write_parquet(self, file, *args, **kwargs)

    monkeypatch.setattr(pl.DataFrame, "write_parquet", full_at_batch_2)
    out = tmp_path / "run"
    with pytest.raises(StorageError, match=r"2\.parquet.*free space") as info:
        run(config(dataset, out), donor_path)
    assert "\n" not in str(info.value)
    assert str(info.value).endswith("then rerun: it resumes where this run stopped")  # a run
    parts = out / "parts/examples"
    assert sorted(p.name for p in parts.iterdir()) == ["0.parquet", "1.parquet"]  # no temp
    assert not (out / "examples.parquet").exists() and not (out / "summary.parquet").exists()
    monkeypatch.undo()  # space freed
    lines: list[str] = []
    resumed = run(config(dataset, out), donor_path, echo=lines.append)
    assert "(2 already done)" in lines[1]
    assert sort(resumed.examples).equals(expected)


def test_repeated_prompt_ids_are_refused_before_any_row_runs(
    dataset, donor_path, tmp_path, monkeypatch
):
    """Rows of one (graft, template, prompt_id) key were found only after every row ran,
    by the contrasts ('N rows repeat a ... key'), with the tables already on disk."""
    sample = runner.sample_examples
    monkeypatch.setattr(runner, "sample_examples", lambda *a: (lambda e: e + e[-1:])(sample(*a)))
    calls: list[int] = []
    original = batches._row_metrics
    monkeypatch.setattr(batches, "_row_metrics", lambda *a: calls.append(1) or original(*a))
    out = tmp_path / "run"
    with pytest.raises(ExperimentError, match="repeat a .* key.* own") as info:
        run(config(dataset, out), donor_path)
    message = str(info.value)
    assert "movie/" in message and "\n" not in message
    assert calls == [] and not out.exists()


@pytest.fixture
def dropping_host() -> Iterator[str]:
    """A host that accepts every connection and closes it at once: reachable, but every
    request fails (the reachability check passes; the first batch does not)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        with server:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()


@pytest.mark.slow
@pytest.mark.parametrize("existed", [False, True])
def test_a_remote_run_that_fails_at_its_first_batch_leaves_no_trace(
    dataset, donor_path, tmp_path, dropping_host, existed
):
    """Such a run once left .graft-run and config.json behind."""
    out = tmp_path / "out"
    if existed:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    remote = RemoteConfig(mode="remote", host=dropping_host, retries=0, model_key="tiny")
    cfg = dataclasses.replace(config(dataset, out), remote=remote)
    with pytest.raises(GraftError, match=dropping_host) as info:  # RemoteError or its wrap
        run(cfg, donor_path)
    assert "\n" not in str(info.value)
    if existed:
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    else:
        assert not out.exists()
    assert run(config(dataset, out), donor_path).examples.height == 18


@pytest.mark.slow
def test_a_garbled_run_config_is_one_line_on_the_rerun(dataset, donor_path, tmp_path):
    out = tmp_path / "run"
    run(config(dataset, out), donor_path)
    (out / "config.json").write_text('{"experiment": "custom", ')  # cut off mid-write
    with pytest.raises(DamagedFileError, match=r"config\.json .*--overwrite.*new --out") as info:
        run(config(dataset, out), donor_path)
    assert "\n" not in str(info.value)
    assert run(config(dataset, out, overwrite=True), donor_path).examples.height == 18


@pytest.mark.slow
def test_tokens_writes_its_table_with_metadata(dataset, donor_path, tmp_path, monkeypatch):
    """top_tokens.parquet was written in place, without the record every other table has."""
    from dataclasses import replace

    from graft.study import ModelSource, resolve, run_design, tokens_design

    out = tmp_path / "run"
    design = tokens_design(resolve(config(dataset, out)), per_graft=1)
    request = replace(design.runs[""], donors={"sft": ModelSource(path=donor_path)})
    run_design(replace(design, runs={"": request}))
    meta = pl.read_parquet_metadata(out / "top_tokens.parquet")
    assert meta["graft.table"] == "top_tokens" and int(meta["graft.rows"]) > 0
    from graft.storage.tables import read_table

    table = read_table(out / "top_tokens.parquet", "top_tokens")  # its digest checks out
    assert pl.read_csv(out / "top_tokens.csv").height == table.height
    assert not list(out.glob(".*.tmp"))


class _Killed(BaseException):
    """Stands in for a kill (or Ctrl-C): nothing after it runs."""


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_rerun_with_another_n_boot_stopped_in_its_summaries_never_shows_a_mismatch(
    dataset, donor_path, tmp_path, monkeypatch, when
):
    """A rerun recorded its --n-boot at the start: stopped before its summaries, config.json
    said 30 over tables computed with 20, and plot drew them (issue 52)."""
    from click.testing import CliRunner

    from graft_experiments.cli import main

    out = tmp_path / "run"
    run(config(dataset, out), donor_path)  # n_boot 20
    real = runner.write_summaries

    def stopped(*args, **kwargs):
        if when == "after":
            real(*args, **kwargs)  # the tables rewritten with 30, the record not yet
        raise _Killed

    monkeypatch.setattr(runner, "write_summaries", stopped)
    with pytest.raises(_Killed):
        run(config(dataset, out, n_boot=30), donor_path)
    monkeypatch.undo()
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["options"]["n_boot"] == 20 and "resumes" not in recorded
    plotted = CliRunner().invoke(main, ["plot", str(out)])
    if when == "before":  # the old record over the old tables
        assert plotted.exit_code == 0, plotted.output
    else:  # a table computed with 30 under a record of 20 is refused, with the fix
        assert plotted.exit_code == 2, plotted.output
        assert "other options than config.json records" in plotted.output
        assert "same --out" in plotted.output
    run(config(dataset, out, n_boot=30), donor_path)  # the fix: rerun, same --out
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["options"]["n_boot"] == 30 and len(recorded["resumes"]) == 1
    assert CliRunner().invoke(main, ["plot", str(out)]).exit_code == 0
