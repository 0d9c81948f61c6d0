"""``--score-full-name`` on the command line: every experiment command takes it, and a
tiny ``custom`` run stores and plots the whole-name scores."""

from __future__ import annotations

import polars as pl
import pytest
from click.testing import CliRunner

from graft.models import tiny_tokenizer
from graft.models.tiny import perturbed_copy, tiny_model
from graft.study.data.datasets import DatasetConfig, generate_dataset
from graft.study.training.donors import accept_donor
from graft_experiments.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

EXPERIMENTS = ("position", "necessity", "component", "hybrid", "layers", "tokens", "custom")


@pytest.mark.parametrize("command", EXPERIMENTS)
def test_every_experiment_takes_the_option(command):
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0 and "--score-full-name" in result.output


@pytest.mark.slow
def test_custom_run_scores_and_plots_whole_names(tmp_path):
    data = generate_dataset(DatasetConfig(n_facts=3), tmp_path / "data")
    donor = tmp_path / "donor"
    perturbed_copy(tiny_model("llama", seed=0), seed=7).save_pretrained(donor)
    tiny_tokenizer().save_pretrained(donor)
    accept_donor(donor)  # a donor folder the user brought
    out = tmp_path / "run"
    args = [
        "custom",
        "--model",
        "tiny-llama",
        "--dataset",
        str(data),
        "--templates",
        "headline",
        "--donor",
        f"sft={donor}",
        "--spec",
        "LT:all:all",
        "--n",
        "2",
        "--n-boot",
        "20",
        "--workspace",
        str(tmp_path / "ws"),
        "--out",
        str(out),
        "--quiet",
        "--score-full-name",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    examples = pl.read_parquet(out / "examples.parquet")
    assert {"name_tokens", "name_logprob", "name_exact"} <= set(examples.columns)
    assert "name_exact_lo" in pl.read_parquet(out / "summary.parquet").columns
    plotted = CliRunner().invoke(main, ["plot", str(out), "--metric", "name_exact"])
    assert plotted.exit_code == 0, plotted.output
    assert list((out / "figures").glob("*_name_exact.png"))
