"""Crash and corruption harnesses, as trusted stores have them.

Both run the real command line in subprocesses on a tiny model (``graft-exp position``: it
generates a dataset, finetunes a donor, runs the engine in several batches, writes tables
and figures):

- **crash**: a run is killed with SIGKILL at seeded random moments -- at the n-th call of a
  save (inside a checkpoint's weights, optimizer or scheduler save; after a result part is
  written but before it is renamed into place; before any atomic rename; before an engine
  call) or after a random delay -- then rerun once with the same command. The rerun must
  exit 0 with the same tables and donor weights as an uninterrupted run, and leave no
  temporary or partial file: no manual step.
- **corruption**: each kind of file graft reads (donor weights, donor config and checksums,
  dataset files, result parts, derived tables and their CSV mirror, the run's config) is
  damaged -- bytes flipped, truncated, emptied, swapped with the same file of another valid
  run, rewritten by polars without graft's marks, hand-edited, deleted -- and the commands
  that read it (the rerun, ``compare``, ``plot``) are run. Each must end in a one-line error
  (exit 2, no traceback) or in a correct recomputation (exit 0, tables equal to the clean
  run's); never exit 0 with other numbers.
- **record and tables**: a resumed run with another ``--n-boot``, and ``graft-exp accept``
  of a run with unmarked tables, are killed at each of their renames: config.json always
  describes the tables, and no table passes as graft's own without being listed as accepted.

``GRAFT_HARNESS_TRIALS`` sets the number of crash trials (default 8); the trial seed is
fixed, so a failure reproduces.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from tests.warm import run_python

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SEED = 24
#: ``graft-exp ARGS``, with the save points counted into $GRAFT_COUNT_FILE (JSON at exit) and
#: a SIGKILL at the $GRAFT_KILL (``point:n``) n-th call of a point.
DRIVER = """
import atexit, json, os, signal, sys
import polars, torch
import transformers.modeling_utils as modeling_utils
import graft.study.running.batches as batches

point, _, nth = os.environ.get("GRAFT_KILL", ":0").partition(":")
nth = int(nth)
calls = {}

def hit(name):
    calls[name] = calls.get(name, 0) + 1
    if name == point and calls[name] == nth:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("GRAFT_REMOVE_AT") == f"{name}:{calls[name]}":  # --out deleted mid-run
        import shutil
        shutil.rmtree(os.environ["GRAFT_REMOVE_OUT"])

def wrap(owner, attr, name, after=False):
    original = getattr(owner, attr)
    def wrapper(*args, **kwargs):
        if not after:
            hit(name)
        result = original(*args, **kwargs)
        if after:
            hit(name)
        return result
    setattr(owner, attr, wrapper)

wrap(modeling_utils, "safe_save_file", "weights")      # a checkpoint's (or donor's) weights
wrap(torch, "save", "torch_save")                       # optimizer, scheduler, rng state
wrap(polars.DataFrame, "write_parquet", "parquet", after=True)  # written, not yet renamed
wrap(os, "replace", "replace")                          # every atomic rename
wrap(batches, "_row_metrics", "engine")                    # an engine call
if os.environ.get("GRAFT_COUNT_FILE"):
    atexit.register(lambda: open(os.environ["GRAFT_COUNT_FILE"], "w").write(json.dumps(calls)))
