"""Paired contrasts of a run: ``contrasts.csv`` written by every run, and ``graft-exp compare``.

One tiny position run (tiny-llama, 2-step finetune, FE, LT and FE+LT) is shared by the
module; the expected statistics are recomputed by hand from its ``examples.parquet``.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch
from click.testing import CliRunner, Result

from graft.errors import ExperimentError, RunFolderError
from graft.results.compare import KEY_CONTRASTS, compare_run, key_contrasts
from graft.results.stats import mcnemar_exact_p
from graft.storage.tables import save_table
from graft_experiments.cli import main

pytestmark = pytest.mark.slow

TEMPLATES = ("headline", "movie", "qa")
GRAFTS = ["PRE", "SFT", "FE", "LT", "FE+LT"]


def invoke(*args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == code, f"exit {result.exit_code}, expected {code}:\n{result.output}"
    return result


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("compare")
    out = root / "position"
    try:
        invoke(
            "position",
            "--model",
            "tiny-llama",
            "--workspace",
            str(root / "workspace"),
            "--n-facts",
            "10",
            "--finetune-max-steps",
            "2",
            "--n",
            "6",
            "--n-boot",
            "50",
            "--positions",
            "FE,LT,FE+LT",
            "--quiet",
            "--out",
            str(out),
        )
    finally:
        torch.set_num_threads(threads)
    return out


def _examples(run: Path) -> pl.DataFrame:
    return pl.read_parquet(run / "examples.parquet")


def _hand_counts(examples: pl.DataFrame, template: str, a: str, b: str, hit: str = "hit@5"):
    """(n, acc A, acc B, b, c) of A vs B in one template, from the examples table."""
    cell = examples.filter(pl.col("template") == template)
    left = cell.filter(pl.col("graft") == a).select("prompt_id", pl.col(hit).alias("a"))
    right = cell.filter(pl.col("graft") == b).select("prompt_id", pl.col(hit).alias("b"))
    both = left.join(right, on="prompt_id")
    only_a = int((both["a"] & ~both["b"]).sum())
    only_b = int((~both["a"] & both["b"]).sum())
    return both.height, both["a"].mean(), both["b"].mean(), only_a, only_b


# ----------------------------------------------------------------------- contrasts.csv


def test_every_run_writes_the_key_contrasts(run):
    assert (run / "contrasts.parquet").is_file() and (run / "contrasts.csv").is_file()
    table = pl.read_parquet(run / "contrasts.parquet")
    pairs = [("FE+LT", "SFT"), ("FE", "PRE"), ("LT", "PRE")]  # no component sets in this run
    assert table.select("template", "graft_a", "graft_b").rows() == [
        (t, a, b) for t in TEMPLATES for a, b in pairs
    ]
    examples = _examples(run)
    for row in table.iter_rows(named=True):
        n, acc_a, acc_b, only_a, only_b = _hand_counts(
            examples, row["template"], row["graft_a"], row["graft_b"]
        )
        assert (row["n"], row["mcnemar_b"], row["mcnemar_c"]) == (n, only_a, only_b)
        assert n == 6
        assert (row["acc@5_a"], row["acc@5_b"]) == pytest.approx((acc_a, acc_b))
        assert row["mcnemar_p"] == mcnemar_exact_p(only_a, only_b)
        assert row["acc@5_diff_lo"] <= row["acc@5_diff"] <= row["acc@5_diff_hi"]
    # Holm over the whole run: 9 tests in one family, adjusted p >= raw p.
    assert (table["target_logprob_p_holm"] >= table["target_logprob_p"]).all()
    smallest = table["target_logprob_p"].min()
    assert table["target_logprob_p_holm"].min() == pytest.approx(min(1.0, 9 * smallest))
    # The log-prob difference is the mean per-prompt difference.
    row = table.row(0, named=True)
    cell = examples.filter(pl.col("template") == row["template"])
    means = {
        g: cell.filter(pl.col("graft") == g)["target_logprob"].mean() for g in ("FE+LT", "SFT")
    }
    assert row["target_logprob_diff"] == pytest.approx(means["FE+LT"] - means["SFT"])
    csv = pl.read_csv(run / "contrasts.csv")
    assert csv.columns == table.columns and csv.height == table.height


def test_key_contrasts_skip_pairs_whose_grafts_are_absent():
    rows = []
    for graft, hits in {
        "FFN": [0, 0, 1, 0],
        "O+FFN": [1, 1, 1, 0],
        "ATTN+O+FFN": [1, 1, 1, 1],
    }.items():
        for i, hit in enumerate(hits):
            rows.append(
                {
                    "graft": graft,
                    "group": "sft",
                    "template": "qa",
                    "prompt_id": f"p{i}",
                    "hit@5": bool(hit),
                    "target_logprob": -1.0 - i + hit,
                }
            )
    table = key_contrasts(pl.DataFrame(rows), n_boot=100)
    assert table.select("graft_a", "graft_b").rows() == [("O+FFN", "FFN"), ("ATTN+O+FFN", "O+FFN")]
    assert table["mcnemar_b"].to_list() == [2, 1] and table["mcnemar_c"].to_list() == [0, 0]
    assert table["acc@5_diff"].to_list() == pytest.approx([0.5, 0.25])
    assert ("FE+LT", "SFT") in KEY_CONTRASTS
    assert key_contrasts(pl.DataFrame(rows).filter(pl.col("graft") == "FFN")).is_empty()


# ----------------------------------------------------------------------------- compare


def test_compare_prints_each_template(run):
    result = invoke("compare", str(run), "FE+LT", "SFT", "--n-boot", "200")
    text = result.output
    table = compare_run(run, "FE+LT", "SFT", n_boot=200)
    examples = _examples(run)
    for template in TEMPLATES:
        n, acc_a, acc_b, only_a, only_b = _hand_counts(examples, template, "FE+LT", "SFT")
        row = table.filter(pl.col("template") == template).row(0, named=True)
        assert f"{template}: FE+LT vs SFT, n={n} prompts" in text
        assert f"acc@5: FE+LT {acc_a:.3f}, SFT {acc_b:.3f}; difference {acc_a - acc_b:+.3f}" in text
        assert f"McNemar: b={only_a} (FE+LT only), c={only_b} (SFT only)" in text
        assert f"target_logprob: FE+LT {row['target_logprob_a']:.3f}" in text
        assert f"difference {row['target_logprob_diff']:+.3f} [" in text
    assert text.count("paired bootstrap") == 3 and "95% Newcombe paired interval" in text


def test_compare_metric_and_score_options(run):
    text = invoke("compare", str(run), "LT", "PRE", "--metric", "acc@50", "--score", "target_rank")
    assert "acc@50: LT" in text.output and "target_rank: LT" in text.output
    table = compare_run(run, "LT", "PRE", metric="hit@50", score="target_rank", n_boot=50)
    examples = _examples(run)
    for row in table.iter_rows(named=True):
        n, *_, only_a, only_b = _hand_counts(examples, row["template"], "LT", "PRE", "hit@50")
        assert (row["n"], row["mcnemar_b"], row["mcnemar_c"]) == (n, only_a, only_b)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["FE+LT", "XX"], "graft 'XX' not in this run; its grafts are PRE, SFT, FE, LT, FE+LT"),
        (["YY", "XX"], "grafts 'YY', 'XX' not in this run; its grafts are PRE, SFT, FE"),
        (["FE", "FE"], "compare two different grafts, got 'FE' twice"),
        (["FE", "PRE", "--metric", "hit@3"], "metric 'hit@3' is not an accuracy of this run"),
        (["FE", "PRE", "--metric", "mean_rank"], "use one of acc@1, acc@5, acc@10, acc@50"),
        (["FE", "PRE", "--score", "text"], "unknown score 'text'; use one of target_rank"),
    ],
)
def test_compare_bad_names_are_one_line_errors(run, args, message):
    result = invoke("compare", str(run), *args, code=2)
    assert message in result.output
    assert result.output.count("Error:") == 1 and "Traceback" not in result.output


def test_compare_needs_a_finished_run(run, tmp_path):
    result = invoke("compare", str(tmp_path), "FE", "PRE", code=2)
    assert "is not a finished run folder (needs config.json and examples.parquet)" in result.output
    (tmp_path / "config.json").write_text("{}")  # started, never finished
    assert "not a finished run" in invoke("compare", str(tmp_path), "FE", "PRE", code=2).output
    invoke("compare", str(tmp_path / "nope"), "FE", "PRE", code=2)
    save_table(pl.DataFrame(), tmp_path / "examples.parquet", "examples")  # a run of no rows
    assert (
        "holds no scored examples" in invoke("compare", str(tmp_path), "FE", "PRE", code=2).output
    )
    with pytest.raises(RunFolderError):
        compare_run(tmp_path, "FE", "PRE")
    with pytest.raises(ExperimentError, match="its grafts are"):
        compare_run(run, "ATTN", "PRE")


def test_compare_reads_every_pair_of_a_component_root(run, tmp_path):
    # graft-exp component with several pairs writes each pair's run into a sub-folder and
    # only the combined summary into the root.
    examples = _examples(run)
    for pair in ("sft", "reversal"):
        (tmp_path / pair).mkdir()
        save_table(  # as graft writes them: with its marks
            examples.with_columns(group=pl.lit(pair)),
            tmp_path / pair / "examples.parquet",
            "examples",
        )
    (tmp_path / "config.json").write_text(json.dumps({"pairs": ["sft", "reversal"]}))
    table = compare_run(tmp_path, "FE", "PRE", n_boot=50)
    assert table.select("group", "template").rows() == [
        (g, t) for g in ("sft", "reversal") for t in TEMPLATES
    ]
    text = invoke("compare", str(tmp_path), "FE", "PRE", "--n-boot", "50").output
    assert "headline [reversal]: FE vs PRE" in text
