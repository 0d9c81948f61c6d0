"""``graft-exp patching`` end to end on tiny-llama: the sweep's runs in both directions, the
combined tables and maps, labelled cells, resume, the dry run and bad options."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from graft_experiments.cli import main
from tests.cli.tiny_runs import tiny_args

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

ARGS = [
    *tiny_args(templates="headline"),
    "--positions",
    "FE[-1],LT",
    "--kinds",
    "residual,mlp",
    "--whole-depth",
    "FE,LT",
]


def invoke(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


@pytest.fixture(scope="module")
def sweep(workspace, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("patching") / "run"
    text = invoke("patching", *ARGS, "--workspace", str(workspace), "--out", str(out))
    return out, text


def test_the_sweep_writes_every_run_table_and_map(sweep):
    out, text = sweep
    for run in ("restore-weights", "restore-activation", "restore-residual", "break-weights"):
        assert (out / run / "examples.parquet").is_file(), run
    table = pl.read_parquet(out / "sweep.parquet")
    layers = table.filter(pl.col("layer").is_not_null())
    # 2 directions x 2 kinds x 2 units x 4 layers x 2 methods
    assert layers.height == 2 * 2 * 2 * 4 * 2
    assert set(layers["method"]) == {"weights", "patching"}
    for col in ("effect", "effect_lo", "effect_hi", "acc@5", "acc@5_lo", "identical", "sanity"):
        assert col in table.columns
    refs = pl.read_csv(out / "references.csv")
    assert set(zip(refs["direction"], refs["graft"], strict=True)) == {
        ("restore", "PRE"),
        ("restore", "SFT"),
        ("break", "SFT"),
        ("break", "PRE"),
    }
    for stem in ("patching_map_restore", "patching_map_break_acc5", "patching_lines_break"):
        png = out / "figures" / f"{stem}.png"
        assert png.is_file() and png.stat().st_size > 1000
    findings = pl.read_csv(out / "findings.csv")
    assert {"peak_layer", "first_layer_half", "layers_differ"} <= set(findings.columns)
    assert "peak effect" in text and "results:" in text
    config = json.loads((out / "config.json").read_text())
    assert config["experiment"] == "patching" and config["units"] == ["FE[-1]", "LT"]
    # the running program as it was called (here the test runner, or an xdist worker's "-c")
    assert shlex.split(config["command"])[0] == Path(sys.argv[0]).name and config["machine"]


def test_cells_that_test_nothing_are_labelled_not_tested(sweep):
    out, _ = sweep
    contrasts = pl.read_parquet(out / "contrasts.parquet")
    status = dict(
        zip(
            contrasts.select(pl.concat_str("direction", "kind", "unit", separator=" "))
            .to_series()
            .to_list(),
            contrasts["status"].to_list(),
            strict=False,
        )
    )
    # the whole-depth LT patch and the last layer's residual patch at LT copy the stream
    assert status["restore all layers LT"] == "sanity check"
    last = contrasts.filter(
        (pl.col("kind") == "residual") & (pl.col("unit") == "LT") & (pl.col("layer") == 3)
    )
    assert last["status"].to_list() == ["sanity check", "sanity check"]
    tested = contrasts.filter(pl.col("status") == "tested")
    assert tested.height and tested["mcnemar_p_holm"].is_not_null().all()
    # each cell says which test found the two methods differ
    assert set(contrasts["decided_by"]) <= {"both", "McNemar", "log-prob", "neither"}
    assert set(contrasts["target_logprob_test"]) == {"Wilcoxon signed-rank"}
    for row in tested.iter_rows(named=True):
        hits, logprob = row["mcnemar_p_holm"] < 0.05, row["target_logprob_p_holm"] < 0.05
        named = {(1, 1): "both", (1, 0): "McNemar", (0, 1): "log-prob", (0, 0): "neither"}
        assert row["decided_by"] == named[(int(hits), int(logprob))]
    # tiny-llama's tokenizer puts a start token before FE: FE in every layer is not
    # identical by construction there, so it is tested
    assert status["restore all layers FE"] == "tested"


def test_a_rerun_resumes_every_run_and_computes_nothing(sweep, workspace):
    out, _ = sweep
    before = pl.read_parquet(out / "sweep.parquet")
    text = invoke("patching", *ARGS, "--workspace", str(workspace), "--out", str(out))
    plans = re.findall(r"in (\d+) batches \((\d+) already done\)", text)
    assert len(plans) == 6 and all(total == done for total, done in plans), text
    assert pl.read_parquet(out / "sweep.parquet").equals(before)


def test_the_dry_run_plans_each_run_and_writes_nothing(tmp_path):
    out = tmp_path / "run"

    def dry_run(*extra: str) -> str:
        return invoke(
            "patching",
            *ARGS,
            *("--modes", "restore", "--methods", "patching"),
            *("--workspace", str(tmp_path / "ws"), "--dry-run", *extra, "--out", str(out)),
        )

    text = dry_run()
    assert text.count("plan of patching") == 2, text  # the activation and residual runs
    assert "layer reuse:" in text and "MiB per distinct prompt" in text, text
    assert not out.exists()
    assert "layer reuse:" not in dry_run("--no-reuse")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--methods", "weights,gradient", "unknown methods ['gradient']"),
        ("--kinds", "heads", "unknown kinds ['heads']"),
        ("--modes", "sideways", "unknown modes ['sideways']"),
        ("--positions", "FE[x]", "not a span part"),
        ("--window", "0", "0"),
    ],
)
def test_bad_options_are_one_line(tmp_path, option, value, message):
    result = CliRunner().invoke(
        main, ["patching", "--model", "tiny-llama", option, value, "--dry-run"]
    )
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_a_sweep_over_finetune_seeds_widens_its_intervals_over_the_donors(workspace, tmp_path):
    out = tmp_path / "run"
    args = [*tiny_args(templates="headline"), "--positions", "LT", "--kinds", "mlp"]
    args += ["--modes", "restore", "--methods", "weights", "--finetune-seeds", "0,1"]
    invoke("patching", *args, "--workspace", str(workspace), "--out", str(out))
    examples = pl.read_parquet(out / "restore-weights" / "examples.parquet")
    assert sorted(examples["finetune_seed"].unique()) == [0, 1]
    table = pl.read_parquet(out / "sweep.parquet").filter(pl.col("layer").is_not_null())
    assert (table["seeds"] == 2).all() and table["effect_sd"].is_not_null().all()
    prompts = examples.filter((pl.col("graft") == "PRE") & (pl.col("finetune_seed") == 0))
    assert prompts.height > 0 and (table["n"] == 2 * prompts.height).all()  # both donors' rows
    own = pl.read_csv(out / "seed_findings.csv")  # each donor's own findings
    assert sorted(own["seed"].unique()) == [0, 1] and set(own["unit"]) == {"LT"}
