"""``graft-exp lens`` end to end on tiny-llama: the run's tables, the lens table (the
embedding layer and the top-k tokens included), its summary (with the lines identical by
causality), the top-token table and figures; the bar charts are not named as lenses; the lens
at the last layer is the run's own score; the lens tables are those of the lens computed
directly on the run's rows, batch by batch, as the lens's own loop did before it was an
analysis of the runner; a rerun computes nothing (no lens batch, no examples batch), a missing
lens part computes that lens batch alone (no engine call), another --top-k computes every lens
batch again and no examples batch; ``--dry-run`` writes nothing; several replicates are
refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

import graft.study.analyses.lens
import graft.study.running.batches
from graft.core.families.arch import architecture_of
from graft.models import context_length, load_model
from graft.results.plots.lens import EMBEDDING_LAYER
from graft.study.analyses.lens import FIGURE_METRICS
from graft.study.analyses.lens_causality import identical_lines
from graft.study.analyses.lens_tables import lens_frame, summarize_lens
from graft.study.analyses.lens_trace import POSITIONS, logit_lens
from graft.study.data.rows import graft_rows, load_examples, plan_rows, sample_examples
from graft.study.designs import LENS_SPECS
from graft.study.specs.config import ExperimentConfig
from graft.study.specs.grafts import reference, spec_graft
from graft.study.specs.run import resolve
from tests.cli.test_experiments import check_figures, check_run_folder, invoke
from tests.cli.tiny_runs import tiny_args

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

GRAFTS = ["PRE", "SFT", "FE", "LT", "FE+LT", "ATTN"]
N_LAYERS = 4  # the tiny models'
N_READ = N_LAYERS + 1  # the embeddings, then each layer's output
TEMPLATES = ["headline", "qa"]
#: At FE-last, what each graft's line is by causality (its cells lie after FE-last).
SAME_AT_FE_LAST = {"LT": "PRE", "FE+LT": "FE", "ATTN": "PRE"}


@pytest.fixture(scope="module")
def common(workspace) -> list[str]:
    return [*tiny_args(workspace, templates="headline,qa"), "--rows-per-forward", "8"]


def lens_args(common, out) -> list[str]:
    return ["lens", *common, "--spec", "ATTN=LT:all:attn", "--out", str(out)]


def counted(monkeypatch, module, name: str, rows_at: int) -> list[int]:
    """The rows of each call of ``module.name`` (its positional argument ``rows_at``)."""
    calls: list[int] = []
    original = getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(len(args[rows_at]))
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def engine_and_lens_calls(monkeypatch) -> tuple[list[int], list[int]]:
    """The rows of each engine call of the runner and of each lens trace."""
    engine = counted(monkeypatch, graft.study.running.batches, "_row_metrics", 3)
    lens = counted(monkeypatch, graft.study.analyses.lens, "logit_lens", 2)
    return engine, lens


def direct_lens(out: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The lens table and summary of the run in ``out`` computed directly, as the lens's own
    loop did before it was an analysis of the runner: the run's models, examples, grafts and
    rows made again from its ``config.json``, each stored batch traced (:func:`logit_lens`)
    and tabled (:func:`lens_frame`), then summarised with the lines identical by causality."""
    config = json.loads((out / "config.json").read_text())
    options = {k: v for k, v in config["options"].items() if k != "schema"}
    run = resolve(ExperimentConfig(**options))
    load = {"dtype": run.execution.dtype, "device": run.execution.device}
    base = load_model(config["base"]["path"], **load)
    donors = {n: load_model(d["path"], **load).model for n, d in config["donors"].items()}
    tok = base.tokenizer
    data = Path(config["dataset"]["path"])
    found, _ = load_examples(data, tok, run.data, context_length(base.model))
    examples = sample_examples(found, run.data.n, run.data.sample_seed)
    specs = (*LENS_SPECS, "ATTN=LT:all:attn")
    grafts = [reference("PRE", None), reference("SFT", "sft")]
    grafts += [spec_graft(s, run.analysis.head_policy, run.protocol) for s in specs]
    assert [g.name for g in grafts] == [g["name"] for g in config["grafts"]]
    rows, _ = plan_rows(examples, grafts)
    size, frames = run.execution.batch_size, []
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        targets = [examples[ei].target_id for ei, _ in chunk]
        chunk_rows = graft_rows(examples, grafts, chunk)
        scores = logit_lens(base.model, donors, chunk_rows, targets, pad_id=tok.pad_token_id)
        frames.append(lens_frame(scores, chunk, examples, grafts, run.data.data_seed, tok))
    table = pl.concat(frames)
    same = identical_lines(examples, grafts, rows, architecture_of(base.model))
    return table, summarize_lens(table, grafts, run.analysis, same)


