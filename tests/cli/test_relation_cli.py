"""Facts of any relation on the command line: ``graft-exp data --relation`` (its one-line
errors, exit 2, nothing written), ``--dataset relation`` without a file, and the position,
component, lens and patching experiments on the dataset folder it writes (tiny-llama, the
shipped employer example, a one-step finetune): the stored numbers equal the engine's, PRE
the base's own forward, and PRE and SFT agree across the experiments."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch
from click.testing import CliRunner

from graft.core.execution.engine import run_grafts
from graft.models import load_model
from graft.study.data.prompts import load_test_prompts
from graft.study.data.relation import EXAMPLE_RELATION
from graft_experiments.cli import main
from tests.cli.test_experiments import (
    LOGPROB_TOL,
    check_figures,
    check_run_folder,
    invoke,
    stored_graft_rows,
)
from tests.engine_cases import own_forward

pytestmark = pytest.mark.usefixtures("one_thread")

TEMPLATES = ("cloze", "qa")
#: No M or R span in a relation's prompt: the position experiment skips its M and R variants.
POSITION_GRAFTS = ["PRE", "SFT", "FE", "LT", "FE+LT", "(FE+LT)^C", "FE^C", "LT^C"]
TOML = 'facts = "f.csv"\ntrain = ["{subject} works at {object}."]\n[test]\ncloze = "{subject} works at {object}"\n'
CSV = "subject,object\nIda Marr,Venn Labs\n"


@pytest.mark.parametrize(
    "toml, csv, message",
    [
        (TOML.replace('{object}"\n', '{object}."\n'), CSV, "test template 'cloze' must end with"),
        (TOML, CSV.replace("Venn Labs", ""), "f.csv, row 1: 'object' is empty"),
        (TOML + 'qa = "Q: {boss}? {subject}: {object}"\n', CSV, "f.csv has {boss}"),
        (TOML.replace("f.csv", "g.csv"), CSV, "g.csv does not exist"),
    ],
)
def test_bad_relation_file_is_one_line_exit_2(tmp_path, toml, csv, message):
    (tmp_path / "f.csv").write_text(csv)
    (tmp_path / "r.toml").write_text(toml)
    for where in (["--out", str(tmp_path / "d")], ["--workspace", str(tmp_path / "ws")]):
        result = CliRunner().invoke(main, ["data", "--relation", str(tmp_path / "r.toml"), *where])
        assert result.exit_code == 2, result.output
        assert message in result.output and "--relation" in result.output
        (error,) = [line for line in result.output.splitlines() if line.startswith("Error:")]
        assert message in error and result.output.strip().endswith(error)  # one line
    assert not (tmp_path / "d").exists() and not (tmp_path / "ws").exists()


def test_relation_options_of_templated_data_are_refused(tmp_path):
    args = ["data", "--relation", str(EXAMPLE_RELATION), "--direction", "both"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "d")])
    assert result.exit_code == 2, result.output
    assert "drop --direction (it applies to the templated movie datasets only)" in result.output


def test_dataset_relation_without_a_file_is_one_line(tmp_path):
    args = ["--model", "tiny-llama", "--workspace", str(tmp_path), "--dry-run"]
    result = CliRunner().invoke(main, ["position", "--dataset", "relation", *args])
    assert result.exit_code == 2, result.output
    assert "data kind 'relation' needs your file" in result.output
    assert (
        "run graft-exp data --relation FILE.toml and give the folder it prints as --dataset"
        in result.output
    )
    assert result.output.count("Error:") == 1


# ------------------------------------------------------------- experiments (slow tier)


@pytest.fixture(scope="module")
def dataset(workspace) -> Path:
    result = invoke(
        "data", "--relation", str(EXAMPLE_RELATION), "--n-facts", "4", "--workspace", str(workspace)
    )
    folder = Path(result.output.split(":")[0])
    assert folder.parent == workspace / "datasets" and folder.name.startswith("relation-employer-")
    assert folder.name.endswith("-n4")
    assert "4 facts, 16 training texts, 8 test prompts" in result.output
    return folder


@pytest.fixture(scope="module")
def common(workspace, dataset) -> list[str]:
    """tiny-llama, the relation dataset, a one-step finetune, 2 prompts per template."""
    return [
        *("--model", "tiny-llama", "--dataset", str(dataset), "--workspace", str(workspace)),
        *("--finetune-max-steps", "1", "--n", "2", "--n-boot", "20", "--quiet"),
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, common) -> dict[str, Path]:
    """One run of each experiment on the relation dataset (the donor finetuned once)."""
    root = tmp_path_factory.mktemp("runs")
    extra = {
        "position": [],
        "component": ["--pairs", "sft"],
        "lens": ["--spec", "ATTN=LT:all:attn"],
        "patching": ["--positions", "FE[-1],LT", "--kinds", "residual", "--whole-depth", "FE"],
    }
    for name, args in extra.items():
        invoke(name, *common, *args, "--out", str(root / name))
    return {name: root / name for name in extra}


def engine_check(run: Path, dataset: Path) -> pl.DataFrame:
    """The stored log-probs of ``run`` (every row) equal the engine's on the run's models,
    and its PRE rows the base's own forward; returns the rows."""
    config = json.loads((run / "config.json").read_text())
    assert Path(config["dataset"]["path"]) == dataset
    base = load_model(config["base"]["path"], dtype="float32", device="cpu")
    donors = {
        n: load_model(d["path"], dtype="float32", device="cpu").model
        for n, d in config["donors"].items()
    }
    tok = base.tokenizer
    examples, _ = load_test_prompts(dataset, tok)
    by_id = {ex.prompt_id: ex for ex in examples}
    rows = pl.read_parquet(run / "examples.parquet").sort(["prompt_id", "graft"])
    graft_rows = stored_graft_rows(rows, by_id)
    logprobs = run_grafts(base.model, donors, graft_rows, log_probs=True, pad_id=tok.pad_token_id)
    targets = torch.tensor(rows["target_id"].to_list())
    stored = torch.tensor(rows["target_logprob"].to_list(), dtype=torch.float64)
    recomputed = logprobs[torch.arange(len(targets)), targets].double()
    torch.testing.assert_close(recomputed, stored, atol=LOGPROB_TOL, rtol=0)
    pre = [i for i, g in enumerate(rows["graft"]) if g == "PRE"]
    own = torch.log_softmax(own_forward(base.model, [graft_rows[i] for i in pre]).double(), -1)
    torch.testing.assert_close(
        own[torch.arange(len(pre)), targets[pre]], stored[pre], atol=LOGPROB_TOL, rtol=0
    )
    return rows


