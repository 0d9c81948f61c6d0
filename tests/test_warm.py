"""tests/warm.py: a warm child behaves as ``python -c`` would, and starts cold when the
environment differs in what imports read."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests import warm

pytestmark = pytest.mark.slow  # starts the fork server: imports the command line once


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def test_a_warm_child_is_python_minus_c(tmp_path: Path) -> None:
    code = (
        "import atexit, os, sys, torch\n"
        "atexit.register(lambda: print('at exit'))\n"
        "print(sys.argv, os.getcwd(), os.environ['GRAFT_ANSWER'], torch.get_num_threads())\n"
        "sys.stdout.flush()\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(3)"
    )
    before = warm.STARTS["warm"]
    done = warm.run_python(code, ["a", "b c"], env=env(GRAFT_ANSWER="42"), cwd=tmp_path)
    assert warm.STARTS["warm"] == before + 1
    assert done.returncode == 3
    assert done.stdout.splitlines() == [
        f"['-c', 'a', 'b c'] {tmp_path} 42 1",
        "to stderr",
        "at exit",
    ]


def test_an_exception_is_a_traceback_and_exit_1(tmp_path: Path) -> None:
    assert warm.differing(env()) == []
    done = warm.run_python("raise ValueError('boom')", [], env=env(), cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" in done.stdout and "ValueError: boom" in done.stdout


def test_a_kill_is_a_real_sigkill(tmp_path: Path) -> None:
    code = "import time\nprint('started', flush=True)\ntime.sleep(60)\nprint('never')"
    done = warm.run_python(code, [], env=env(), cwd=tmp_path, kill_after=2.0)
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == "started\n"


def test_what_imports_read_must_match_or_the_child_starts_cold(tmp_path: Path) -> None:
    code = "import os; print(os.environ.get('HF_HUB_OFFLINE'), os.environ.get('PYTEST_X'))"
    starts = dict(warm.STARTS)
    done = warm.run_python(code, [], env=env(PYTEST_X="free"), cwd=tmp_path)
    assert done.stdout == f"{os.environ.get('HF_HUB_OFFLINE')} free\n"
    assert warm.STARTS["warm"] == starts.get("warm", 0) + 1
    done = warm.run_python(code, [], env=env(HF_HUB_OFFLINE="0"), cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "0 None\n"
    assert warm.STARTS["cold"] == starts.get("cold", 0) + 1
