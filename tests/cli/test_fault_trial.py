"""The fault trial of issue #52, kept: each of its 17 cases ends in one line (or succeeds with
the reference's tables), with nothing lost.

:data:`CASES` names, for every case, the tests that hold it (most live beside the code they
test); :func:`test_every_case_of_the_trial_is_held_by_a_test` fails when one of them is gone.
The cases no other module runs end to end are run here on a tiny run: a read-only run used
by a second user (``plot``, ``plot --figures-dir``, ``compare``, ``accept``, ``repair``), a
parts folder that refuses a write mid-run, and ``--out`` / ``--figures-dir`` paths that no
file system takes, given on the command line.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from graft_experiments.cli import main

ROOT = Path(__file__).resolve().parents[2]

#: case of the trial -> the tests that hold it (``path::name``, under tests/).
CASES: dict[str, list[str]] = {
    "lease: several waiters break one stale lease": [
        "storage/test_lock_stress.py::test_forty_rounds_of_six_waiters_on_a_stale_lock_never_overlap",
        "storage/test_lock_stress.py::test_waiters_on_a_stale_lock_enter_one_at_a_time",
    ],
    "lease: a holder paused past its lease is not told": [
        "storage/test_lock_stress.py::test_a_lease_holder_paused_past_its_lease_stops_with_one_line",
        "storage/test_lock_stress.py::test_a_holder_that_lost_its_lease_stops_before_its_next_commit",
    ],
    "donors 0600: a second user cannot read them": [
        "storage/test_files.py::test_a_weights_file_written_0600_becomes_readable_by_others",
        "storage/test_shared_workspace.py::test_a_workspace_gets_the_umask_modes_and_a_second_user_reads_it",
    ],
    "a rerun with another --n-boot killed before its summary": [
        "results/test_record_tables.py::test_a_rerun_with_other_options_killed_at_any_write_never_shows_a_mismatch",
        "cli/test_integrity_harness.py::test_a_rerun_with_another_n_boot_killed_at_any_rename_never_shows_a_mismatch",
    ],
    "a summary copied from a run of the same key and another --n-boot": [
        "results/test_record_tables.py::test_a_table_copied_from_a_run_with_other_options_is_refused",
        "cli/test_publish.py::test_a_table_whose_marks_differ_is_refused_in_one_line",
        "cli/test_publish.py::test_tracking_reads_a_summary_checked_against_its_record",
    ],
    "accept killed partway": [
        "results/test_record_tables.py::test_an_accept_killed_at_any_step_leaves_nothing_marked_unlisted",
        "cli/test_integrity_harness.py::test_accept_killed_at_any_rename_leaves_nothing_half_accepted",
    ],
    "a FIFO in parts/ hangs the rerun and repair": [
        "results/test_integrity.py::test_a_fifo_among_the_parts_is_set_aside_unopened_not_waited_on",
        "storage/test_no_traceback.py::test_a_fifo_in_a_run_folder_is_one_line_not_a_hang",
        "cli/test_integrity_harness.py::test_a_damaged_file_is_one_line_or_recomputed",
    ],
    "plot (also --figures-dir), compare and accept on a read-only run": [
        "cli/test_fault_trial.py::test_a_second_user_reads_a_read_only_run_or_gets_one_line",
        "storage/test_no_traceback.py::test_a_table_this_user_may_not_read_is_a_storage_line_not_damage",
    ],
    "a parts folder made read-only mid-run": [
        "cli/test_fault_trial.py::test_parts_that_refuse_a_write_mid_run_are_one_line_and_the_rerun_resumes",
        "storage/test_no_traceback.py::test_a_storage_error_of_any_errno_is_one_line",
    ],
    "an --out with a non-UTF-8 byte, or a name component over 255 bytes": [
        "cli/test_fault_trial.py::test_out_paths_no_file_system_takes_are_one_line_on_the_command_line",
        "storage/test_no_traceback.py::test_out_paths_no_file_system_takes_are_one_line",
    ],
    "an --out deleted mid-run": [
        "cli/test_integrity_harness.py::test_an_out_removed_mid_run_is_one_line_and_the_rerun_recreates_it",
        "storage/test_no_traceback.py::test_a_run_folder_removed_mid_run_stops_the_run_and_is_not_recreated",
    ],
    "accept on an old run folder without its marker": [
        "study/test_placement.py::test_accept_says_what_a_folder_is_and_acts_only_on_runs_and_models",
    ],
    "a run inside another run's parts/": [
        "study/test_placement.py::test_a_run_inside_another_runs_parts_is_refused_before_anything_is_written",
        "study/test_placement.py::test_out_inside_another_run_is_refused_but_a_sweeps_own_runs_are_not",
    ],
    "--out at a workspace root, in a donor or a dataset folder": [
        "study/test_placement.py::test_out_in_a_model_a_dataset_or_a_workspace_root_is_refused",
    ],
    "a bad facts.jsonl found only after all batches": [
        "study/test_placement.py::test_a_bad_facts_line_is_refused_before_the_first_batch",
    ],
    "plot's disk-full and permission errors say 'it resumes'": [
        "storage/test_no_traceback.py::test_read_only_commands_never_say_it_resumes",
        "storage/test_no_traceback.py::test_only_work_its_rerun_resumes_says_it_resumes",
        "cli/test_fault_trial.py::test_a_second_user_reads_a_read_only_run_or_gets_one_line",
    ],
    "transformers' '65 > 64' warning twice under --quiet": [
        "cli/test_cli.py::test_a_command_says_a_library_warning_once_and_none_under_quiet",
        "results/test_run_log.py::test_a_library_warning_once_per_command_not_once_per_run",
        "results/test_run_log.py::test_quiet_says_no_library_warning_and_still_graft_own",
        "results/test_run_log.py::test_outside_a_run_too_a_library_warning_once_and_none_under_quiet",
    ],
}


def test_every_case_of_the_trial_is_held_by_a_test():
    assert len(CASES) == 17
    tests = ROOT / "tests"
    for case, held_by in CASES.items():
        for test in held_by:
            file, name = test.split("::")
            text = (tests / file).read_text(encoding="utf-8")
            assert re.search(rf"^def {name}\(", text, re.M), f"{case}: {test} is gone"


# ------------------------------------------------------------- the cases run here

#: ``custom`` on a tiny model with a random tiny donor (no finetune): a run in seconds.
TINY = ["--donor", "sft=tiny-llama", "--model", "tiny-llama", "--n", "1", "--n-facts", "2"]


def custom(workspace: Path, out: Path | str, *more: str) -> list[str]:
    places = ["--workspace", str(workspace), "--out", str(out)]
    return ["custom", "--spec", "LT:all:o", *TINY, "--n-boot", "10", "--quiet", *places, *more]


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Error")]


@pytest.fixture(scope="module")
def shared_run():
    """A finished tiny run in a folder other users may read, not write (pytest's own
    temporary folders are root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="graft-trial-"))
    base.chmod(0o755)
    result = CliRunner().invoke(main, custom(base / "ws", base / "run"))
    assert result.exit_code == 0, result.output
    yield base
    shutil.rmtree(base, ignore_errors=True)


