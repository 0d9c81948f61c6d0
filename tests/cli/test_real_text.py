"""The real-text variant on the command line: ``graft-exp data --articles`` and a position
run on the dataset folder it writes (tiny-llama, a two-step finetune, the shipped synthetic
articles)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch
from click.testing import CliRunner

from graft.core.execution.engine import run_grafts
from graft.models import load_model
from graft.study.data.articles import EXAMPLE_ARTICLES, read_articles
from graft.study.data.prompts import load_test_prompts
from graft_experiments.cli import main
from tests.cli.test_experiments import (
    LOGPROB_TOL,
    check_figures,
    check_run_folder,
    invoke,
    stored_graft_rows,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

TEMPLATES = ("cloze", "qa")
#: No M or R span in a question: the position experiment skips its M and R variants.
GRAFTS = ["PRE", "SFT", "FE", "LT", "FE+LT", "(FE+LT)^C", "FE^C", "LT^C"]


@pytest.fixture(scope="module")
def dataset(workspace) -> Path:
    result = invoke("data", "--articles", str(EXAMPLE_ARTICLES), "--workspace", str(workspace))
    folder = Path(result.output.split(":")[0])
    assert folder.parent == workspace / "datasets" and folder.name.startswith("articles-")
    assert "8 articles, 32 training texts, 16 test prompts" in result.output
    return folder


@pytest.fixture(scope="module")
def position_run(tmp_path_factory, workspace, dataset) -> Path:
    out = tmp_path_factory.mktemp("runs") / "position"
    invoke(
        "position",
        "--model",
        "tiny-llama",
        "--dataset",
        str(dataset),
        "--workspace",
        str(workspace),
        "--finetune-max-steps",
        "2",
        "--n-boot",
        "50",
        "--score-full-name",
        "--quiet",
        "--out",
        str(out),
    )
    return out


def test_position_on_articles(position_run, dataset):
    check_run_folder(position_run)
    check_figures(position_run, [f"position_{t}" for t in TEMPLATES])
    summary = pl.read_parquet(position_run / "summary.parquet")
    for template in TEMPLATES:
        rows = summary.filter(pl.col("template") == template)
        assert rows["graft"].to_list() == GRAFTS
    examples = pl.read_parquet(position_run / "examples.parquet")
    n_questions = sum(len(a.questions) for a in read_articles(EXAMPLE_ARTICLES))
    kept = examples.filter(pl.col("graft") == "PRE").height
    drops = json.loads((position_run / "drops.json").read_text())
    dropped = sum(n for per in drops["per_template"].values() for n in per.values())
    assert kept + dropped == n_questions and kept > 0
    assert set(drops["per_template"]) == set(TEMPLATES)
    assert {"name_logprob", "name_exact"} <= set(examples.columns)
    config = json.loads((position_run / "config.json").read_text())
    assert Path(config["dataset"]["path"]) == dataset


def test_position_numbers_match_engine(position_run, dataset):
    """The stored log-probs of one question per template, every graft, equal the engine run
    here on the run's models (the spans themselves: tests/study/test_articles.py)."""
    config = json.loads((position_run / "config.json").read_text())
    base = load_model(config["base"]["path"], dtype="float32", device="cpu")
    donor = load_model(config["donors"]["sft"]["path"], dtype="float32", device="cpu")
    tok = base.tokenizer
    examples, _ = load_test_prompts(dataset, tok)
    by_id = {ex.prompt_id: ex for ex in examples}
    table = pl.read_parquet(position_run / "examples.parquet")
    picked = [table.filter(pl.col("template") == t)["prompt_id"][0] for t in TEMPLATES]
    rows = table.filter(pl.col("prompt_id").is_in(picked)).sort(["prompt_id", "graft"])
    graft_rows = stored_graft_rows(rows, by_id)
    logprobs = run_grafts(
        base.model, {"sft": donor.model}, graft_rows, log_probs=True, pad_id=tok.pad_token_id
    )
    targets = torch.tensor(rows["target_id"].to_list())
    recomputed = logprobs[torch.arange(len(targets)), targets].double()
    stored = torch.tensor(rows["target_logprob"].to_list(), dtype=torch.float64)
    torch.testing.assert_close(recomputed, stored, atol=LOGPROB_TOL, rtol=0)


@pytest.mark.parametrize(
    "content, message",
    [
        (
            '{"article": "x", "questions": [{"prompt": "A b", "answer": "C"}]}',
            "question 1: 'first_entity' is missing",
        ),
        (
            '{"article": "x", "questions": [{"prompt": "A b", "answer": "", "first_entity": "A"}]}',
            "question 1: 'answer' is empty",
        ),
        (
            '{"article": "x", "questions": [{"prompt": "A b", "answer": "C", "first_entity": "Z"}]}',
            "first_entity 'Z' is not in its prompt 'A b' as a whole word",
        ),
    ],
)
def test_bad_articles_file_is_one_line_exit_2(tmp_path, content, message):
    path = tmp_path / "a.jsonl"
    path.write_text(content + "\n")
    result = CliRunner().invoke(
        main, ["data", "--articles", str(path), "--out", str(tmp_path / "d")]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output and "--articles" in result.output
    assert result.output.count("Error:") == 1 and not (tmp_path / "d").exists()


def test_articles_options_of_templated_data_are_refused(tmp_path):
    result = CliRunner().invoke(
        main, ["data", "--articles", str(EXAMPLE_ARTICLES), "--split", "--out", str(tmp_path / "d")]
    )
    assert result.exit_code == 2, result.output
    assert "drop --split (it applies to the templated movie datasets only)" in result.output
