"""Whole-name scoring in an experiment run (``ExperimentConfig.score_full_name``): the stored
columns against the models' own scoring, the summary, resuming, and the prompts that no
longer fit."""

from __future__ import annotations

import json

import polars as pl
import pytest
import torch

from graft.core.language.spec import parse_spec
from graft.errors import GraftError
from graft.models import load_model, tiny_tokenizer
from graft.study.data.prompts import load_test_prompts
from graft.study.running.runner import ExperimentConfig, NamedGraft, load_examples
from graft.study.specs.run import resolve
from tests.study.tiny_run import REFERENCES, run_with_donor, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

GRAFTS = [
    *REFERENCES,
    NamedGraft("FE+LT", parse_spec("FE+LT:all:all")),
    NamedGraft("LT", parse_spec("LT:h2:o,ffn")),
]
NAME_COLUMNS = ["name_text", "name_tokens", "name_logprob", "name_exact"]


def config(dataset, out, **kw) -> ExperimentConfig:
    options = dict(dataset=str(dataset), n=3, batch_size=5, score_full_name=True)
    return tiny_config(out, **(options | kw))


def run(cfg, donor_path):
    return run_with_donor(cfg, GRAFTS, donor_path)


@pytest.fixture(scope="module")
def named_run(dataset, donor_path, tmp_path_factory):
    return run(config(dataset, tmp_path_factory.mktemp("runs") / "names"), donor_path)


def own_name_logprob(model, example) -> float:
    """The model's own teacher-forced log-probability of the example's whole target."""
    ids = example.input_ids + example.target_ids
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    steps = torch.arange(len(example.input_ids) - 1, len(ids) - 1)
    return float(logprobs[steps, torch.tensor(example.target_ids)].sum())


@pytest.mark.slow
def test_run_stores_whole_name_scores(named_run, dataset, donor_path):
    examples = named_run.examples
    assert set(NAME_COLUMNS) <= set(examples.columns)
    assert examples.height == 3 * len(GRAFTS)
    # the first token is step 0 of the name: an exact name has its first token on top, and
    # every further token only lowers the log-probability
    assert examples.filter(pl.col("name_exact") & (pl.col("target_rank") > 0)).is_empty()
    assert (examples["name_logprob"] <= examples["target_logprob"] + 1e-6).all()
    assert (examples["name_tokens"] > 1).all()

    cfg = config(dataset, "unused")
    tok = tiny_tokenizer()
    found = {ex.prompt_id: ex for ex in load_examples(dataset, tok, resolve(cfg).data, 64)[0]}
    base, donor = load_model("tiny-llama").model, load_model(donor_path).model
    for graft, model in (("PRE", base), ("SFT", donor)):
        for row in examples.filter(pl.col("graft") == graft).iter_rows(named=True):
            ex = found[row["prompt_id"]]
            assert row["name_text"] == ex.target_text
            assert row["name_tokens"] == len(ex.target_ids)
            assert row["name_logprob"] == pytest.approx(own_name_logprob(model, ex), abs=1e-4)


def test_run_reports_its_stage_times(named_run):
    stages = named_run.times.seconds
    assert list(stages) == ["data and checks", "finetuning", "loading", "grafting", "summaries"]
    assert all(s >= 0 for s in stages.values())


def test_summary_has_name_statistics(named_run):
    summary = named_run.summary
    for column in ("name_exact", "name_exact_lo", "name_exact_hi", "mean_name_logprob"):
        assert column in summary.columns, column
    pre = summary.filter(pl.col("graft") == "PRE").row(0, named=True)
    rows = named_run.examples.filter(pl.col("graft") == "PRE")
    assert pre["name_exact"] == pytest.approx(rows["name_exact"].mean())
    assert pre["mean_name_logprob"] == pytest.approx(rows["name_logprob"].mean())
    assert pre["name_exact_ci_method"] == "95% Wilson interval"


def test_key_contrasts_on_whole_names(named_run):
    path = named_run.folder.path / "contrasts_name.csv"
    table = pl.read_csv(path)
    row = table.filter((pl.col("graft_a") == "FE+LT") & (pl.col("graft_b") == "SFT")).row(
        0, named=True
    )
    ex = named_run.examples.sort("prompt_id")
    a = ex.filter(pl.col("graft") == "FE+LT")["name_exact"].to_numpy()
    b = ex.filter(pl.col("graft") == "SFT")["name_exact"].to_numpy()
    assert (row["mcnemar_b"], row["mcnemar_c"]) == (int((a & ~b).sum()), int((b & ~a).sum()))
    assert row["name_exact_diff"] == pytest.approx(a.mean() - b.mean())
    la = ex.filter(pl.col("graft") == "FE+LT")["name_logprob"].to_numpy()
    lb = ex.filter(pl.col("graft") == "SFT")["name_logprob"].to_numpy()
    assert row["name_logprob_diff"] == pytest.approx((la - lb).mean())


