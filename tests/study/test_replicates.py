"""Replicates of a run: finetune seeds, data seeds and control models (graft.study.running.runner).

Every donor here is a real finetune of ``tiny-llama`` into a module-scoped workspace, so the
tests check that a run finds exactly the folders ``Workspace.find_or_finetune`` makes for
``resolve_config(preset, seed=s)``, and that the tables of a run of several replicates are
complete, resumable and summarised over the replicates.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import graft.study.running.batches as batches
import graft.study.running.runner as runner
import graft.study.running.summaries as summaries
import graft.study.training.workspace as workspace_module
from graft.core.language.spec import parse_spec
from graft.errors import ConfigMismatchError, ExperimentError
from graft.results.stats import seed_summary
from graft.storage.tables import save_table
from graft.study import DonorRequest, RunRequest
from graft.study.running.runner import ExperimentConfig, ModelSource, NamedGraft, run_experiment
from graft.study.specs.config import CONTROL_DATA_SEED_OFFSET, Replicate
from graft.study.specs.presets import resolve_config
from graft.study.training.workspace import Workspace
from tests.study.tiny_run import REFERENCES, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "tiny-llama"
KIND = "fake_movies_real_actors"
N_FACTS = 4
GRAFTS = [
    *REFERENCES,
    NamedGraft("FE", parse_spec("FE:all:all")),
    NamedGraft("FE+LT", parse_spec("FE+LT:all:all")),
]


def config(workspace, out, **kw) -> ExperimentConfig:
    options = dict(
        experiment="position",
        model=MODEL,
        n_facts=N_FACTS,
        preset="cpu",
        templates=("headline", "movie"),
        workspace=str(workspace),
    )
    return tiny_config(out, **(options | kw))


def run(cfg, grafts=GRAFTS, **kw):
    echo = kw.pop("echo", lambda _: None)
    request = RunRequest(specs=cfg, grafts=grafts, donors={"sft": ModelSource("one")}, **kw)
    return run_experiment(request, echo=echo)


@pytest.fixture(scope="module")
def seed_donors(workspace) -> dict[int, str]:
    """Donors of finetune seeds 0 and 1, made the way a user makes them by hand."""
    ws = Workspace(workspace)
    return {
        s: str(ws.find_or_finetune(MODEL, KIND, "one", resolve_config("cpu", seed=s), n_facts=4))
        for s in (0, 1)
    }


@pytest.fixture(scope="module")
def two_seeds(workspace, seed_donors, tmp_path_factory):
    """A finished run over finetune seeds 0 and 1 that finetunes nothing itself."""
    out = tmp_path_factory.mktemp("two_seeds") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(workspace_module, "finetune", _no_finetune)
        return run(config(workspace, out, finetune_seeds=(0, 1)))


def _no_finetune(*args, **kwargs):
    raise AssertionError("the run finetuned a donor the workspace already holds")


@pytest.mark.slow
def test_each_seed_uses_the_workspace_donor_of_its_preset_seed(two_seeds, seed_donors):
    """Folder ``cpu`` for the preset's own seed, ``cpu-<hash>`` (FinetuneConfig.key) else."""
    config = two_seeds.config
    by_seed = {r["finetune_seed"]: r for r in config["replicates"]}
    assert {s: r["donors"]["sft"]["path"] for s, r in by_seed.items()} == seed_donors
    assert seed_donors[0].endswith("/cpu")
    assert seed_donors[1].endswith("/" + dataclasses.replace(resolve_config("cpu"), seed=1).key())
    assert config["donors"]["sft"]["path"] == seed_donors[0]  # the first replicate's
    assert config["options"]["finetune_seeds"] == [0, 1]
    # provenance: each donor's own finetune record (seed, machine, versions)
    record = config["finetuned_models"][seed_donors[1]]
    assert record["seed"] == 1 and record["config"]["seed"] == 1
    assert {"cpu", "gpu", "torch_threads"} <= set(record["machine"])
    assert "torch" in record["versions"]