from graft_experiments.cli import main
main(sys.argv[1:])
"""
POINTS = ("weights", "torch_save", "parquet", "replace", "engine")


def position_args(workspace: Path, out: Path, *extra: str) -> list[str]:
    return [
        "position",
        "--model",
        "tiny-llama",
        "--workspace",
        str(workspace),
        "--out",
        str(out),
        "--n-facts",
        "10",
        "--n",
        "2",
        "--n-boot",
        "20",
        "--templates",
        "headline",
        "--rows-per-forward",
        "4",
        "--quiet",
        *extra,
    ]


def graft_exp(
    args: list[str], *, env: dict[str, str] | None = None, kill_after: float | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``graft-exp args`` through the driver (one torch thread: bit-identical reruns), in
    a process of its own started warm (tests/warm.py): a SIGKILL still kills a real process."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return run_python(DRIVER, args, env=full_env, cwd=ROOT, kill_after=kill_after)


def tables(out: Path) -> dict[str, pl.DataFrame]:
    return {
        name: pl.read_parquet(out / f"{name}.parquet")
        for name in ("examples", "summary", "contrasts")
    }


def donor_weights(workspace: Path) -> bytes:
    (weights,) = (workspace / "finetuned").rglob("model.safetensors")
    return weights.read_bytes()


def leftovers(*folders: Path) -> list[Path]:
    """Temporary or unfinished files a clean finish must not leave behind."""
    found: list[Path] = []
    for folder in folders:
        found += [p for p in folder.rglob("*") if p.name.endswith((".tmp", ".partial"))]
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An uninterrupted run (its save points counted) and a second run of other settings
    (another data seed and donor seed) whose files the corruption harness swaps in."""
    root = tmp_path_factory.mktemp("reference")
    counts = root / "counts.json"
    start = time.monotonic()
    done = graft_exp(
        position_args(root / "ws", root / "run"), env={"GRAFT_COUNT_FILE": str(counts)}
    )
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stdout
    other = graft_exp(
        position_args(
            root / "ws_other", root / "run_other", "--data-seed", "1", "--finetune-seeds", "1"
        )
    )
    assert other.returncode == 0, other.stdout
    compared = graft_exp(COMPARE(root / "run"))
    assert compared.returncode == 0, compared.stdout
    return {
        "root": root,
        "counts": json.loads(counts.read_text()),
        "seconds": seconds,
        "tables": tables(root / "run"),
        "weights": donor_weights(root / "ws"),
        "compare": compared.stdout,
        "figures": figures(root / "run"),
        "summary_csv": (root / "run" / "summary.csv").read_text(),
    }


#: What compare and plot say when they rewrite an edited CSV mirror.
MIRROR_WARNING = "(edited or stale); rewritten from the checked table"


def COMPARE(out: Path) -> list[str]:  # noqa: N802 - a command line, like position_args
    return ["compare", str(out), "FE+LT", "SFT"]


def figures(out: Path) -> dict[str, bytes]:
    """The run's PNG figures (matplotlib writes them without a date: bytes compare)."""
    return {p.name: p.read_bytes() for p in sorted((out / "figures").glob("*.png"))}


def crash_trials(counts: dict[str, int], n: int, seconds: float) -> list[tuple[str, int | float]]:
    """``n`` seeded (point, n-th call) or ("delay", seconds) kill moments; a delay falls
    within the 5-95% of ``seconds``, an uninterrupted run's wall time."""
    rng = random.Random(SEED)
    trials: list[tuple[str, int | float]] = []
    for _ in range(n):
        points = [p for p in POINTS if counts.get(p)]
        choice = rng.choice([*points, "delay"])
        if choice == "delay":
            trials.append(("delay", round(rng.uniform(0.05, 0.95) * seconds, 2)))
        else:
            trials.append((choice, rng.randint(1, counts[choice])))
    return trials


def test_killed_at_random_moments_the_rerun_gives_the_same_tables(reference, tmp_path):
    counts = reference["counts"]
    assert all(counts.get(p) for p in POINTS), counts  # every save point was reached
    n = int(os.environ.get("GRAFT_HARNESS_TRIALS", "8"))
    for i, (point, when) in enumerate(crash_trials(counts, n, reference["seconds"])):
        workspace, out = tmp_path / f"ws{i}", tmp_path / f"run{i}"
        args = position_args(workspace, out)
        if point == "delay":
            killed = graft_exp(args, kill_after=float(when))
        else:
            killed = graft_exp(args, env={"GRAFT_KILL": f"{point}:{when}"})
            assert killed.returncode == -signal.SIGKILL, (point, when, killed.stdout)
        rerun = graft_exp(args)
        trial = f"trial {i}: killed at {point} {when}"
        assert rerun.returncode == 0, f"{trial}\n{rerun.stdout}"
        assert "Traceback" not in rerun.stdout, f"{trial}\n{rerun.stdout}"
        got = tables(out)
        for name, table in reference["tables"].items():
            assert got[name].equals(table), f"{trial}: {name} differs"
        assert donor_weights(workspace) == reference["weights"], f"{trial}: donor differs"
        assert not leftovers(workspace, out), f"{trial}: left {leftovers(workspace, out)}"


# ---------------------------------------------------------------- corruption


def flip(path: Path) -> None:
    """Garble 64 bytes in the middle of the file."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for k in range(middle, min(middle + 64, len(data))):
        data[k] ^= 0x5A
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def edit_prompt(path: Path) -> None:
    """Change a test prompt's text, the file staying valid JSON lines."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0]["text"] = rows[0]["text"].replace(" ", "  ", 1)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def wrong_width(path: Path) -> None:
    config = json.loads(path.read_text())
    config["hidden_size"] = config["hidden_size"] * 2
    path.write_text(json.dumps(config))


