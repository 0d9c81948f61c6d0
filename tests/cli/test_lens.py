"""``graft-exp lens`` end to end on tiny-llama: the run's tables, the lens table, its summary
and figures; the lens at the last layer is the run's own score; a rerun computes nothing;
``--dry-run`` writes nothing; several replicates are refused."""

from __future__ import annotations

import polars as pl
import pytest

import graft.study.lens
from graft.study.lens import POSITIONS
from tests.cli.test_experiments import check_figures, check_run_folder, invoke

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

GRAFTS = ["PRE", "SFT", "FE", "LT", "FE+LT", "ATTN"]
N_LAYERS = 4  # the tiny models'


@pytest.fixture(scope="module")
def common(workspace) -> list[str]:
    return [
        "--model", "tiny-llama",
        "--workspace", str(workspace),
        "--n-facts", "10",
        "--finetune-max-steps", "2",
        "--n", "2",
        "--n-boot", "50",
        "--templates", "headline,qa",
        "--rows-per-forward", "8",
        "--quiet",
    ]  # fmt: skip


def lens_args(common, out) -> list[str]:
    return ["lens", *common, "--spec", "ATTN=LT:all:attn", "--out", str(out)]


@pytest.fixture(scope="module")
def lens_run(tmp_path_factory, common):
    out = tmp_path_factory.mktemp("runs") / "lens"
    return out, invoke(*lens_args(common, out))


def test_lens_writes_its_table_summary_and_figures(lens_run):
    out, result = lens_run
    check_run_folder(out, ("config.json", "summary.parquet", "examples.parquet"))
    check_run_folder(out, ("lens.parquet", "lens_summary.parquet", "lens_summary.csv"))
    check_figures(out, ["lens"], metric="median_rank")
    check_figures(out, ["lens"], metric="mean_prob")
    table = pl.read_parquet(out / "lens.parquet")
    examples = pl.read_parquet(out / "examples.parquet")
    assert table.height == examples.height * N_LAYERS * len(POSITIONS)
    summary = pl.read_csv(out / "lens_summary.csv")
    assert summary.height == 2 * len(GRAFTS) * len(POSITIONS) * N_LAYERS
    qa = summary.filter(pl.col("template") == "qa")
    assert qa["graft"].unique(maintain_order=True).to_list() == GRAFTS
    for column in ("median_rank", "median_rank_lo", "median_rank_hi", "mean_prob_lo", "n"):
        assert column in summary.columns
    assert (summary["median_rank_lo"] <= summary["median_rank"]).all()
    assert (summary["n"] == 2).all()
    assert "lens: 3 batches computed" in result.output  # 4 prompts x 6 grafts, 8 rows each
    # at the last layer, LT's lens is the score the run gave its final logits
    last = table.filter((pl.col("layer") == N_LAYERS - 1) & (pl.col("position") == "LT"))
    joined = last.join(examples, on=["graft", "prompt_id"], suffix="_run")
    assert joined.height == examples.height
    assert (joined["target_rank"] == joined["target_rank_run"]).all()
    assert (joined["target_logprob"] - joined["target_logprob_run"]).abs().max() <= 2e-5


def test_plot_redraws_the_lens_figures(lens_run):
    out, _ = lens_run
    for png in (out / "figures").glob("lens_*"):
        png.unlink()
    result = invoke("plot", str(out))
    check_figures(out, ["lens"], metric="median_rank")
    check_figures(out, ["lens"], metric="mean_prob")
    assert f"figure: {out / 'figures' / 'lens_median_rank.png'}" in result.output


def test_a_rerun_computes_nothing(lens_run, common, monkeypatch):
    out, _ = lens_run
    before = pl.read_parquet(out / "lens_summary.parquet")

    def fail(*args, **kwargs):
        raise AssertionError("the rerun computed a lens batch")

    monkeypatch.setattr(graft.study.lens, "logit_lens", fail)
    result = invoke(*lens_args(common, out))
    assert "lens: 0 batches computed" in result.output
    assert "(3 already done)" in result.output
    assert pl.read_parquet(out / "lens_summary.parquet").equals(before)


def test_dry_run_writes_nothing_and_replicates_or_remote_are_refused(tmp_path, common):
    out = tmp_path / "dry"
    result = invoke(*lens_args(common, out), "--dry-run")
    assert "plan of lens" in result.output and "one trace per stored batch" in result.output
    assert not out.exists()
    result = invoke(*lens_args(common, out), "--finetune-seeds", "0,1", code=2)
    assert "one replicate" in result.output and "--finetune-seeds" in result.output
    result = invoke(*lens_args(common, out), "--remote", code=2)
    assert "this machine only" in result.output
    assert not out.exists()
