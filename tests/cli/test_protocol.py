"""``--protocol paper`` end to end: ``graft-exp position`` on a tiny model and what its run
folder records (the other commands: ``test_protocol_commands.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from graft_experiments.cli import main
from tests.cli.tiny_runs import tiny_args

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _invoke(args: list[str]):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def _options(workspace: Path) -> list[str]:
    return tiny_args(workspace, n_facts=6, n_boot=20)


@pytest.fixture(scope="module")
def paper_run(workspace, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "paper"
    result = _invoke(["position", "--protocol", "paper", *_options(workspace), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_position_under_the_paper_protocol_runs_and_records_it(paper_run):
    config = json.loads((paper_run / "config.json").read_text())
    assert config["options"]["protocol"] == "paper"
    assert config["options"]["head_policy"] == "paper"
    assert config["options"]["dtype"] == "float32"  # as the authors, on any device
    donor = Path(config["donors"]["sft"]["path"])
    # the both-direction donor, trained on the paper protocol's dataset
    assert donor.relative_to(Path(config["options"]["workspace"])).parts[:3] == (
        "finetuned",
        "tiny-llama",
        "fake_movies_real_actors-paper-both-n6-seed0",
    )
    specs = {g["name"]: g["spec"] for g in config["grafts"]}
    assert specs["FE+LT"] == "FE+LT:all:all; head=paper; protocol=paper"
    manifest = json.loads((Path(config["dataset"]["path"]) / "manifest.json").read_text())
    assert manifest["protocol"] == "paper" and manifest["direction"] == "both"
    texts = pl.read_parquet(paper_run / "examples.parquet")["text"].unique().to_list()
    assert any(t.endswith(" stars in in a movie alongside") for t in texts)
    assert any(t.startswith("Q: Who stars in a movie with ") for t in texts)


def test_an_explicit_head_policy_wins_over_the_protocols(paper_run, workspace, tmp_path):
    out = tmp_path / "base-head"
    result = _invoke(
        [
            "position",
            "--protocol",
            "paper",
            "--head-policy",
            "base",
            "--positions",
            "FE",
            *_options(workspace),
            "--out",
            str(out),
        ]
    )
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["options"]["head_policy"] == "base"
    assert {g["name"]: g["spec"] for g in config["grafts"]}["FE"] == "FE:all:all; protocol=paper"
    # the same donor as the paper run: found in the workspace, not finetuned again
    first = json.loads((paper_run / "config.json").read_text())
    assert config["donors"] == first["donors"]


def test_the_default_protocol_is_grafts_and_is_recorded_too(workspace, tmp_path):
    out = tmp_path / "graft"
    result = _invoke(["position", "--positions", "FE", *_options(workspace), "--out", str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["options"]["protocol"] == "graft"
    assert config["options"]["head_policy"] == "base"
    assert config["options"]["dtype"] is None  # the device's default
    assert "fake_movies_real_actors-one-n6-seed0" in config["donors"]["sft"]["path"]
    assert {g["name"]: g["spec"] for g in config["grafts"]}["FE"] == "FE:all:all"
    texts = pl.read_parquet(out / "examples.parquet")["text"].unique().to_list()
    assert any(t.endswith(" starred in a movie with") for t in texts)