def rewrite(path: Path) -> None:
    """Another tool's rewrite of a table: read with polars, one value changed, written back
    without graft's marks (its parquet metadata)."""
    df = pl.read_parquet(path)
    for name, dtype in df.schema.items():
        if dtype == pl.Boolean:
            df = df.with_columns(
                pl.when(pl.int_range(pl.len()) == 0)
                .then(~pl.col(name))
                .otherwise(pl.col(name))
                .alias(name)
            )
            break
        if dtype.is_float():
            df = df.with_columns(
                pl.when(pl.int_range(pl.len()) == 0).then(0.0).otherwise(pl.col(name)).alias(name)
            )
            break
    df.write_parquet(path)


def edit_csv(path: Path) -> None:
    """A hand edit of a CSV mirror: its first number changed."""
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = re.sub(r"\b0\.\d+", "0.123", lines[1], count=1)
    path.write_text("".join(lines))


def delete(path: Path) -> None:
    path.unlink()


def fifo(path: Path) -> None:
    """A FIFO in the file's place: opening it would wait for a writer forever."""
    path.unlink()
    os.mkfifo(path)


DAMAGES: dict[str, Callable[[Path], None]] = {
    "flip": flip,
    "truncate": truncate,
    "empty": empty,
    "rewrite": rewrite,
    "edit_csv": edit_csv,
    "delete": delete,
    "fifo": fifo,
}


def find(root: Path, pattern: str) -> Path:
    found = sorted(root.glob(pattern))
    assert found, f"no {pattern} under {root}"
    return found[0]


#: (what, where: root-relative glob within the workspace "ws" or the run folder "run",
#: damages that apply). "swap" puts the same file of the other run in its place.
FILES = [
    ("donor weights", "ws/finetuned/**/model.safetensors", ["flip", "truncate", "empty", "swap"]),
    ("donor config", "ws/finetuned/**/config.json", ["flip", "truncate", "wrong_width", "swap"]),
    ("donor checksums", "ws/finetuned/**/checksums.json", ["flip", "truncate", "empty", "delete"]),
    ("donor evaluation", "ws/finetuned/**/eval.json", ["truncate"]),
    ("donor data manifest", "ws/finetuned/**/data_manifest.json", ["fifo"]),
    ("test prompts", "ws/datasets/*/test_prompts.jsonl", ["edit", "truncate", "swap"]),
    ("training texts", "ws/datasets/*/train.jsonl", ["flip"]),
    ("dataset manifest", "ws/datasets/*/manifest.json", ["flip", "truncate", "empty", "fifo"]),
    (
        "result part",
        "run/parts/examples/0.parquet",
        ["flip", "truncate", "empty", "swap", "rewrite", "fifo"],
    ),
    ("last result part", "run/parts/examples/3.parquet", ["swap"]),
    ("examples table", "run/examples.parquet", ["flip", "truncate", "swap", "rewrite", "fifo"]),
    ("summary table", "run/summary.parquet", ["flip", "truncate", "swap", "rewrite"]),
    ("summary mirror", "run/summary.csv", ["edit_csv", "fifo"]),
    ("contrasts table", "run/contrasts.parquet", ["flip", "empty"]),
    ("drop report", "run/drops.json", ["truncate"]),
    ("run config", "run/config.json", ["flip", "truncate", "empty", "fifo"]),
]


def damage(path: Path, how: str, root: Path, pattern: str) -> None:
    if how == "swap":
        other = pattern.replace("ws/", "ws_other/", 1).replace("run/", "run_other/", 1)
        shutil.copyfile(find(root, other), path)
    elif how == "edit":
        edit_prompt(path)
    elif how == "wrong_width":
        wrong_width(path)
    else:
        DAMAGES[how](path)


def one_line_or_correct(done: subprocess.CompletedProcess[str], check: Callable[[], None]) -> str:
    """``""`` when ``done`` is a one-line error (exit 2) or a success whose tables are right
    (``check`` raises otherwise); else what went wrong."""
    if "Traceback" in done.stdout:
        return f"traceback:\n{done.stdout[-3000:]}"
    if done.returncode == 2:
        errors = [line for line in done.stdout.splitlines() if line.startswith("Error")]
        return "" if len(errors) == 1 else f"exit 2 without one Error line:\n{done.stdout}"
    if done.returncode != 0:
        return f"exit {done.returncode}:\n{done.stdout[-3000:]}"
    try:
        check()
    except AssertionError as err:
        return f"exit 0 with other numbers: {err}"
    return ""