@pytest.fixture(scope="module")
def lens_run(tmp_path_factory, common):
    out = tmp_path_factory.mktemp("runs") / "lens"
    return out, invoke(*lens_args(common, out))


def test_lens_writes_its_table_summary_and_figures(lens_run):
    out, result = lens_run
    check_run_folder(out, ("config.json", "summary.parquet", "examples.parquet"))
    check_run_folder(out, ("lens.parquet", "lens_summary.parquet", "lens_summary.csv"))
    for metric in FIGURE_METRICS:
        check_figures(out, ["lens"], metric=metric)
    table = pl.read_parquet(out / "lens.parquet")
    examples = pl.read_parquet(out / "examples.parquet")
    assert table.height == examples.height * N_READ * len(POSITIONS)
    assert sorted(table["layer"].unique()) == list(range(EMBEDDING_LAYER, N_LAYERS))
    summary = pl.read_csv(out / "lens_summary.csv")
    assert summary.height == 2 * len(GRAFTS) * len(POSITIONS) * N_READ
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
    assert (joined["top_ids"] == joined["top10_ids"].list.head(5)).all()  # the run's top 5


def test_the_lens_tables_are_the_lens_computed_directly(lens_run):
    out, _ = lens_run
    table, summary = direct_lens(out)
    assert pl.read_parquet(out / "lens.parquet").equals(table)
    assert pl.read_parquet(out / "lens_summary.parquet").equals(summary)


def test_the_bar_charts_are_named_after_the_output_not_the_lens(lens_run):
    out, _ = lens_run
    check_figures(out, [f"final_layer_{t}" for t in TEMPLATES])
    lens_figures = {p.name for p in (out / "figures").glob("lens*")}
    assert lens_figures == {f"lens_{m}.{e}" for m in FIGURE_METRICS for e in ("png", "pdf")}


def test_top_k_tokens_are_stored_and_agree_with_the_target_rank(lens_run):
    out, result = lens_run
    table = pl.read_parquet(out / "lens.parquet")
    assert (table["top_ids"].list.len() == 5).all()
    assert (table["top_tokens"].list.len() == 5).all()
    probs = table["top_probs"].to_list()
    assert all(p == sorted(p, reverse=True) for p in probs)
    listed = table.filter(pl.col("target_rank") < 5)
    assert listed.height  # some targets are in the top 5
    at_rank = listed.select(
        pl.col("top_ids").list.get(pl.col("target_rank")).alias("id"),
        pl.col("top_probs").list.get(pl.col("target_rank")).alias("prob"),
        "target_id",
        "target_prob",
        "target_rank",
    )
    assert (at_rank["id"] == at_rank["target_id"]).all()  # rank 0: the top-1 token
    assert (at_rank["prob"] - at_rank["target_prob"]).abs().max() <= 1e-9
    first = table.filter(pl.col("top_ids").list.first() == pl.col("target_id"))
    assert (first["target_rank"] == 0).all()  # a top-1 target has rank 0
    unlisted = table.filter(pl.col("target_rank") >= 5)
    assert (
        not unlisted.select(pl.col("top_ids").list.contains(pl.col("target_id"))).to_series().any()
    )
    # the readable table: the top-1 token per layer and position for the first prompts
    assert f"lens top tokens: {out / 'lens_top_tokens.csv'}" in result.output
    top = pl.read_csv(out / "lens_top_tokens.csv")
    assert top.columns == [
        "template",
        "prompt_id",
        "prompt",
        "target",
        "graft",
        "layer",
        "LT",
        "LT target rank",
        "FE-last",
        "FE-last target rank",
    ]
    assert top.height == 2 * 2 * len(GRAFTS) * N_READ  # 2 prompts of each template (n=2)
    assert top["layer"].unique(maintain_order=True).to_list() == ["emb", "0", "1", "2", "3"]
    one = table.filter(
        (pl.col("prompt_id") == top["prompt_id"][0])
        & (pl.col("graft") == "SFT")
        & (pl.col("layer") == N_LAYERS - 1)
        & (pl.col("position") == "LT")
    )
    row = top.filter(
        (pl.col("prompt_id") == top["prompt_id"][0])
        & (pl.col("graft") == "SFT")
        & (pl.col("layer") == str(N_LAYERS - 1))
    )
    assert row["LT"][0].startswith(repr(one["top_tokens"][0][0]))
    assert row["LT target rank"][0] == one["target_rank"][0]