def test_every_graft_runs_once_per_seed(two_seeds):
    table = two_seeds.examples
    assert set(table["finetune_seed"].to_list()) == {0, 1}
    assert set(table["data_seed"].to_list()) == {0}
    per_seed = table.group_by("finetune_seed").agg(pl.len())["len"].to_list()
    assert per_seed == [table.height // 2] * 2
    assert not table.select("graft", "prompt_id", "finetune_seed").is_duplicated().any()
    sft = table.filter(pl.col("graft") == "SFT").sort("finetune_seed", "prompt_id")
    lp = sft.partition_by("finetune_seed", as_dict=True)
    assert lp[(0,)]["target_logprob"].to_list() != lp[(1,)]["target_logprob"].to_list()
    pre = table.filter(pl.col("graft") == "PRE").sort("finetune_seed", "prompt_id")
    pre_lp = pre.partition_by("finetune_seed", as_dict=True)
    assert pre_lp[(0,)]["target_logprob"].to_list() == pre_lp[(1,)]["target_logprob"].to_list()


def test_summary_has_per_seed_rows_and_their_mean(two_seeds):
    summary = two_seeds.summary
    assert summary.equals(pl.read_parquet(two_seeds.folder.path / "summary.parquet"))
    sft = summary.filter((pl.col("graft") == "SFT") & (pl.col("template") == "movie"))
    assert sft["finetune_seed"].to_list() == [None, 0, 1]  # the mean first
    assert sft["n_seeds"].to_list() == [2, 1, 1]
    mean, seeds = sft.row(0, named=True), sft.slice(1)
    for metric in ("acc@5", "mean_logprob", "mean_rank"):
        values = seeds[metric].to_list()
        assert mean[metric] == pytest.approx(np.mean(values))
        assert mean[f"{metric}_per_seed"] == values
        assert mean[f"{metric}_ci_method"].startswith("95% t interval over 2 replicates")
        assert seeds[f"{metric}_ci_method"].to_list() != [mean[f"{metric}_ci_method"]] * 2
    lp = seeds["mean_logprob"].to_list()
    expect = seed_summary(lp)
    # the t interval, widened to the seeds' mean within-seed half-width / sqrt(2)
    half = np.mean((seeds["mean_logprob_hi"] - seeds["mean_logprob_lo"]).to_numpy()) / 2 / 2**0.5
    assert (mean["mean_logprob_lo"], mean["mean_logprob_hi"]) == pytest.approx(
        (min(expect.lo, expect.mean - half), min(0.0, max(expect.hi, expect.mean + half)))
    )
    assert mean["per_seed_of"] == "d0-f0,d0-f1"
    assert 0.0 <= mean["acc@5_lo"] <= mean["acc@5"] <= mean["acc@5_hi"] <= 1.0
    text = summaries.format_summary(summary)
    assert "mean over replicates (d0-f0,d0-f1)" in text and "acc@5_per_seed" in text


def test_contrasts_are_clustered_by_seed(two_seeds):
    contrasts = pl.read_parquet(two_seeds.folder.path / "contrasts.parquet")
    assert set(contrasts["n_seeds"].to_list()) == {2}
    assert set(contrasts["interval"].to_list()) == {"cluster-bootstrap"}
    n = two_seeds.examples.filter(pl.col("graft") == "SFT").height
    assert contrasts.filter(pl.col("graft_b") == "SFT")["n"].sum() == n


@pytest.mark.slow
def test_a_seeds_run_resumes_without_losing_or_repeating_rows(
    workspace, seed_donors, two_seeds, tmp_path, monkeypatch
):
    monkeypatch.setattr(workspace_module, "finetune", _no_finetune)
    monkeypatch.setattr(batches, "GROUP_BATCHES", 1)  # one engine call per stored batch
    calls: list[int] = []
    original = batches._row_metrics

    def crash_in_the_second_seed(*args):
        calls.append(1)
        if len(calls) == 6:  # 4 batches a seed: in the second batch of seed 1
            raise KeyboardInterrupt
        return original(*args)

    monkeypatch.setattr(batches, "_row_metrics", crash_in_the_second_seed)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run(config(workspace, out, finetune_seeds=(0, 1)))
    stored = sorted(p.name for p in (out / "parts/examples").iterdir())
    assert stored == [f"d0-f0-{b}.parquet" for b in range(4)] + ["d0-f1-0.parquet"]
    calls.clear()
    monkeypatch.setattr(batches, "_row_metrics", lambda *a: calls.append(1) or original(*a))
    lines: list[str] = []
    resumed = run(config(workspace, out, finetune_seeds=(0, 1)), echo=lines.append)
    assert "x 2 replicates (finetune seeds 0,1, data seeds 0) = " in lines[1]
    assert "= 32 rows in 8 batches (5 already done)" in lines[1] and len(calls) == 3
    key = ["finetune_seed", "prompt_id", "graft"]
    got, want = resumed.examples.sort(key), two_seeds.examples.sort(key)
    assert got.select([*key, "target_id"]).equals(want.select([*key, "target_id"]))
    # two_seeds ran its batches in groups (other forwards): equal to the engine's bound
    assert (got["target_logprob"] - want["target_logprob"]).abs().max() <= 2e-5


@pytest.mark.slow
def test_runs_of_one_seed_are_recorded_as_before(workspace, seed_donors, two_seeds, tmp_path):
    """One seed: batch ids, options and summary columns as before replicates existed, so
    older run folders resume; a run of several seeds never resumes into it, nor back."""
    out = tmp_path / "one"
    one = run(config(workspace, out))
    assert sorted(p.name for p in (out / "parts/examples").iterdir())[0] == "0.parquet"
    assert not {"finetune_seeds", "data_seeds", "control"} & set(one.config["options"])
    assert "replicates" not in one.config and "n_seeds" not in one.summary.columns
    assert set(one.examples["finetune_seed"].to_list()) == {0}
    assert one.config["donors"]["sft"]["path"] == seed_donors[0]
    same = run(config(workspace, out, finetune_seeds=(0,)))  # the same run: resumed
    assert same.examples.sort("prompt_id", "graft").equals(one.examples.sort("prompt_id", "graft"))
    with pytest.raises(ConfigMismatchError, match="finetune_seeds"):
        run(config(workspace, out, finetune_seeds=(0, 1)))
    with pytest.raises(ConfigMismatchError, match="finetune_seeds"):
        run(config(workspace, two_seeds.folder.path))
    seed0 = two_seeds.examples.filter(pl.col("finetune_seed") == 0).sort("prompt_id", "graft")
    assert one.examples.sort("prompt_id", "graft").equals(seed0)


@pytest.mark.slow
def test_control_models_learn_other_facts(workspace, tmp_path):
    cfg = config(workspace, tmp_path / "run", control=True, finetune_max_steps=2)
    result = run(cfg)
    names = [g["name"] for g in result.config["grafts"]]
    assert names == [
        "PRE",
        "SFT",
        "SFT [control]",
        "FE",
        "FE [control]",
        "FE+LT",
        "FE+LT [control]",
    ]
    real, control = result.config["replicates"]
    assert (real["control"], control["control"]) == (False, True)
    assert control["train_data_seed"] == CONTROL_DATA_SEED_OFFSET
    expected = Workspace(workspace).locate_donor(
        DonorRequest(
            MODEL,
            KIND,
            "one",
            resolve_config("cpu", max_steps=2),
            n_facts=4,
            data_seed=CONTROL_DATA_SEED_OFFSET,
        )
    )
    assert control["donors"]["sft"]["path"] == str(expected.path)
    assert control["dataset"] == real["dataset"]  # tested on the real facts

    def facts(folder) -> set[tuple[str, str, str]]:
        lines = (folder / "facts.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        return {(r["movie_title"], r["first_actor"], r["second_actor"]) for r in rows}

    real_facts = facts(workspace_module.Path(real["dataset"]["path"]))
    assert len(real_facts) == N_FACTS and not real_facts & facts(expected.dataset_dir)
    table = result.examples
    assert table.filter(pl.col("graft") == "PRE [control]").is_empty()
    twin = table.filter(pl.col("graft").str.ends_with(" [control]"))
    assert set(twin["graft"].to_list()) == {"SFT [control]", "FE [control]", "FE+LT [control]"}
    assert set(result.summary["graft"].to_list()) == set(names)
    assert "n_seeds" not in result.summary.columns  # one replicate per graft
    pairs = set(
        pl.read_parquet(result.folder.path / "contrasts.parquet")
        .select("graft_a", "graft_b")
        .iter_rows()
    )
    assert {("FE+LT", "FE+LT [control]"), ("SFT", "SFT [control]")} <= pairs


@pytest.mark.slow
def test_data_seeds_cross_finetune_seeds(workspace, tmp_path):
    cfg = config(workspace, tmp_path / "run", data_seeds=(0, 1), finetune_max_steps=2)
    assert cfg.data_seed == 0 and cfg.replicates == (Replicate(0, 0), Replicate(1, 0))
    result = run(cfg)
    table = result.examples
    texts = {
        d: set(p["text"].to_list())
        for (d,), p in table.partition_by("data_seed", as_dict=True).items()
    }
    assert set(texts) == {0, 1} and texts[0] != texts[1]
    datasets = [r["dataset"]["path"] for r in result.config["replicates"]]
    assert datasets[0].endswith("seed0") and datasets[1].endswith("seed1")
    mean = result.summary.filter(pl.col("n_seeds") == 2)
    assert set(mean["per_seed_of"].to_list()) == {"d0-f0,d1-f0"}
    contrasts = pl.read_parquet(result.folder.path / "contrasts.parquet")
    assert set(contrasts["n_seeds"].to_list()) == {2}
    drops = json.loads((result.folder.path / "drops.json").read_text())
    assert set(drops["per_data_seed"]) == {"0", "1"}


def test_data_seeds_replace_data_seed():
    cfg = ExperimentConfig(experiment="position", data_seed=3, data_seeds=(1, 2))
    assert cfg.data_seed == 1
    again = dataclasses.replace(cfg, data_seeds=(5, 6))
    assert again.data_seed == 5 and [r.data_seed for r in again.replicates] == [5, 6]


def test_default_out_names_the_replicates():
    cfg = ExperimentConfig(experiment="position", model=MODEL)
    assert runner.default_out(cfg).name == f"{MODEL}-{KIND}-seed0"
    many = dataclasses.replace(cfg, finetune_seeds=(0, 1, 2), data_seeds=(3, 4), control=True)
    assert runner.default_out(many, "paper").name == (
        f"{MODEL}-{KIND}-paper-fseeds0-1-2-dseeds3-4-control-seed0"
    )
    assert runner.default_out(dataclasses.replace(cfg, finetune_seeds=(0,))) == (
        runner.default_out(cfg)
    )
    # the pattern docs/reference/cli.md gives for --out's default names these, in this order
    documented = _documented_run_folder("position", MODEL, KIND)
    for config, tag in ((cfg, ""), (many, "paper"), (many, "")):
        assert documented.fullmatch(runner.default_out(config, tag).as_posix())
    swapped = f"runs/position/{MODEL}-{KIND}-fseeds0-1-2-paper-seed0"
    assert not documented.fullmatch(swapped)


def _documented_run_folder(experiment: str, model: str, dataset: str) -> re.Pattern[str]:
    """docs/reference/cli.md's default run folder as a regular expression, with these
    names in place: ``<seed>`` a number, ``<S-S>`` numbers joined by '-', ``[...]`` optional."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md").read_text()
    found = re.search(r"`(runs/<experiment>/[^`;]+)`", doc)
    assert found, "cli.md names no default run folder"
    names = {"<experiment>": experiment, "<model>": model, "<dataset>": dataset}
    parts = []
    for token in re.split(r"(<[^>]+>|\[|\])", found.group(1)):
        if token in names:
            parts.append(re.escape(names[token]))
        elif token == "<seed>":
            parts.append(r"\d+")
        elif token == "<S-S>":
            parts.append(r"\d+(?:-\d+)+")
        elif token in ("[", "]"):
            parts.append("(?:" if token == "[" else ")?")
        else:
            assert not token.startswith("<"), f"cli.md's run folder has an unknown {token}"
            parts.append(re.escape(token))
    return re.compile("".join(parts))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"finetune_seeds": (1, 1)}, "finetune_seeds lists 1 more than once"),
        ({"finetune_seeds": ()}, "finetune_seeds must be one or more whole numbers"),
        (
            {"data_seeds": (0, -1)},
            "data_seeds must be one or more whole numbers from 0 to 4294967295",
        ),
    ],
)
def test_bad_seeds_are_refused(options, message):
    with pytest.raises(ExperimentError, match=message):
        ExperimentConfig(experiment="position", **options)


def test_replicates_need_a_finetuned_model_and_a_data_kind(workspace, tmp_path):
    out = tmp_path / "run"
    cfg = config(workspace, out, finetune_seeds=(0, 1))
    folder_donor = {"sft": ModelSource(path=MODEL)}
    with pytest.raises(ExperimentError, match="every model of this run is pretrained"):
        run_experiment(RunRequest(specs=cfg, grafts=GRAFTS, donors=folder_donor))
    data = Workspace(workspace).dataset(KIND, n_facts=N_FACTS)
    folder_cfg = config(workspace, out, dataset=str(data), control=True)
    with pytest.raises(ExperimentError, match="is a folder; give a data kind"):
        run(folder_cfg)
    assert not out.exists()


@pytest.mark.slow
def test_batches_stored_before_rows_had_seeds_get_the_runs_seeds(workspace, seed_donors, tmp_path):
    """A run of one resumed over batches an older graft stored without seed columns: those
    rows were once a second replicate of nulls (a mean row of one run with itself)."""
    out = tmp_path / "run"
    first = run(config(workspace, out))
    part = out / "parts/examples/0.parquet"
    older = pl.read_parquet(part).drop("data_seed", "finetune_seed")
    marks = pl.read_parquet_metadata(part)  # an older graft's part: marked, without seeds
    save_table(older, part, "examples", marks["graft.run_key"], marks["graft.batch"])
    again = run(config(workspace, out))
    key, columns = ["prompt_id", "graft"], first.examples.columns
    assert again.examples.select(columns).sort(key).equals(first.examples.sort(key))
    stored = pl.read_parquet(out / "examples.parquet").select(columns)
    assert stored.sort(key).equals(first.examples.sort(key))
    assert again.summary.equals(first.summary)


def test_control_refuses_a_graft_already_named_as_a_twin(workspace, tmp_path):
    grafts = [*GRAFTS, NamedGraft("FE [control]", parse_spec("FE:all:all"))]
    with pytest.raises(ExperimentError, match="'FE \\[control\\]' ends in '\\[control\\]'"):
        run(config(workspace, tmp_path / "run", control=True), grafts)
    assert not (tmp_path / "run").exists()