@pytest.mark.parametrize(
    ("what", "pattern", "how"),
    [(what, pattern, how) for what, pattern, hows in FILES for how in hows],
)
def test_a_damaged_file_is_one_line_or_recomputed(reference, tmp_path, what, pattern, how):
    root: Path = reference["root"]
    # the same paths as the clean run (the run's config records them): work on it, restore
    work = tmp_path / "pristine"
    for folder in ("ws", "run"):
        shutil.copytree(root / folder, work / folder, copy_function=shutil.copy2)
    try:
        damage(find(root, pattern), how, root, pattern)
        out, workspace = root / "run", root / "ws"

        def same_compare(done: subprocess.CompletedProcess[str]) -> Callable[[], None]:
            def check() -> None:
                # an edited mirror is rewritten with a warning line; the numbers are the same
                lines = done.stdout.splitlines(keepends=True)
                printed = "".join(line for line in lines if MIRROR_WARNING not in line)
                assert printed == reference["compare"], "compare printed other numbers"
                if how == "edit_csv":
                    assert len(lines) == len(printed.splitlines()) + 1, "no warning said"

            return check

        def same_figures() -> None:
            assert figures(out) == reference["figures"], "plot drew other figures"

        def same_tables() -> None:
            got = tables(out)
            for name, table in reference["tables"].items():
                assert got[name].equals(table), f"{name} differs"

        # the readers of a run folder first (on the damaged folder), then the rerun, which
        # may repair it; compare and plot read nothing of the workspace
        problems = []
        if pattern.startswith("run/"):
            compared = graft_exp(COMPARE(out))
            problems.append(("compare", one_line_or_correct(compared, same_compare(compared))))
            plotted = graft_exp(["plot", str(out)])
            problems.append(("plot", one_line_or_correct(plotted, same_figures)))
            if how == "edit_csv":  # compare and plot check the mirror and rewrite it
                restored = (out / "summary.csv").read_text() == reference["summary_csv"]
                problems.append(("mirror", "" if restored else "summary.csv was not rewritten"))
        rerun = graft_exp(position_args(workspace, out))
        problems.append(("rerun", one_line_or_correct(rerun, same_tables)))
        found = [f"{command}: {problem}" for command, problem in problems if problem]
        assert not found, f"{what} {how}:\n" + "\n".join(found)
    finally:
        for folder in ("ws", "run"):
            shutil.rmtree(root / folder)
            shutil.copytree(work / folder, root / folder, copy_function=shutil.copy2)


def test_an_out_removed_mid_run_is_one_line_and_the_rerun_recreates_it(reference, tmp_path):
    """Was a traceback in the figures step, then a rerun that refused the folder graft had
    re-created (parts without a marker) (issue #52 item 4)."""
    workspace, out = reference["root"] / "ws", tmp_path / "run"
    args = position_args(workspace, out)
    env = {"GRAFT_REMOVE_AT": "parquet:2", "GRAFT_REMOVE_OUT": str(out)}
    removed = graft_exp(args, env=env)
    assert removed.returncode == 2, removed.stdout
    assert "Traceback" not in removed.stdout
    errors = [line for line in removed.stdout.splitlines() if line.startswith("Error")]
    # removed between two parts, or (here) while a part is written: one line either way
    said = ("removed or moved while this run wrote it", "No such file or directory")
    assert len(errors) == 1 and any(s in errors[0] for s in said), errors
    assert not out.exists()  # nothing of it re-created
    rerun = graft_exp(args)
    assert rerun.returncode == 0, rerun.stdout
    got = tables(out)
    for name, table in reference["tables"].items():
        assert got[name].equals(table), f"{name} differs"


# ---------------------------------------------------------------- a record and its tables