def test_lines_identical_by_causality_are_marked_and_identical(lens_run):
    out, _ = lens_run
    summary = pl.read_parquet(out / "lens_summary.parquet")
    marked = summary.filter(pl.col("same_as").is_not_null())
    assert set(marked["position"]) == {"FE-last"}  # nothing is another's at LT
    assert dict(marked.select("graft", "same_as").unique().iter_rows()) == SAME_AT_FE_LAST
    assert marked.height == len(TEMPLATES) * len(SAME_AT_FE_LAST) * N_READ
    # the lines are identical: per prompt and layer, the same rank, probability and top tokens
    table = pl.read_parquet(out / "lens.parquet").filter(pl.col("position") == "FE-last")
    keys = ["prompt_id", "layer"]
    for name, same in SAME_AT_FE_LAST.items():
        ours = table.filter(pl.col("graft") == name)
        theirs = table.filter(pl.col("graft") == same)
        joined = ours.join(theirs, on=keys, suffix="_same")
        assert joined.height == ours.height == theirs.height
        assert (joined["target_rank"] == joined["target_rank_same"]).all()
        assert (joined["target_logprob"] - joined["target_logprob_same"]).abs().max() <= 1e-5
        assert (joined["top_ids"] == joined["top_ids_same"]).all()
    # FE grafts FE-last itself: its line is its own
    fe = table.filter(pl.col("graft") == "FE").join(
        table.filter(pl.col("graft") == "PRE"), on=keys, suffix="_pre"
    )
    assert (fe["target_logprob"] - fe["target_logprob_pre"]).abs().max() > 1e-4


def test_plot_redraws_the_lens_figures(lens_run):
    out, _ = lens_run
    for png in (out / "figures").glob("lens_*"):
        png.unlink()
    result = invoke("plot", str(out))
    for metric in FIGURE_METRICS:
        check_figures(out, ["lens"], metric=metric)
    assert f"figure: {out / 'figures' / 'lens_median_rank.png'}" in result.output
    assert f"figure: {out / 'figures' / 'final_layer_qa_acc5.png'}" in result.output


def plan_lines(output: str) -> list[str]:
    """The run's plan line and the lens's (``... (k already done) -> folder``)."""
    return [line for line in output.splitlines() if "already done" in line]


def test_a_rerun_computes_nothing(lens_run, common, monkeypatch):
    out, _ = lens_run
    before = pl.read_parquet(out / "lens_summary.parquet")
    engine, lens = engine_and_lens_calls(monkeypatch)
    result = invoke(*lens_args(common, out))
    assert engine == [] and lens == []  # no examples batch, no lens batch
    assert "lens: 0 batches computed" in result.output
    run_line, lens_line = plan_lines(result.output)
    assert "24 rows in 3 batches (3 already done)" in run_line
    assert lens_line.startswith("lens: 24 rows x (4 layers + emb) x 2 positions, top 5 tokens")
    assert "in 3 batches (3 already done)" in lens_line
    assert pl.read_parquet(out / "lens_summary.parquet").equals(before)


def test_a_missing_lens_part_computes_that_batch_alone(lens_run, common, tmp_path, monkeypatch):
    out, _ = lens_run
    copy = tmp_path / "lens"
    shutil.copytree(out, copy)
    parts = copy / "parts"
    examples = {p.name: p.read_bytes() for p in (parts / "examples").glob("*.parquet")}
    table = pl.read_parquet(copy / "lens.parquet")
    (parts / "lens" / "1.parquet").unlink()
    engine, lens = engine_and_lens_calls(monkeypatch)
    result = invoke(*lens_args(common, copy))
    assert engine == []  # the examples are stored: the engine does not run
    assert lens == [8]  # batch 1's rows, traced once
    assert "lens: 1 batches computed" in result.output
    run_line, lens_line = plan_lines(result.output)
    assert "(3 already done)" in run_line and "(2 already done)" in lens_line
    assert (parts / "lens" / "1.parquet").is_file()
    assert {p.name: p.read_bytes() for p in (parts / "examples").glob("*.parquet")} == examples
    assert pl.read_parquet(copy / "lens.parquet").equals(table)  # the same numbers again


def test_another_top_k_computes_the_lens_again(lens_run, common, tmp_path, monkeypatch):
    out, _ = lens_run
    copy = tmp_path / "lens"
    shutil.copytree(out, copy)
    engine, lens = engine_and_lens_calls(monkeypatch)
    result = invoke(*lens_args(common, copy), "--top-k", "3")
    assert engine == [] and lens == [8, 8, 8]  # every lens batch, no examples batch
    assert "lens: 3 batches computed" in result.output
    assert (pl.read_parquet(copy / "lens.parquet")["top_ids"].list.len() == 3).all()
    result = invoke(*lens_args(common, copy), "--top-k", "3")
    assert "lens: 0 batches computed" in result.output


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