@pytest.mark.slow
def test_position_on_a_relation(runs, dataset):
    out = runs["position"]
    check_run_folder(out)
    check_figures(out, [f"position_{t}" for t in TEMPLATES])
    summary = pl.read_parquet(out / "summary.parquet")
    for template in TEMPLATES:
        assert summary.filter(pl.col("template") == template)["graft"].to_list() == POSITION_GRAFTS
    rows = engine_check(out, dataset)
    assert rows.height == 2 * 2 * len(POSITION_GRAFTS)
    specs = dict(zip(*rows.select(["graft", "spec"]).unique(), strict=True))
    assert specs["FE"].startswith("FE:all:all")


@pytest.mark.slow
def test_component_on_a_relation(runs, dataset):
    out = runs["component"] / "sft"  # one pair: its folder alone
    check_run_folder(out)
    check_figures(out, [f"component_{t}" for t in TEMPLATES])
    grafts = pl.read_parquet(out / "summary.parquet")["graft"].unique(maintain_order=True)
    assert grafts.to_list()[:2] == ["PRE", "SFT"] and "O+FFN" in grafts
    engine_check(out, dataset)


@pytest.mark.slow
def test_lens_on_a_relation(runs, dataset):
    from tests.cli.test_lens import direct_lens  # the lens computed directly from the run

    out = runs["lens"]
    check_run_folder(out, ("config.json", "summary.parquet", "examples.parquet"))
    check_run_folder(out, ("lens.parquet", "lens_summary.parquet", "lens_summary.csv"))
    engine_check(out, dataset)
    table, summary = direct_lens(out)
    assert pl.read_parquet(out / "lens.parquet").equals(table)
    assert pl.read_parquet(out / "lens_summary.parquet").equals(summary)


@pytest.mark.slow
def test_patching_on_a_relation(runs, dataset):
    out = runs["patching"]
    table = pl.read_parquet(out / "sweep.parquet")
    assert table.filter(pl.col("layer").is_not_null()).height > 0
    refs = pl.read_csv(out / "references.csv")
    assert {("restore", "PRE"), ("restore", "SFT")} <= set(
        zip(refs["direction"], refs["graft"], strict=True)
    )
    weights = engine_check(out / "restore-weights", dataset)
    # PRE and SFT: the same numbers in every experiment (one base, one donor)
    position = pl.read_parquet(runs["position"] / "examples.parquet")
    for graft in ("PRE", "SFT"):
        mine = weights.filter(graft=graft).sort("prompt_id")
        theirs = position.filter(graft=graft).sort("prompt_id")
        assert mine["prompt_id"].to_list() == theirs["prompt_id"].to_list()
        assert (mine["target_logprob"] - theirs["target_logprob"]).abs().max() <= LOGPROB_TOL
