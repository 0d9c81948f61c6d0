"""A job array on one workspace: several ``graft-exp`` processes started together.

Four ``graft-exp position`` processes start at once on one workspace, all needing the same
not-yet-generated dataset and not-yet-trained donor; two of them write the same ``--out``.
Each process counts (in a shared file) the finetunes and engine calls it makes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.cli.tiny_runs import tiny_args

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: ``graft-exp ARGS`` with the finetune and the engine calls counted into $GRAFT_TEST_COUNTS.
DRIVER = """
import os, sys
import graft.study.training.finetune as finetune, graft.study.running.batches as batches

def counted(module, name, tag):
    original = getattr(module, name)
    def wrapper(*args, **kwargs):
        with open(os.environ["GRAFT_TEST_COUNTS"], "a") as f:
            f.write(f"{tag} {os.getpid()}\\n")
        return original(*args, **kwargs)
    setattr(module, name, wrapper)

counted(finetune, "_train", "finetune")
counted(batches, "_row_metrics", "engine")
from graft_experiments.cli import main
main(sys.argv[1:])
"""


def test_a_job_array_trains_each_donor_once_and_every_job_finishes(tmp_path):
    workspace, counts = tmp_path / "workspace", tmp_path / "counts.txt"
    common = ["position", *tiny_args(workspace, n_boot=20, templates="headline")]
    outs = [tmp_path / "run1", tmp_path / "run2", tmp_path / "run3", tmp_path / "run3"]
    env = {**os.environ, "GRAFT_TEST_COUNTS": str(counts), "OMP_NUM_THREADS": "1"}
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", DRIVER, *common, "--out", str(out)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for out in outs
    ]
    outputs = [job.communicate(timeout=600)[0] for job in jobs]
    for job, output in zip(jobs, outputs, strict=True):
        assert job.returncode == 0, output

    tags = [line.split()[0] for line in counts.read_text().splitlines()]
    assert tags.count("finetune") == 1, outputs  # the donor is trained once, for all four
    assert tags.count("engine") == 3, outputs  # run3's second process computes nothing
    assert not list(workspace.rglob("*.partial")), "a stale partial finetune is left"
    datasets = [p for p in (workspace / "datasets").iterdir() if not p.name.startswith(".")]
    assert len(datasets) == 1
    tables = [pl.read_parquet(out / "examples.parquet") for out in outs[:3]]
    assert all(t.equals(tables[0]) for t in tables[1:])
    third = [o for o, out in zip(outputs, outs, strict=True) if out == outs[2]]
    all_done = re.compile(r"in (\d+) batches \(\1 already done\)")
    assert any("another process is running position" in o or all_done.search(o) for o in third)
