"""``pytest --graft-device cuda``: the suite on a GPU (scripts/gpu_checks.sh runs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_the_device_option_runs_the_suite_there_or_says_why_not():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--graft-device",
            "cuda",
            "tests/core/execution/test_hooked.py",
            "-k",
            "put_back",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if torch.cuda.is_available():  # a GPU machine: the tests pass there
        assert done.returncode == 0, done.stdout[-2000:]
    else:
        assert done.returncode == 2, done.stdout[-2000:]
        assert "this machine has no CUDA device; drop the option" in done.stdout + done.stderr
