"""``graft-exp study plan|run|status|collect FILE``: thin over graft.study's studies (tested
in tests/study/test_studies.py); a bad file is one error line, exit 2, nothing written; a
failed run makes ``run`` exit 1 after the others ran."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

import graft.study.studies.execute as execute
from graft_experiments.cli import main
from tests.study.study_files import TINY_OPTIONS, tree, write_study

pytestmark = pytest.mark.usefixtures("one_thread")

ONE = 'models = ["tiny-llama"]\nexperiments = ["position"]\n' + TINY_OPTIONS


def _study(tmp_path: Path, *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main, ["study", *args])
    assert result.exit_code == code, result.output
    return result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour = 'red'\n" + ONE, "unknown key 'colour'"),
        (ONE.replace('["position"]', '["position", "banana"]'), "unknown experiment 'banana'"),
        (ONE.replace('models = ["tiny-llama"]\n', ""), "no models; add models = "),
    ],
)
@pytest.mark.parametrize("command", ["plan", "run", "status", "collect", "submit"])
def test_a_bad_file_is_one_line_exit_2_and_nothing_written(tmp_path, text, message, command):
    path = write_study(tmp_path, text)
    out = _study(tmp_path, command, str(path), code=2)
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in out
    assert tree(tmp_path) == ["study.toml"]


def test_plan_and_status_write_nothing(tmp_path):
    path = write_study(
        tmp_path, ONE.replace("experiments =", "finetune_seeds = [0, 1]\nexperiments =")
    )
    out = _study(tmp_path, "plan", str(path))
    assert out.startswith(f"plan of study {path} (nothing loaded, nothing written):")
    assert "donors: 2 (2 to finetune" in out and "tiny-llama/seed1/position: " in out
    out = _study(tmp_path, "status", str(path))
    assert "tiny-llama/seed0/position: not started" in out
    assert out.splitlines()[-1] == "study: 2 runs: 2 not started"
    assert tree(tmp_path) == ["study.toml"]


def test_run_exits_1_naming_the_failed_runs_after_running_the_others(tmp_path, monkeypatch):
    path = write_study(tmp_path, ONE.replace('["position"]', '["position", "necessity"]'))
    monkeypatch.setattr(execute, "run_donor_job", lambda *a, **k: None)

    def fake_run(design, echo=None):
        if design.experiment == "position":
            raise RuntimeError("out of luck")

    monkeypatch.setattr(execute, "run_design", fake_run)
    out = _study(tmp_path, "run", str(path), code=1)
    assert "run failed: tiny-llama/seed0/position: RuntimeError: out of luck" in out
    assert "run tiny-llama/seed0/necessity" in out  # after the failure
    assert out.splitlines()[-1].startswith("Error: 1 of 2 runs failed (tiny-llama/seed0/position)")
    status = _study(tmp_path, "status", str(path))
    assert "tiny-llama/seed0/position: failed (RuntimeError: out of luck)" in status


@pytest.mark.slow
def test_run_status_collect_one_tiny_run(tmp_path):
    path = write_study(tmp_path, ONE)
    out = _study(tmp_path, "run", "--quiet", str(path))
    assert "study: 1 runs done, 0 failed" in out
    assert "tiny-llama/seed0/position: done" in _study(tmp_path, "status", str(path))
    out = _study(tmp_path, "collect", str(path))
    collected = tmp_path / "runs" / "collected"
    assert f"into {collected}" in out and "position_acc5.png" in out
    table = pl.read_parquet(collected / "summary.parquet")
    own = pl.read_parquet(
        tmp_path / "runs" / "tiny-llama" / "seed0" / "position" / "summary.parquet"
    )
    assert table.select(own.columns).equals(own)
    assert (collected / "provenance.json").is_file() and (collected / "summary.csv").is_file()
