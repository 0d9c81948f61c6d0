"""graft.study.running.runner through its library API: a tiny run, batching, interruption and resume, errors.

No finetune here: the donor is a perturbed copy of ``tiny-llama`` saved to a folder and given
as an explicit model path, and the dataset is a small generated folder.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import socket
from pathlib import Path

import polars as pl
import pytest

import graft.study.running.batches as batches
import graft.study.running.runner as runner
import graft.study.training.workspace as workspace
from graft.core.language.spec import parse_spec
from graft.errors import ConfigMismatchError, ExperimentError, GraftError
from graft.models import tiny_tokenizer
from graft.models.tiny import tiny_model
from graft.remote.config import RemoteConfig
from graft.results.folder import MARKER_FILE, RunFolderError
from graft.study.running.runner import (
    ExperimentConfig,
    ModelSource,
    NamedGraft,
    RunRequest,
    load_examples,
    run_experiment,
    sample_examples,
)
from graft.study.specs.grafts import reference
from graft.study.specs.run import resolve
from tests.study.tiny_run import REFERENCES, run_with_donor, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


GRAFTS = [
    *REFERENCES,
    NamedGraft("FE", parse_spec("FE:all:all")),
    NamedGraft("LT", parse_spec("LT:h2:o,ffn")),
    NamedGraft("M", parse_spec("M:all:all")),
]


def config(dataset, out, **kw) -> ExperimentConfig:
    options = dict(dataset=str(dataset), templates=("headline", "movie"))
    return tiny_config(out, **(options | kw))


def run(cfg, donor_path, echo=None):
    return run_with_donor(cfg, GRAFTS, donor_path, echo)


def sort(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(["prompt_id", "graft"])


def test_run_experiment(dataset, donor_path, tmp_path):
    lines: list[str] = []
    result = run(config(dataset, tmp_path / "run"), donor_path, echo=lines.append)
    # 2 headline prompts x 4 grafts (no M) + 2 movie prompts x 5 grafts = 18 rows, 5 batches
    assert lines[0] == f"run folder: {tmp_path / 'run'} (new)"  # said before any work
    assert lines[1].startswith(
        "custom: 4 prompts x 5 grafts = 18 rows (2 prompt-graft pairs skipped: M on 2 prompts "
        "without M (headline)) in 5 batches (0 already"
    )
    # everything also in run.log: the plan line, the summary in full, the stage times
    log = (tmp_path / "run" / "run.log").read_text(encoding="utf-8")
    assert lines[1] in log and "summary:" in log
    assert re.search(r"time: data and checks [\d.]+ s, finetuning .*grafting [\d.]+ s", log)
    assert re.search(r"INFO graft.log: grafting: [\d.]+ s", log)
    assert result.examples.height == 18
    assert sort(result.examples).equals(sort(pl.read_parquet(tmp_path / "run/examples.parquet")))
    assert result.summary.equals(pl.read_parquet(tmp_path / "run/summary.parquet"))
    by_template = {
        t: result.summary.filter(pl.col("template") == t)["graft"].to_list()
        for t in ("headline", "movie")
    }
    assert by_template == {
        "headline": ["PRE", "SFT", "FE", "LT"],
        "movie": [g.name for g in GRAFTS],
    }
    assert result.config["donors"]["sft"]["path"] == donor_path
    assert result.config["donors"]["sft"]["fingerprint"]
    # how each model folder was checked: the donor the user brought was accepted as it is
    assert result.config["model_checks"][donor_path].startswith("accepted as is 20")
    assert result.config["options"]["templates"] == ["headline", "movie"]
    assert result.drops == {"headline": {}, "movie": {}}
    lp = {
        g: part["target_logprob"].to_list()
        for (g,), part in sort(result.examples).group_by(["graft"], maintain_order=True)
    }
    assert lp["PRE"] != lp["SFT"] and lp["PRE"] != lp["FE"]


@pytest.mark.slow
def test_batching_does_not_change_numbers(dataset, donor_path, tmp_path):
    one = run(config(dataset, tmp_path / "b1", batch_size=1), donor_path).examples
    many = run(config(dataset, tmp_path / "b32", batch_size=32), donor_path).examples
    one, many = sort(one), sort(many)
    assert one.select(["prompt_id", "graft", "target_id"]).equals(
        many.select(["prompt_id", "graft", "target_id"])
    )
    diff = (one["target_logprob"] - many["target_logprob"]).abs().max()
    # logits agree to the engine's float32 bound, 1e-5; log-probs to twice that
    assert diff <= 2e-5


@pytest.mark.slow
def test_stored_batches_run_in_groups_with_the_same_numbers(
    dataset, donor_path, tmp_path, monkeypatch
):
    calls: list[int] = []
    original = batches._row_metrics
    monkeypatch.setattr(batches, "_row_metrics", lambda *a: calls.append(len(a[3])) or original(*a))
    grouped = run(config(dataset, tmp_path / "grouped", batch_size=1), donor_path)
    # 18 stored batches of one row, handed to the engine 8 at a time, each stored on its own
    assert calls == [8, 8, 2]
    assert len(list((tmp_path / "grouped/parts/examples").iterdir())) == 18
    monkeypatch.setattr(batches, "GROUP_BATCHES", 1)
    calls.clear()
    single = run(config(dataset, tmp_path / "single", batch_size=1), donor_path)
    assert calls == [1] * 18
    a, b = sort(grouped.examples), sort(single.examples)
    assert a.select(["prompt_id", "graft", "target_id"]).equals(
        b.select(["prompt_id", "graft", "target_id"])
    )
    assert (a["target_logprob"] - b["target_logprob"]).abs().max() <= 2e-5


@pytest.mark.slow
def test_interrupted_run_resumes(dataset, donor_path, tmp_path, monkeypatch):
    monkeypatch.setattr(batches, "GROUP_BATCHES", 1)  # one engine call per stored batch
    expected = sort(run(config(dataset, tmp_path / "full"), donor_path).examples)

    calls: list[int] = []
    original = batches._row_metrics

    def crash_on_third(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the user hits Ctrl-C in the middle of batch 2
        return original(*args)

    monkeypatch.setattr(batches, "_row_metrics", crash_on_third)
    out = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        run(config(dataset, out), donor_path)
    assert sorted(p.name for p in (out / "parts/examples").iterdir()) == [
        "0.parquet",
        "1.parquet",
    ]
    assert not (out / "examples.parquet").exists() and not (out / "summary.parquet").exists()

    calls.clear()
    monkeypatch.setattr(batches, "_row_metrics", lambda *a: calls.append(1) or original(*a))
    lines: list[str] = []
    resumed = run(config(dataset, out), donor_path, echo=lines.append)
    assert lines[0] == f"run folder: {out} (resuming it)"
    assert "(2 already done)" in lines[1] and len(calls) == 3
    assert sort(resumed.examples).equals(expected)
    assert resumed.examples.select(["prompt_id", "graft"]).is_duplicated().sum() == 0


def test_bad_input_writes_nothing(dataset, donor_path, tmp_path):
    out = tmp_path / "out"
    donors = {"sft": ModelSource(path=donor_path)}
    cfg = config(dataset, out)
    with pytest.raises(ExperimentError, match="no grafts"):
        run_experiment(RunRequest(specs=cfg, grafts=[], donors=donors))
    with pytest.raises(ExperimentError, match=r"uses donor\(s\) \['task'\] not loaded"):
        run_experiment(
            RunRequest(
                specs=cfg, grafts=[NamedGraft("x", parse_spec("LT:all:o@task"))], donors=donors
            )
        )
    with pytest.raises(ExperimentError, match="names span.* Q that no test prompt has"):
        run_experiment(
            RunRequest(specs=cfg, grafts=[NamedGraft("x", parse_spec("Q+LT:all:o"))], donors=donors)
        )
    bad_templates = dataclasses.replace(cfg, templates=("headline", "nope"))
    with pytest.raises(ExperimentError, match="templates nope.*available: headline, movie, qa"):
        run_experiment(RunRequest(specs=bad_templates, grafts=GRAFTS, donors=donors))
    bad_dataset = dataclasses.replace(cfg, dataset="not_a_kind")
    with pytest.raises(GraftError, match="neither a dataset folder nor a data kind"):
        run_experiment(RunRequest(specs=bad_dataset, grafts=GRAFTS, donors=donors))
    assert not out.exists()


def test_load_and_sample_examples(dataset):
    tok = tiny_tokenizer()
    cfg = ExperimentConfig(experiment="x", templates=("qa", "headline", "qa"))
    examples, drops = load_examples(dataset, tok, resolve(cfg).data)
    assert [e.template for e in examples] == ["qa"] * 4 + ["headline"] * 4  # no duplicates
    assert set(drops) == {"qa", "headline"}
    assert len({e.prompt_id for e in examples}) == len(examples)

    picked = sample_examples(examples, 2, seed=0)
    assert [e.template for e in picked] == ["qa"] * 2 + ["headline"] * 2
    assert [examples.index(e) for e in picked] == sorted(examples.index(e) for e in picked)
    assert sample_examples(examples, 2, seed=0) == picked
    assert any(sample_examples(examples, 2, seed=s) != picked for s in range(1, 6))
    assert sample_examples(examples, 10, seed=0) == examples
    assert sample_examples(examples, None, seed=0) == examples


def test_default_out():
    cfg = ExperimentConfig(experiment="position", model="tiny-llama", seed=3)
    assert runner.default_out(cfg) == Path("runs/position/tiny-llama-fake_movies_real_actors-seed3")
    assert runner.default_out(cfg, "gentle").name.endswith("-gentle-seed3")


# ------------------------------------------------------------------ trust: wrong tables, run folders


@pytest.mark.parametrize(
    ("grafts", "message"),
    [
        (
            [NamedGraft("a", parse_spec("FE:all:all")), NamedGraft("a", parse_spec("LT:all:all"))],
            "two grafts are named 'a': 'FE:all:all' and 'LT:all:all'",
        ),
        (
            [reference("PRE", None), NamedGraft("PRE", parse_spec("FE+LT:all:all"))],
            "two grafts are named 'PRE': 'none' and 'FE+LT:all:all'",
        ),
        (
            [
                NamedGraft("FE", parse_spec("FE:all:all")),
                NamedGraft("FE", parse_spec("FE:all:all")),
            ],
            "two grafts are named 'FE'",
        ),
        ([NamedGraft(" ", parse_spec("FE:all:all"))], "has no name"),
    ],
)
def test_grafts_of_one_name_are_refused_never_pooled(
    dataset, donor_path, tmp_path, grafts, message
):
    """Two grafts of one name were pooled into one summary row with doubled n."""
    out = tmp_path / "out"
    with pytest.raises(ExperimentError, match=re.escape(message)):
        run_experiment(
            RunRequest(
                specs=config(dataset, out),
                grafts=grafts,
                donors={"sft": ModelSource(path=donor_path)},
            )
        )
    assert not out.exists()


def test_one_name_in_two_groups_is_two_results():
    grafts = [
        NamedGraft("PRE", parse_spec("none"), "sft"),
        NamedGraft("PRE", parse_spec("none"), "rev"),
    ]
    runner.check_grafts(grafts, {})  # the summary keys on (group, graft): nothing pooled


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_reachability_check_connects_only():
    from graft.remote.client import RemoteError, check_reachable

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        check_reachable(RemoteConfig(mode="remote", host=f"http://127.0.0.1:{port}"))
    check_reachable(RemoteConfig(mode="simulate"))  # nothing to reach
    with pytest.raises(RemoteError, match="cannot reach the NDIF host"):
        check_reachable(RemoteConfig(mode="remote", host=f"http://127.0.0.1:{closed_port()}"))
    with pytest.raises(RemoteError, match="is not a URL"):
        check_reachable(RemoteConfig(mode="remote", host="http://127.0.0.1:port"))


def bad_starts(dataset, donor_path, tmp_path) -> dict:
    """Starts that fail validation, as (config, grafts, donors)."""
    donors = {"sft": ModelSource(path=donor_path)}
    gpt2 = tmp_path / "tiny-gpt2"
    tiny_model("gpt2", seed=0).save_pretrained(gpt2)
    tiny_tokenizer().save_pretrained(gpt2)
    (tmp_path / "file").write_text("x")
    unreachable = RemoteConfig(mode="remote", host=f"http://127.0.0.1:{closed_port()}", retries=0)
    return {
        "layer out of range": ({}, [NamedGraft("x", parse_spec("LT:9:o"))], donors),
        "donor of another family": ({}, GRAFTS, {"sft": ModelSource(path=str(gpt2))}),
        "unknown device": ({"device": "banana"}, GRAFTS, donors),
        "unreachable host": ({"remote": unreachable}, GRAFTS, donors),
        "unwritable workspace": (
            {"dataset": "fake_movies_real_actors", "workspace": str(tmp_path / "file" / "ws")},
            GRAFTS,
            donors,
        ),
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("layer out of range", "layer 9"),
        ("donor of another family", "gpt2"),
        ("unknown device", "unknown device 'banana'"),
        ("unreachable host", "cannot reach the NDIF host"),
        ("unwritable workspace", "cannot generate the dataset in the workspace"),
    ],
)
def test_failed_start_leaves_no_trace_and_the_rerun_works(
    dataset, donor_path, tmp_path, case, message
):
    """A failed start once left config.json behind, and the corrected rerun into the same
    (default) folder was refused as a different configuration."""
    out = tmp_path / "out"
    changes, grafts, donors = bad_starts(dataset, donor_path, tmp_path)[case]
    with pytest.raises(GraftError, match=message) as info:
        cfg = dataclasses.replace(config(dataset, out), **changes)
        run_experiment(RunRequest(specs=cfg, grafts=grafts, donors=donors))
    assert "\n" not in str(info.value)
    assert not out.exists()
    assert run(config(dataset, out), donor_path).examples.height == 18


def test_unwritable_out_is_refused_before_anything_runs(dataset, donor_path, tmp_path):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "run"):
        with pytest.raises(RunFolderError, match="run folder"):
            run(config(dataset, out), donor_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.slow
def test_overwrite_never_clears_a_folder_graft_did_not_write(dataset, donor_path, tmp_path):
    """--overwrite pointed at a model folder once deleted the model's config.json."""
    before = {p.name: p.read_bytes() for p in Path(donor_path).iterdir()}
    for overwrite in (True, False):
        with pytest.raises(RunFolderError, match="model folder, not a run folder"):
            run(config(dataset, donor_path, overwrite=overwrite), donor_path)
    assert {p.name: p.read_bytes() for p in Path(donor_path).iterdir()} == before
    out = tmp_path / "run"
    run(config(dataset, out), donor_path)
    assert (out / MARKER_FILE).is_file()
    changed = run(config(dataset, out, n=1, overwrite=True), donor_path)  # graft's: cleared
    assert changed.examples.height == 9


