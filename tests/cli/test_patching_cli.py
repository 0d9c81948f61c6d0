"""``graft-exp patching`` end to end on tiny-llama: the three methods' run folders, the
combined summary, contrasts and figures, and the numbers against the engine run here."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from experiments.cli import main
from graft.results.compare import read_examples

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

POSITIONS = "FE,LT,FE+LT"


def invoke(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


@pytest.fixture(scope="module")
def patching_run(workspace, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("patching") / "run"
    invoke(
        "patching",
        "--model", "tiny-llama",
        "--workspace", str(workspace),
        "--n-facts", "10",
        "--finetune-max-steps", "2",
        "--n", "2",
        "--n-boot", "50",
        "--templates", "movie",
        "--positions", POSITIONS,
        "--quiet",
        "--out", str(out),
    )  # fmt: skip
    return out


def test_patching_writes_every_method_table_and_figure(patching_run):
    out = patching_run
    cells = ["PRE", "SFT", *POSITIONS.split(","), "ATTN+O+FFN", "O", "FFN"]
    summary = pl.read_parquet(out / "summary.parquet")
    for method in ("weights", "activation", "residual"):
        assert (out / method / "examples.parquet").is_file()
        got = summary.filter(pl.col("method") == method)["cell"].to_list()
        assert set(cells) <= set(got), got
    for col in ("acc@5", "acc@5_lo", "mean_rank", "mean_name_logprob_hi"):
        assert col in summary.columns
    contrasts = pl.read_csv(out / "contrasts_name_logprob.csv")
    fe = contrasts.filter(pl.col("cell") == "FE")
    assert sorted(zip(fe["method_a"], fe["method_b"], strict=True)) == [
        ("activation", "weights"),
        ("residual", "activation"),
        ("residual", "weights"),
    ]
    for col in ("mcnemar_p_holm", "acc@5_diff_lo", "name_logprob_diff", "name_logprob_p_holm"):
        assert col in contrasts.columns
    assert (out / "contrasts_rank.parquet").is_file()
    for stem in ("patching_acc5", "patching_rank", "patching_name_logprob"):
        png = out / "figures" / f"{stem}.png"
        assert png.is_file() and png.stat().st_size > 1000


def test_patching_nothing_and_everything_agree_across_methods(patching_run):
    """PRE patches nothing (the base in every method; the engine batches its rows differently, so to rounding); SFT patches every cell with
    the donor's head (the donor in every method, to float rounding)."""
    out = patching_run
    examples = {m: read_examples(out / m) for m in ("weights", "activation", "residual")}
    for ref, tol in (("PRE", 1e-5), ("SFT", 1e-4)):
        rows = {m: e.filter(pl.col("graft") == ref).sort("prompt_id") for m, e in examples.items()}
        for m in ("activation", "residual"):
            diff = (rows[m]["name_logprob"] - rows["weights"]["name_logprob"]).abs().max()
            assert diff is not None and diff <= tol, (ref, m, diff)
    # FE+LT differs between grafting and patching somewhere: the methods are not one
    fe_lt = {m: e.filter(pl.col("graft") == "FE+LT").sort("prompt_id") for m, e in examples.items()}
    moved = (fe_lt["activation"]["name_logprob"] - fe_lt["weights"]["name_logprob"]).abs().max()
    assert moved is not None and moved > 1e-4


def test_patching_dry_run_plans_each_method_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    text = invoke(
        "patching",
        "--model", "tiny-llama",
        "--workspace", str(tmp_path / "ws"),
        "--n-facts", "10",
        "--n", "2",
        "--positions", "FE",
        "--methods", "weights,residual",
        "--dry-run",
        "--out", str(out),
    )  # fmt: skip
    assert text.count("plan of patching") == 2, text
    assert "method: residual" in text and "method: activation" not in text
    assert not out.exists()


def test_patching_refuses_an_unknown_method(tmp_path):
    result = CliRunner().invoke(main, ["patching", "--methods", "weights,gradient", "--dry-run"])
    assert result.exit_code == 2
    assert "unknown patching method(s) ['gradient']" in result.output