#: As root, every command once on copies of the runs (each imports what it needs: the second
#: user may not read root's Python); then as the user AS_UID, the same on the runs themselves.
AS_SECOND_USER = """
import json, os, sys
from click.testing import CliRunner
from graft_experiments.cli import main

warm_up, commands = json.loads(sys.argv[1]), json.loads(sys.argv[2])

def invoke(args):
    result = CliRunner().invoke(main, args)
    crash = result.exception
    crash = None if crash is None or isinstance(crash, SystemExit) else repr(crash)
    return [result.exit_code, result.output, crash]

root = [invoke(args) for args in warm_up]
os.setgroups([])
os.setgid(int(os.environ["AS_GID"]))
os.setuid(int(os.environ["AS_UID"]))
print(json.dumps({"root": root, "user": [invoke(args) for args in commands]}))
"""


@pytest.mark.slow
def test_a_second_user_reads_a_read_only_run_or_gets_one_line(shared_run):
    """plot, compare and accept on a run this user may not write were polars' permission
    tracebacks; plot's line said "then rerun: it resumes" (#52 items 4, 5)."""
    if os.getuid() != 0:
        pytest.skip("becoming another user needs root")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' to read the run as")
    base = shared_run
    run, copy = base / "run", base / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(run, copy, copy_function=shutil.copy2)
    figures = base / "elsewhere"
    figures.mkdir(mode=0o777, exist_ok=True)
    figures.chmod(0o777)
    unmarked = base / "unmarked"  # a run with a table another tool rewrote: accept marks it
    shutil.rmtree(unmarked, ignore_errors=True)
    shutil.copytree(run, unmarked, copy_function=shutil.copy2)
    pl.read_parquet(run / "summary.parquet").write_parquet(unmarked / "summary.parquet")
    commands = [
        ["plot", "RUN"],
        ["plot", "RUN", "--figures-dir", str(figures)],
        ["compare", "RUN", "SFT", "PRE", "--n-boot", "10"],
        ["repair", "RUN"],
        ["accept", "UNMARKED"],
    ]
    home = base / "home"
    home.mkdir(mode=0o777, exist_ok=True)
    home.chmod(0o777)
    env = {
        **os.environ,
        "HOME": str(home),
        "MPLCONFIGDIR": str(home / "mpl"),
        "AS_UID": str(nobody.pw_uid),
        "AS_GID": str(nobody.pw_gid),
    }
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    # accept's root warm-up works on a copy of the unmarked run; the user's on the run itself
    warm_unmarked = base / "unmarked-warm"
    shutil.rmtree(warm_unmarked, ignore_errors=True)
    shutil.copytree(unmarked, warm_unmarked, copy_function=shutil.copy2)
    paths = {"RUN": (copy, run), "UNMARKED": (warm_unmarked, unmarked)}
    warm_up = [[str(paths[a][0]) if a in paths else a for a in c] for c in commands]
    user = [[str(paths[a][1]) if a in paths else a for a in c] for c in commands]
    done = subprocess.run(
        [sys.executable, "-c", AS_SECOND_USER, json.dumps(warm_up), json.dumps(user)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.splitlines()[-1])
    for (code, output, crash), args in zip(said["root"], commands, strict=True):
        assert crash is None and code == 0, (args, output, crash)  # root may write them all
    plot, plot_elsewhere, compare, repair, accept = said["user"]
    for (_, output, crash), args in zip(said["user"], commands, strict=True):
        assert crash is None, (args, crash)  # no traceback
        assert "Traceback" not in output, (args, output)
    # plot: one line naming the way out, and no promise of a resume
    assert plot[0] == 2 and len(error_lines(plot[1])) == 1, plot
    (line,) = error_lines(plot[1])
    assert "Permission denied" in line and "--figures-dir" in line and "resumes" not in line
    # plot elsewhere, compare and repair read the run: as root's on its copy
    assert plot_elsewhere[0] == 0, plot_elsewhere
    assert sorted(p.name for p in figures.glob("*.png")) == sorted(
        p.name for p in (copy / "figures").glob("*.png")
    )
    assert compare[0] == 0 and compare[1] == said["root"][2][1], compare
    assert repair[0] == 0, repair
    # accept may not write the record: one line, and the table stays unmarked and unlisted
    assert accept[0] == 2 and len(error_lines(accept[1])) == 1, accept
    assert "Permission denied" in accept[1] and "resumes" not in accept[1], accept
    assert "accepted" not in json.loads((unmarked / "config.json").read_text())
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing written


@pytest.mark.slow
def test_parts_that_refuse_a_write_mid_run_are_one_line_and_the_rerun_resumes(
    tmp_path, monkeypatch
):
    """A parts folder made read-only while the run writes it: polars' PermissionError,
    whose errno is only in its text, was a traceback."""
    args = custom(tmp_path / "ws", tmp_path / "run", "--rows-per-forward", "2")
    clean = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "clean")])  # last wins
    assert clean.exit_code == 0, clean.output
    write_parquet = pl.DataFrame.write_parquet

    def denied_at_part_2(self, file, *a, **kw):
        if Path(file).name.startswith(".2.parquet."):
            raise PermissionError(f"Permission denied (os error 13): {file}")
        return write_parquet(self, file, *a, **kw)

    monkeypatch.setattr(pl.DataFrame, "write_parquet", denied_at_part_2)
    stopped = CliRunner().invoke(main, args)
    assert stopped.exit_code == 2 and stopped.exception is not None, stopped.output
    assert isinstance(stopped.exception, SystemExit)  # no traceback
    (line,) = error_lines(stopped.output)
    assert "Permission denied" in line and "2.parquet" in line
    assert line.endswith("then rerun: it resumes where this run stopped")  # a run resumes
    parts = tmp_path / "run" / "parts" / "examples"
    assert sorted(p.name for p in parts.iterdir()) == ["0.parquet", "1.parquet"]
    monkeypatch.undo()  # the folder writable again
    resumed = CliRunner().invoke(main, args)
    assert resumed.exit_code == 0, resumed.output
    for table in ("examples", "summary"):  # the tables of a run never stopped
        got = pl.read_parquet(tmp_path / "run" / f"{table}.parquet")
        assert got.equals(pl.read_parquet(tmp_path / "clean" / f"{table}.parquet")), table


def test_out_paths_no_file_system_takes_are_one_line_on_the_command_line(tmp_path):
    """An --out with a byte that is no UTF-8, or a name over 255 bytes, was a traceback."""
    bad_utf8 = os.fsdecode(bytes(tmp_path) + b"/bad\xffname")
    too_long = str(tmp_path / ("x" * 300) / "run")
    for out in (bad_utf8, too_long):
        result = CliRunner().invoke(main, custom(tmp_path / "ws", out))
        assert result.exit_code == 2, result.output
        assert isinstance(result.exception, SystemExit)  # no traceback
        assert len(error_lines(result.output)) == 1, result.output
    assert sorted(os.listdir(tmp_path)) == []  # nothing written, no workspace either
    result = CliRunner().invoke(main, ["plot", str(tmp_path), "--figures-dir", bad_utf8])
    assert result.exit_code == 2 and len(error_lines(result.output)) == 1, result.output