def test_a_rerun_with_another_n_boot_killed_at_any_rename_never_shows_a_mismatch(
    reference, tmp_path
):
    """A resumed run with a changed option killed at each of its renames: config.json then
    describes the tables plot draws (the old record over the old tables, or the new over
    the new), or plot refuses in one line; never exit 0 over tables of other options."""
    root: Path = reference["root"]
    out, workspace = root / "run", root / "ws"
    work = tmp_path / "pristine"
    shutil.copytree(out, work, copy_function=shutil.copy2)
    args = position_args(workspace, out, "--n-boot", "10")  # the last --n-boot wins

    def restore() -> None:
        shutil.rmtree(out)
        shutil.copytree(work, out, copy_function=shutil.copy2)

    try:
        counts = tmp_path / "counts.json"
        clean = graft_exp(args, env={"GRAFT_COUNT_FILE": str(counts)})
        assert clean.returncode == 0, clean.stdout
        derived = ("summary", "contrasts")
        drawn = {20: reference["tables"], 10: tables(out)}
        assert any(not drawn[20][t].equals(drawn[10][t]) for t in derived)  # it shows
        renames = json.loads(counts.read_text())["replace"]
        for n in range(1, renames + 1):
            restore()
            killed = graft_exp(args, env={"GRAFT_KILL": f"replace:{n}"})
            assert killed.returncode == -signal.SIGKILL, (n, killed.stdout)
            said = json.loads((out / "config.json").read_text())["options"]["n_boot"]
            plotted = graft_exp(["plot", str(out)])

            def same_tables(said: int = said) -> None:
                for name in derived:  # what plot drew (summary) and compare reads with it
                    got = pl.read_parquet(out / f"{name}.parquet")
                    assert got.equals(drawn[said][name]), f"config.json says {said}: {name}"

            problem = one_line_or_correct(plotted, same_tables)
            assert not problem, f"killed at rename {n} of {renames}: {problem}"
            if plotted.returncode == 2:
                assert "same --out" in plotted.stdout, plotted.stdout
    finally:
        restore()


#: The tables the accept harness rewrites without graft's marks (run-folder relative).
UNMARKED_TABLES = ("summary.parquet", "parts/examples/0.parquet")


def listed_as_accepted(out: Path) -> set[str]:
    """The files the run's config.json lists as accepted (pending or done)."""
    entries = json.loads((out / "config.json").read_text()).get("accepted") or []
    return {f for entry in entries for f in entry.get("files", [])}


def test_accept_killed_at_any_rename_leaves_nothing_half_accepted(reference, tmp_path):
    """``graft-exp accept`` killed at each of its renames (issue #52 item 3): no table that
    passes as graft's own (marked) is left unlisted in config.json; the next accept
    completes the record (nothing pending) with the tables a clean accept gives, and plot
    then draws the run."""
    from graft.storage.tables import is_marked

    out = reference["root"] / "run"
    work = tmp_path / "pristine"
    shutil.copytree(out, work, copy_function=shutil.copy2)

    def unmarked_run() -> None:  # the run with two tables another tool rewrote
        shutil.rmtree(out)
        shutil.copytree(work, out, copy_function=shutil.copy2)
        for name in UNMARKED_TABLES:
            rewrite(out / name)
            assert not is_marked(out / name)

    try:
        unmarked_run()
        counts = tmp_path / "counts.json"
        clean = graft_exp(["accept", str(out)], env={"GRAFT_COUNT_FILE": str(counts)})
        assert clean.returncode == 0, clean.stdout
        assert listed_as_accepted(out) == set(UNMARKED_TABLES)
        accepted = {name: pl.read_parquet(out / name) for name in UNMARKED_TABLES}
        renames = json.loads(counts.read_text())["replace"]
        assert renames >= len(UNMARKED_TABLES) + 2  # the record before and after, each table
        for n in range(1, renames + 1):
            unmarked_run()
            killed = graft_exp(["accept", str(out)], env={"GRAFT_KILL": f"replace:{n}"})
            assert killed.returncode == -signal.SIGKILL, (n, killed.stdout)
            listed = listed_as_accepted(out)
            half = [t for t in UNMARKED_TABLES if is_marked(out / t) and t not in listed]
            assert not half, f"killed at rename {n} of {renames}: {half} marked, not listed"
            again = graft_exp(["accept", str(out)])
            assert again.returncode == 0, f"rename {n}: {again.stdout}"
            entries = json.loads((out / "config.json").read_text())["accepted"]
            assert len(entries) == 1 and "pending" not in entries[0], (n, entries)
            assert set(entries[0]["files"]) == set(UNMARKED_TABLES), (n, entries)
            for name, table in accepted.items():
                assert pl.read_parquet(out / name).equals(table), f"rename {n}: {name}"
        plotted = graft_exp(["plot", str(out)])
        assert plotted.returncode == 0, plotted.stdout
    finally:
        shutil.rmtree(out)
        shutil.copytree(work, out, copy_function=shutil.copy2)