def test_compare_on_whole_names(named_run):
    from graft.results.compare import compare_run, format_comparison

    table = compare_run(
        named_run.folder.path, "FE+LT", "SFT", metric="name_exact", score="name_logprob", n_boot=20
    )
    text = format_comparison(table)
    assert "name_exact: FE+LT" in text and "name_logprob: FE+LT" in text
    with pytest.raises(GraftError, match="use one of acc@1.*name_exact"):
        compare_run(named_run.folder.path, "FE+LT", "SFT", metric="acc@3")


@pytest.mark.slow
def test_first_token_metrics_do_not_depend_on_the_option(named_run, dataset, donor_path, tmp_path):
    plain = run(config(dataset, tmp_path / "plain", score_full_name=False), donor_path).examples
    assert not set(NAME_COLUMNS) & set(plain.columns)
    keys = ["prompt_id", "graft"]
    named = named_run.examples.sort(keys).select(plain.columns)
    assert named.drop("target_prob", "target_logprob").equals(
        plain.sort(keys).drop("target_prob", "target_logprob")
    )
    assert named["target_logprob"].to_list() == pytest.approx(
        plain.sort(keys)["target_logprob"].to_list(), abs=1e-6
    )


@pytest.mark.slow
def test_runs_with_and_without_names_never_mix(dataset, donor_path, tmp_path):
    run(config(dataset, tmp_path / "a"), donor_path)
    with pytest.raises(GraftError, match="options.score_full_name stored true, now false"):
        run(config(dataset, tmp_path / "a", score_full_name=False), donor_path)
    run(config(dataset, tmp_path / "b", score_full_name=False), donor_path)
    with pytest.raises(GraftError, match="options.score_full_name stored false, now true"):
        run(config(dataset, tmp_path / "b"), donor_path)


@pytest.mark.slow
def test_a_run_from_before_the_option_resumes(dataset, donor_path, tmp_path):
    out = tmp_path / "old"
    run(config(dataset, out, score_full_name=False), donor_path)
    stored = json.loads((out / "config.json").read_text())
    del stored["options"]["score_full_name"]
    (out / "config.json").write_text(json.dumps(stored))
    again = run(config(dataset, out, score_full_name=False), donor_path)
    assert "name_exact" not in again.examples.columns


def test_prompts_whose_name_does_not_fit_are_dropped_as_too_long(dataset):
    tok = tiny_tokenizer()
    everything, _ = load_test_prompts(dataset, tok, ["headline"], max_length=64)
    limit = max(len(ex.input_ids) for ex in everything)
    fits, report = load_test_prompts(dataset, tok, ["headline"], max_length=limit)
    assert len(fits) == len(everything) and not report.dropped
    names, report = load_test_prompts(
        dataset, tok, ["headline"], max_length=limit, whole_target=True
    )
    fitting = [e for e in everything if len(e.input_ids) + len(e.target_ids) - 1 <= limit]
    assert [e.prompt_id for e in names] == [e.prompt_id for e in fitting]
    assert report.dropped == {"too_long": len(everything) - len(fitting)} != {"too_long": 0}
    for ex in everything:
        assert ex.target_ids[0] == ex.target_id
        full = tok(ex.text + ex.target_text, add_special_tokens=False)["input_ids"]
        assert ex.input_ids[1:] + ex.target_ids == full


def test_name_exact_figures(named_run):
    from graft.results.plots.style import is_unit_metric
    from graft.results.report import draw_figures

    assert is_unit_metric("name_exact") and not is_unit_metric("mean_name_logprob")
    drawn = draw_figures(named_run.folder.path, metric="name_exact")
    assert drawn and all(p.name.endswith("_name_exact.png") for p in drawn)


@pytest.mark.slow
def test_simulated_remote_run_gives_the_same_names(named_run, dataset, donor_path, tmp_path):
    """Remotely every step's metrics are computed inside the trace (the first token's too)."""
    from graft.remote.config import RemoteConfig

    cfg = config(dataset, tmp_path / "sim", remote=RemoteConfig(mode="simulate"))
    remote = run(cfg, donor_path).examples.sort(["prompt_id", "graft"])
    local = named_run.examples.sort(["prompt_id", "graft"])
    assert remote["name_exact"].to_list() == local["name_exact"].to_list()
    assert remote["name_tokens"].to_list() == local["name_tokens"].to_list()
    assert remote["name_logprob"].to_list() == pytest.approx(
        local["name_logprob"].to_list(), abs=1e-4
    )