def test_templates_are_checked_before_a_donor_is_finetuned(tmp_path, monkeypatch):
    def no_finetune(*args, **kwargs):
        raise AssertionError("finetuned before the templates were checked")

    monkeypatch.setattr(workspace, "finetune", no_finetune)
    cfg = ExperimentConfig(
        experiment="position",
        model="tiny-llama",
        n_facts=4,
        templates=("nope",),
        workspace=str(tmp_path / "ws"),
        out=str(tmp_path / "out"),
        progress=False,
    )
    with pytest.raises(ExperimentError, match="templates nope"):
        run_experiment(RunRequest(specs=cfg, grafts=GRAFTS, donors={"sft": ModelSource("one")}))
    assert not (tmp_path / "ws" / "finetuned").exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_pending_finetune_is_announced_with_an_estimate(
    dataset, donor_path, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(workspace.Workspace, "finetune_donor", lambda *args, **kwargs: donor_path)
    cfg = config(dataset, tmp_path / "out", workspace=str(tmp_path / "ws"), finetune_max_steps=2)
    with caplog.at_level(logging.WARNING, logger="graft.study.running.runner"):
        run_experiment(
            RunRequest(specs=cfg, grafts=GRAFTS, donors={"sft": ModelSource("one")}),
            echo=lambda _: None,
        )
    (line,) = [r.getMessage() for r in caplog.records if "finetuned first" in r.getMessage()]
    assert "'one' model of tiny-llama" in line and "2 steps" in line and "(an estimate)" in line
    caplog.clear()
    # explicit model folders need no finetune: nothing announced
    with caplog.at_level(logging.WARNING, logger="graft.study.running.runner"):
        run(config(dataset, tmp_path / "out2"), donor_path)
    assert not [r for r in caplog.records if "finetuned first" in r.getMessage()]


def _no_finetune(monkeypatch) -> list:
    """Make any finetune fail the test; the list records the attempts."""
    calls: list = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError("a donor was finetuned before the run folder was checked")

    monkeypatch.setattr(workspace.Workspace, "finetune_donor", refuse)
    return calls


@pytest.mark.parametrize(
    ("changes", "donors", "field"),
    [
        # options known at once: refused before the datasets are made
        ({"n": 3}, {"sft": ModelSource("one")}, "options.n stored 2, now 3"),
        # the dataset: refused before it is generated into the workspace
        ({"dataset": "fake_movies_real_actors"}, {"sft": ModelSource("one")}, "dataset.path"),
        # the donor's folder: refused by where the finetune would put it, before it runs
        ({}, {"sft": ModelSource("one")}, "donors.sft.path stored"),
    ],
)
def test_a_folder_of_another_configuration_is_refused_before_any_finetune(
    dataset, donor_path, tmp_path, monkeypatch, changes, donors, field
):
    """A rerun into a folder of another configuration once finetuned its donor first, then
    was refused (issue 54: hours of GPU work ending in an error)."""
    out, ws = tmp_path / "out", tmp_path / "ws"
    run(config(dataset, out), donor_path)
    stored = (out / "config.json").read_text()
    calls = _no_finetune(monkeypatch)
    options = {"dataset": str(dataset)} | changes
    cfg = config(options.pop("dataset"), out, workspace=str(ws), finetune_max_steps=2, **options)
    with pytest.raises(ConfigMismatchError, match=re.escape(field)) as info:
        run_experiment(RunRequest(specs=cfg, grafts=GRAFTS, donors=donors), echo=lambda _: None)
    assert "\n" not in str(info.value) and not calls
    assert (out / "config.json").read_text() == stored
    # nothing generated or finetuned (the dataset is a folder, but in the second case)
    assert not (ws / "datasets").exists() and not (ws / "finetuned").exists()


def test_a_design_checks_every_run_folder_before_its_first_run(dataset, donor_path, tmp_path):
    """A design of two runs whose second folder holds another configuration: refused before
    the first run starts (it once ran, and finetuned, first)."""
    from graft.study.designs.design import Design, run_design

    second = tmp_path / "design" / "second"
    run(config(dataset, second), donor_path)
    requests = {
        name: RunRequest(
            specs=config(dataset, tmp_path / "design" / name, n=1),
            grafts=GRAFTS,
            donors={"sft": ModelSource(path=donor_path)},
        )
        for name in ("first", "second")
    }
    design = Design("custom", tmp_path / "design", requests)
    with pytest.raises(ConfigMismatchError, match="options.n stored 2, now 1"):
        run_design(design)
    assert not (tmp_path / "design" / "first").exists()


def test_a_graft_that_runs_on_no_prompt_is_said(dataset, donor_path, tmp_path, caplog):
    """``M`` on headline prompts alone: it was missing from every table without a word but
    the skipped-pairs note."""
    with caplog.at_level(logging.WARNING, logger="graft"):
        result = run(config(dataset, tmp_path / "run", templates=("headline",)), donor_path)
    assert "M" not in result.summary["graft"].to_list()
    assert (
        "graft 'M' runs on none of the 2 test prompts (templates headline): none has its "
        "span(s) M, so it is in no table" in caplog.text
    )
    assert "graft 'FE'" not in caplog.text
