"""A workspace shared by users (issue #52): what graft writes (dataset, donor with its weights,
run folder, lock files) gets the user's umask's modes, and a second user who may only read
the workspace runs on it to the same tables."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.cli.tiny_runs import tiny_args

pytestmark = pytest.mark.slow  # whole commands: a 1-step finetune and a run, 20-40 s each

#: One command in a fresh process: ``MASK ARGS_JSON OUT [WARM]``. With ``WARM`` it first runs
#: as root into ``WARM`` (which imports every module the command needs: the second user cannot
#: read root's Python under /root), then becomes the user ``nobody`` and runs into ``OUT``.
SCRIPT = """
import json, os, sys
from graft_experiments.cli import main

mask, args, out, warm = int(sys.argv[1], 8), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4:]
os.umask(mask)

def run(where):
    main([*args, "--out", where], standalone_mode=False)

if warm:
    run(warm[0])
    os.setgroups([])
    os.setgid(int(os.environ["AS_GID"]))
    os.setuid(int(os.environ["AS_UID"]))
run(out)
"""


def _command(mask: int, args: list[str], out: Path, warm: Path | None, env: dict[str, str]):
    extra = [] if warm is None else [str(warm)]
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, f"{mask:o}", json.dumps(args), str(out), *extra],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _modes(root: Path) -> dict[str, set[int]]:
    """The permission bits of every folder and every file under ``root``."""
    found: dict[str, set[int]] = {"folders": set(), "files": set()}
    for path in root.rglob("*"):
        kind = "folders" if path.is_dir() else "files"
        found[kind].add(path.stat().st_mode & 0o777)
    return found


def _snapshot(ws: Path) -> dict[Path, int]:
    """Every path of the workspace but its lock files, with its mtime."""
    return {p: p.stat().st_mtime_ns for p in ws.rglob("*") if ".locks" not in p.parts}


@pytest.fixture
def shared_base():
    """A folder other users can reach (pytest's own temp folders are root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="graft-shared-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("mask", [0o022, 0o027], ids=["umask022", "umask027"])
def test_a_workspace_gets_the_umask_modes_and_a_second_user_reads_it(shared_base, mask):
    ws, run = shared_base / "ws", shared_base / "run"
    args = ["position", *tiny_args(ws, n_facts=10, n=2, templates="qa")]
    args[args.index("--finetune-max-steps") + 1] = "1"
    home = shared_base / "home"
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    env = {"HOME": str(home), "MPLCONFIGDIR": str(home / "mpl")}
    _command(mask, args, run, None, env)
    donors = list(ws.rglob("model.safetensors"))
    assert donors  # a finetuned donor, with the weights safetensors writes 0600
    assert list(ws.rglob("manifest.json"))  # a dataset
    assert (run / "summary.parquet").is_file()
    # every file and folder graft made, weights and lock files too: the umask's modes
    for where in (ws, run):
        assert _modes(where) == {"folders": {0o777 & ~mask}, "files": {0o666 & ~mask}}, where
    if mask != 0o022:
        return
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' to read the workspace as")
    if os.getuid() != 0:
        pytest.skip("becoming another user needs root")
    # the second user: may read the workspace (0644, 0755 and root's), not write it
    before = _snapshot(ws)
    mine = home / "run"
    env |= {"AS_UID": str(nobody.pw_uid), "AS_GID": str(nobody.pw_gid)}
    _command(mask, args, mine, shared_base / "warm", env)
    assert mine.stat().st_uid == nobody.pw_uid  # written by the second user
    assert _snapshot(ws) == before  # the workspace as it was (the root's warm-up ran on it too)
    assert not [p for p in ws.rglob("*") if p.stat().st_uid == nobody.pw_uid]
    import polars as pl

    for table in ("summary.parquet", "examples.parquet"):
        assert pl.read_parquet(mine / table).equals(pl.read_parquet(run / table)), table
