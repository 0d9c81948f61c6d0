"""``--finetune-seeds``, ``--data-seeds`` and ``--control`` on the experiment commands, and
``graft-exp compare`` on their runs (tiny-llama, 2-step finetunes, a module workspace)."""

from __future__ import annotations

import json

import polars as pl
import pytest
from click.testing import CliRunner, Result

import graft.study.training.workspace as workspace_module
from graft_experiments.cli import main
from tests.cli.tiny_runs import tiny_args

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def common(workspace) -> list[str]:
    return tiny_args(workspace, n_facts=6, templates="headline,movie")


def invoke(*args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == code, f"{result.output}\n{result.exception!r}"
    return result


@pytest.fixture(scope="module")
def seeds_run(common, tmp_path_factory):
    out = tmp_path_factory.mktemp("seeds") / "run"
    result = invoke("position", *common, "--finetune-seeds", "0,1", "--control", "--out", str(out))
    return out, result


def test_position_over_seeds_with_control(seeds_run):
    out, result = seeds_run
    assert "mean over replicates (d0-f0,d0-f1)" in result.output
    assert "FE+LT [control]" in result.output and "acc@5_per_seed" in result.output
    config = json.loads((out / "config.json").read_text())
    assert config["options"]["finetune_seeds"] == [0, 1] and config["options"]["control"]
    labels = [r["label"] for r in config["replicates"]]
    assert labels == ["d0-f0", "d0-f1", "d0-f0-control", "d0-f1-control"]
    examples = pl.read_parquet(out / "examples.parquet")
    assert examples.select("finetune_seed", "data_seed").unique().height == 2
    summary = pl.read_csv(out / "summary.csv")
    mean = summary.filter(pl.col("n_seeds") == 2)
    assert set(mean["graft"].to_list()) == set(examples["graft"].to_list())
    assert (out / "figures" / "position_headline_acc5.png").is_file()
    contrasts = pl.read_csv(out / "contrasts.csv")
    assert ("FE+LT", "FE+LT [control]") in set(contrasts.select("graft_a", "graft_b").iter_rows())


def test_compare_on_a_run_of_several_seeds(seeds_run):
    out, _ = seeds_run
    result = invoke("compare", str(out), "FE+LT", "FE+LT [control]", "--n-boot", "50")
    assert "over 2 replicates" in result.output
    assert "cluster bootstrap over replicates, then prompts" in result.output


def test_plot_redraws_a_run_of_several_seeds(seeds_run):
    out, _ = seeds_run
    result = invoke("plot", str(out), "--metric", "mean_logprob")
    assert "position_movie_mean_logprob.png" in result.output


def test_finetune_seed_trains_the_donor_an_experiment_seed_finds(common, tmp_path, monkeypatch):
    """``finetune --finetune-seed 2`` and ``position --finetune-seeds 2`` name one donor."""
    workspace = common[common.index("--workspace") + 1]
    invoke(
        "finetune",
        "--model",
        "tiny-llama",
        "--workspace",
        workspace,
        "--n-facts",
        "6",
        "--finetune-max-steps",
        "2",
        "--finetune-seed",
        "2",
        "--quiet",
    )

    def no_finetune(*args, **kwargs):
        raise AssertionError("the experiment did not find the donor graft-exp finetune made")

    monkeypatch.setattr(workspace_module, "finetune", no_finetune)
    out = tmp_path / "run"
    invoke("necessity", *common, "--finetune-seeds", "2", "--out", str(out))
    config = json.loads((out / "config.json").read_text())
    record = config["finetuned_models"][config["base"]["path"]]
    assert record["seed"] == 2 and "machine" in record


def test_necessity_control_twins_every_graft(common, tmp_path):
    """The base is the finetuned model there: every graft (PRE included) gets a twin."""
    out = tmp_path / "run"
    invoke("necessity", *common, "--control", "--positions", "FE", "--out", str(out))
    grafts = set(pl.read_parquet(out / "examples.parquet")["graft"].to_list())
    assert grafts == {"SFT", "PRE", "FE", "SFT [control]", "PRE [control]", "FE [control]"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--finetune-seeds", "0,x"], "give comma-separated whole numbers from 0 to 4294967295"),
        (["--finetune-seeds", "1,1"], "seed 1 is given twice"),
        (["--data-seeds", ","], "give comma-separated whole numbers"),
        (["--data-seed", "1", "--data-seeds", "1,2"], "--data-seed and --data-seeds both given"),
    ],
)
def test_bad_seed_options_exit_2(common, tmp_path, args, message):
    out = tmp_path / "run"
    result = invoke("position", *common, *args, "--out", str(out), code=2)
    assert message in result.output
    assert not out.exists()


def test_control_or_data_seeds_need_a_data_kind(common, tmp_path):
    data = tmp_path / "data"
    invoke("data", "--n-facts", "3", "--out", str(data))
    for extra in (["--control"], ["--data-seeds", "0,1"]):
        result = invoke(
            "position",
            "--model",
            "tiny-llama",
            "--dataset",
            str(data),
            *extra,
            "--out",
            str(tmp_path / "run"),
            code=2,
        )
        assert "--data-seeds and --control generate datasets of other data seeds" in result.output
    assert not (tmp_path / "run").exists()


def test_help_lists_the_replicate_options():
    text = invoke("position", "--help").output
    section = text[text.index("Replicates (one set of donors per seed)") :]
    for flag in ("--finetune-seeds", "--data-seeds", "--control"):
        assert flag in section[: section.index("Run:")]


def test_tokens_keeps_each_seed_apart(common, tmp_path):
    out = tmp_path / "tokens"
    invoke("tokens", *common, "--finetune-seeds", "0,1", "--out", str(out))
    table = pl.read_csv(out / "top_tokens.csv")
    assert {"finetune_seed", "data_seed"} <= set(table.columns)
    assert set(table["finetune_seed"].to_list()) == {0, 1}
    # each (seed, template, graft) group holds its own sampled examples, never a pooled mix
    per_group = table.group_by("finetune_seed", "template", "graft").agg(
        pl.col("example").n_unique()
    )
    assert per_group["example"].max() <= 5
