"""Finetuning: presets, data split, a tiny finetune that learns, resume, evaluation, workspace,
CLI errors."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import random
import re
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from click.testing import CliRunner

from graft.errors import DamagedFileError, DatasetError, FinetuneError, StorageError
from graft.models import load_model
from graft.results.metrics import example_metrics
from graft.storage.files import current_umask
from graft.study import DonorRequest
from graft.study.data import generic_corpus, training_data
from graft.study.data.datasets import DatasetConfig, generate_dataset
from graft.study.data.files import load_generic_texts
from graft.study.data.prompts import TestExample
from graft.study.running.run_inputs import RunPaths, load_run_models
from graft.study.specs import presets
from graft.study.specs.config import ExperimentConfig
from graft.study.specs.run import resolve
from graft.study.training import duration
from graft.study.training import finetune as ft
from graft.study.training import workspace as ws_mod
from graft.study.training.donors import accept_donor, check_status, verify_donor
from graft.study.training.evaluate import evaluate_examples
from graft.study.training.workspace import Workspace, parse_variant
from graft_experiments.finetune import finetune as finetune_command

# Small and fast: 20 facts x 12 renderings, tiny model, big learning rate.
TINY = presets.FinetuneConfig(
    name="cpu", learning_rate=2e-3, weight_decay=0.0, batch_size=32, epochs=2
)


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    # One thread: the tiny models are faster that way, and CI machines are shared.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    random.seed(0)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "facts20"
    return generate_dataset(DatasetConfig(n_facts=20), out)


@pytest.fixture(scope="module")
def split_dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "split"
    return generate_dataset(DatasetConfig(n_facts=10, split=True), out)


def test_presets() -> None:
    assert presets.PAPER.learning_rate == 2e-5 and presets.PAPER.weight_decay == 0.01
    assert (
        presets.PAPER.batch_size == 4 and presets.PAPER.epochs == 10 and presets.PAPER.fp16_on_cuda
    )
    assert presets.GENTLE.learning_rate == 2e-6 and presets.GENTLE.weight_decay == 0
    assert presets.GENTLE.generic_ratio > 0
    assert set(presets.PRESETS) == {"paper", "paper-bf16", "gentle", "cpu"}
    lean = presets.PAPER_BF16  # the paper's numbers in bfloat16, for a 24 GB GPU
    paper = (presets.PAPER.learning_rate, presets.PAPER.weight_decay, presets.PAPER.batch_size)
    assert (lean.learning_rate, lean.weight_decay, lean.batch_size) == paper
    assert lean.epochs == presets.PAPER.epochs
    assert lean.weights_dtype == "bfloat16" and lean.gradient_checkpointing
    assert presets.resolve_config("cpu").key() == "cpu"
    changed = presets.resolve_config("cpu", learning_rate=1e-3, seed=None)
    assert changed.learning_rate == 1e-3 and changed.key().startswith("cpu-")
    with pytest.raises(FinetuneError, match="unknown preset"):
        presets.resolve_config("fast")
    with pytest.raises(FinetuneError, match="positive"):
        presets.resolve_config("cpu", epochs=0)


def test_a_batch_size_torch_cannot_sample_is_refused() -> None:
    # found by tests/cli/test_bad_inputs.py: --batch-size 2**63 was a traceback in torch
    with pytest.raises(FinetuneError, match="batch_size must be at most"):
        presets.resolve_config("cpu", batch_size=2**63)
    assert presets.resolve_config("cpu", batch_size=2**63 - 1).batch_size == 2**63 - 1


@pytest.mark.parametrize("steps", [0, -2])
def test_max_steps_below_one_is_refused(steps, dataset, tmp_path) -> None:
    with pytest.raises(FinetuneError, match=f"max_steps must be at least 1.*got {steps}"):
        presets.resolve_config("cpu", max_steps=steps)
    with pytest.raises(FinetuneError, match="max_steps must be at least 1"):
        dataclasses.replace(TINY, max_steps=steps)  # built directly: refused all the same
    assert list(tmp_path.iterdir()) == []
    assert presets.resolve_config("cpu", max_steps=1).max_steps == 1
    assert presets.resolve_config("cpu").max_steps == -1  # all epochs


def test_split_is_by_text_and_seeded(dataset) -> None:
    rows = [json.loads(line) for line in (dataset / "train.jsonl").read_text().splitlines()]
    texts = [r["text"] for r in rows]
    train, val = training_data.split_texts(texts, 0.2, seed=0)
    assert (len(train), len(val)) == (192, 48)
    assert sorted(train + val) == sorted(texts)
    assert training_data.split_texts(texts, 0.2, seed=0) == (train, val)
    assert training_data.split_texts(texts, 0.2, seed=1) != (train, val)
    fact_of = {r["text"]: r["fact_id"] for r in rows}
    assert {fact_of[t] for t in train} == {r["fact_id"] for r in rows}  # every fact trained on


def test_generic_corpus(tmp_path) -> None:
    corpus = tmp_path / "generic.txt"
    corpus.write_text("The river runs to the sea.\n\nBread is made from flour.\n")
    assert load_generic_texts(corpus) == [
        "The river runs to the sea.",
        "Bread is made from flour.",
    ]
    with pytest.raises(DatasetError, match="does not exist"):
        load_generic_texts(tmp_path / "missing.txt")


def test_generic_text_comes_from_the_config_the_dataset_or_the_shipped_corpus(
    tmp_path, dataset, monkeypatch
):
    """The dataset's corpus.jsonl (written from DatasetConfig.corpus_path) was written but
    never read: the gentle preset mixed in the shipped text instead. (Without the hub, the
    shipped text is the stand-in: tests/study/test_generic_corpus.py.)"""

    def no_hub(*args, **kwargs):
        raise generic_corpus.HubUnavailable("no network in tests")

    monkeypatch.setattr(generic_corpus, "fetch_paper_corpus", no_hub)
    corpus = tmp_path / "mine.txt"
    corpus.write_text("Own text one.\nOwn text two.\n")
    with_corpus = generate_dataset(
        DatasetConfig(n_facts=20, corpus_path=corpus), tmp_path / "with_corpus"
    )
    gentle = presets.resolve_config("gentle")
    texts, source = training_data.generic_texts(gentle, with_corpus)
    assert texts == ["Own text one.", "Own text two."] and source.endswith("corpus.jsonl")
    shipped, source = training_data.generic_texts(gentle, dataset)
    assert shipped == load_generic_texts() and source.endswith("generic_text.txt")
    chosen = dataclasses.replace(gentle, generic_corpus=str(corpus))
    assert training_data.generic_texts(chosen, dataset) == (texts, str(corpus))
    assert training_data.generic_texts(presets.resolve_config("cpu"), with_corpus) == ([], "none")


def _eval_losses(out: Path) -> list[float]:
    log = json.loads((out / "train_log.json").read_text())["log_history"]
    return [e["eval_loss"] for e in log if "eval_loss" in e]


@pytest.mark.slow
def test_tiny_finetune_learns_saves_and_reloads(dataset, tmp_path, caplog) -> None:
    out = ft.finetune("tiny-llama", dataset, tmp_path / "sft", TINY, device="cpu", quiet=True)
    assert not ft.partial_dir(out).exists()
    losses = _eval_losses(out)
    assert len(losses) == 2 and losses[1] < losses[0]
    log = json.loads((out / "train_log.json").read_text())
    train_losses = [e["loss"] for e in log["log_history"] if "loss" in e]
    assert train_losses[-1] < train_losses[0]
    assert log["best_checkpoint"] is not None

    info = json.loads((out / "finetune_config.json").read_text())
    assert info["config"] == TINY.to_dict() and info["seed"] == 0
    assert info["n_train_texts"] == 192 and info["n_val_texts"] == 48
    assert {"torch", "transformers", "nnsight", "graft"} <= set(info["versions"])
    manifest = json.loads((dataset / "manifest.json").read_text())
    assert json.loads((out / "data_manifest.json").read_text()) == manifest

    evaluation = json.loads((out / "eval.json").read_text())
    for model in ("sft", "pre"):
        forward = evaluation[model]["forward"]
        assert set(forward["per_template"]) == {"headline", "qa", "movie"}
        assert forward["overall"]["n"] == 60
        assert 0 <= forward["overall"]["top5"] <= 1
    # The finetune moved the target's probability (PRE is a random tiny model).
    assert evaluation["sft"]["forward"]["overall"] != evaluation["pre"]["forward"]["overall"]

    reloaded = load_model(out, device="cpu")
    assert reloaded.source == "local" and (out / "model.safetensors").is_file()
    # readable as the umask says (safetensors alone writes 0600): a shared workspace works
    mode = 0o666 & ~current_umask()
    assert {p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()} == {mode}
    base = load_model("tiny-llama", device="cpu")
    assert not torch.equal(
        reloaded.model.lm_head.weight, base.model.lm_head.weight
    )  # it is the finetuned model
    ids = reloaded.tokenizer("Keanu Reeves starred in", return_tensors="pt")["input_ids"]
    assert ids.max() < 96

    # A finished finetune is not redone.
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="graft.study.training.finetune"):
        assert ft.finetune("tiny-llama", dataset, out, TINY, device="cpu", quiet=True) == out
    assert "already done" in caplog.text
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


class _InterruptAfterFirstSave(transformers.TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        raise KeyboardInterrupt


@pytest.mark.slow
def test_interrupted_finetune_resumes(dataset, tmp_path, caplog) -> None:
    out = tmp_path / "sft"
    checkpoints = sorted(_interrupt_after_first_checkpoint(dataset, out).glob("checkpoint-*"))
    assert not out.exists()
    assert [c.name for c in checkpoints] == ["checkpoint-6"]  # one epoch of 192 texts / 32

    # Other settings are refused rather than mixed with the old checkpoints.
    other = dataclasses.replace(TINY, learning_rate=1e-3)
    with pytest.raises(FinetuneError, match="other settings"):
        ft.finetune("tiny-llama", dataset, out, other, device="cpu", quiet=True)

    with caplog.at_level(logging.INFO, logger="graft.study.training.partial_folder"):
        ft.finetune("tiny-llama", dataset, out, TINY, device="cpu", quiet=True)
    assert "resuming finetune from" in caplog.text
    log = json.loads((out / "train_log.json").read_text())
    assert log["resumed_from"] == "checkpoint-6" and log["global_step"] == 12
    assert len(_eval_losses(out)) == 2
    assert not ft.partial_dir(out).exists()

    # Resumed == uninterrupted (seeded data order and optimiser state restored).
    straight = ft.finetune(
        "tiny-llama", dataset, tmp_path / "straight", TINY, device="cpu", quiet=True
    )
    a = load_model(out, device="cpu").model.state_dict()
    b = load_model(straight, device="cpu").model.state_dict()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


def test_bad_dataset_inputs(tmp_path, split_dataset, dataset) -> None:
    with pytest.raises(FinetuneError, match="does not exist"):
        training_data.load_fact_dataset(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FinetuneError, match="is empty; make one with graft.study.data.datasets"):
        training_data.load_fact_dataset(tmp_path / "empty")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "train.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n{"te')
    with pytest.raises(FinetuneError, match="has no test_prompts.jsonl"):
        training_data.load_fact_dataset(tmp_path / "half")
    (tmp_path / "half" / "test_prompts.jsonl").write_text("")
    with pytest.raises(FinetuneError, match=r"train.jsonl, line 3: not valid JSON"):
        training_data.load_fact_dataset(tmp_path / "half")
    with pytest.raises(FinetuneError, match="split into sets A/B"):
        training_data.load_fact_dataset(split_dataset)
    task = training_data.load_fact_dataset(split_dataset, "A")
    assert task.train_set == "A" and {r["set"] for r in task.train} == {"A"}
    with pytest.raises(FinetuneError, match="no fact set 'C'"):
        training_data.load_fact_dataset(split_dataset, "C")
    with pytest.raises(FinetuneError, match="unknown data variant"):
        parse_variant("sideways")
    assert parse_variant("task") == ("one", "A")
    assert parse_variant("both-B") == ("both", "B")
    assert parse_variant("both") == ("both", None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no-such-model"], "unknown model"),
        (["--dataset", "{tmp}"], "has no train.jsonl"),
        (["--dataset", "{tmp}/missing"], "neither a dataset folder nor a data kind"),
        (["--dataset", "{tmp}", "--n-facts", "3"], "describe a generated dataset"),
        (["--model", "tiny-llama", "--n-facts", "0"], "n-facts"),
        (["--model", "tiny-llama", "--epochs", "-1"], "0<x<=1000"),
        (["--preset", "turbo"], "turbo"),
        (["--model", "tiny-llama", "--finetune-max-steps", "0"], "--finetune-max-steps"),
    ],
)
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, args, message) -> None:
    ws = tmp_path / "ws"
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = CliRunner().invoke(finetune_command, [*args, "--workspace", str(ws)])
    assert result.exit_code == 2, result.output
    error_lines = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(error_lines) == 1 and message in error_lines[0], result.output
    assert not ws.exists() or not any(ws.rglob("*.safetensors"))


@pytest.mark.slow
def test_find_or_finetune_finetunes_once(tmp_path, caplog) -> None:
    ws = Workspace(tmp_path / "ws")
    with caplog.at_level(logging.INFO, logger="graft.study.training.workspace"):
        path = ws.find_or_finetune("tiny-gpt2", "fake_movies_real_actors", "one", TINY, n_facts=20)
    assert "finetuning it" in caplog.text
    expected = ws.root / "finetuned/tiny-gpt2/fake_movies_real_actors-one-n20-seed0/all"
    assert path == expected / TINY.key()
    assert ft.is_finished(path)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="graft.study.training.workspace"):
        again = ws.find_or_finetune("tiny-gpt2", "fake_movies_real_actors", "one", TINY, n_facts=20)
    assert again == path and "finetuning it" not in caplog.text


@pytest.mark.slow
def test_a_donor_finished_by_another_job_meanwhile_is_not_trained_again(tmp_path, monkeypatch):
    """A job array's race: job B found no donor, then loaded its model while job A finished
    and released the lock; B takes the free lock at once and must find A's donor, not train
    (before, it checked again only when it had waited, and trained into the same folder)."""
    ws = Workspace(tmp_path / "ws")
    donor = ws.locate_donor(
        DonorRequest("tiny-gpt2", "fake_movies_real_actors", "one", TINY, n_facts=20)
    )
    finished = ws.find_or_finetune("tiny-gpt2", "fake_movies_real_actors", "one", TINY, n_facts=20)
    aside = tmp_path / "aside"
    finished.rename(aside)  # B's first look: no donor yet
    original = ft._prepare

    def a_finishes_meanwhile(*args, **kwargs):
        run = original(*args, **kwargs)
        aside.rename(donor.path)  # A's donor lands while B loads its model
        return run

    trained = []
    monkeypatch.setattr(ft, "_prepare", a_finishes_meanwhile)
    monkeypatch.setattr(ft, "_train", lambda *a, **k: trained.append(1))
    assert ws.finetune_donor(donor) == donor.path
    assert trained == [] and ft.is_finished(donor.path)


def test_find_or_finetune_names_parameters_not_commands(tmp_path, caplog, monkeypatch) -> None:
    """The library once printed a graft-exp command line; it now logs, naming no CLI flag."""
    calls = []
    monkeypatch.setattr(ws_mod, "finetune", lambda *a, **k: calls.append((a, k)) or a[2])
    ws = Workspace(tmp_path / "ws")
    with caplog.at_level(logging.INFO, logger="graft.study.training.workspace"):
        path = ws.find_or_finetune(
            "tiny-llama", "fake_movies_real_actors", "task", "cpu", n_facts=5
        )
    assert "finetuning it (cpu)" in caplog.text and "--" not in caplog.text
    assert path.parts[-2:] == ("A", "cpu") and calls[0][1]["train_set"] == "A"
    assert (ws.root / "datasets/fake_movies_real_actors-one-split-n5-seed0/train.jsonl").is_file()


def test_workspace_datasets_and_donor_folders(tmp_path, dataset) -> None:
    ws = Workspace(tmp_path / "ws")
    made = ws.dataset("fake_movies_real_actors", "both", n_facts=3, seed=1)
    assert made == ws.root / "datasets/fake_movies_real_actors-both-n3-seed1"
    assert ws.dataset(made, "both") == made and ws.dataset_label(made) == made.name
    with pytest.raises(DatasetError, match="has direction 'both', the variant asks for 'one'"):
        ws.dataset(made, "one")
    with pytest.raises(DatasetError, match="data kind 'custom' needs your file: run graft-exp"):
        ws.dataset("custom")
    with pytest.raises(DatasetError, match="neither a dataset folder nor a data kind"):
        ws.dataset("no_such_kind")
    label = ws.dataset_label(dataset)  # a folder outside the workspace: name plus a hash
    assert label.startswith("facts20-") and len(label) == len("facts20-") + 8
    cfg = presets.resolve_config("cpu")
    donor = ws.locate_donor(DonorRequest("tiny-llama", dataset, "one", cfg))
    assert donor.path == ws.root / "finetuned/tiny-llama" / label / "all/cpu"
    assert not donor.finished and donor.dataset_dir == dataset
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError, match="cannot generate the dataset in the workspace"):
        Workspace(tmp_path / "file" / "ws").dataset("fake_movies_real_actors", n_facts=3)


def test_evaluate_examples_counts_ranks_and_truncation() -> None:
    loaded = load_model("tiny-gpt2", device="cpu")
    tok = loaded.tokenizer
    texts = {"short": "Keanu Reeves starred in a movie with", "long": "Keanu Reeves " * 10}
    examples = [
        TestExample(
            fact_id=i,
            template=name,
            text=text,
            input_ids=tok(text)["input_ids"],
            spans={},
            target_text=" Tom",
            target_id=tok(" Tom", add_special_tokens=False)["input_ids"][0],
        )
        for i, (name, text) in enumerate(texts.items())
    ]
    result = evaluate_examples(loaded.model, examples, pad_id=tok.pad_token_id, batch_size=2)
    forward = result["forward"]
    assert forward["overall"]["n"] == 2 and forward["overall"]["truncated"] == 1
    with torch.no_grad():
        logits = loaded.model(**tok(texts["short"], return_tensors="pt")).logits[0, -1]
    rank = int((logits > logits[examples[0].target_id]).sum())
    assert forward["per_template"]["short"]["mean_rank"] == rank
    assert forward["per_template"]["short"]["top5"] == float(rank < 5)
    # the same numbers as the experiments' metrics (graft.results.metrics); the evaluation
    # runs a padded batch of 2, this a prompt alone: other shapes, so equal within float32
    # rounding, not bit for bit (seen: 7e-9 apart with SSE4.2 kernels)
    row = example_metrics(logits[None], [examples[0].target_id]).row(0, named=True)
    assert forward["per_template"]["short"]["mean_prob"] == pytest.approx(
        row["target_prob"], rel=1e-5, abs=1e-7
    )
    assert row["target_rank"] == rank


@pytest.mark.slow
def test_quiet_finetune_prints_no_logs_or_bars(dataset, tmp_path, capfd) -> None:
    one_step = dataclasses.replace(TINY, max_steps=1)
    out = ft.finetune("tiny-llama", dataset, tmp_path / "sft", one_step, device="cpu", quiet=True)
    assert ft.is_finished(out)
    captured = capfd.readouterr()
    printed = captured.out + captured.err
    for noise in ("'loss'", "'eval_loss'", "train_runtime", "eval PRE", "eval SFT", "it/s", "%|"):
        assert noise not in printed, printed
    # at most the logged result line, where a handler shows graft's log
    assert all(f"finetuned model saved to {out}" in line for line in printed.strip().splitlines())


@pytest.mark.slow
def test_the_trainer_logs_go_to_the_run_log_not_the_console(dataset, tmp_path, capfd) -> None:
    """With its bars on, the Trainer wrote its metrics dicts between them; they go to the
    run's log instead, one line per log step, and the bars stay."""
    from graft.results.run_log import RunLog

    two_steps = dataclasses.replace(TINY, max_steps=2)
    log = RunLog(tmp_path / "run.log")
    with log.capture():
        log.start()
        ft.finetune("tiny-llama", dataset, tmp_path / "sft", two_steps, device="cpu", quiet=False)
    captured = capfd.readouterr()
    printed = captured.out + captured.err
    assert "%|" in printed  # the bars
    for noise in ("'loss'", "'eval_loss'", "train_runtime"):
        assert noise not in printed, printed
    text = (tmp_path / "run.log").read_text(encoding="utf-8")
    assert re.search(r"graft.log: trainer step 1: \{\"loss\": [\d.]+", text)
    assert '"eval_loss"' in text and '"train_runtime"' in text


def test_finetune_refuses_bad_device_before_writing(dataset, tmp_path) -> None:
    from graft.models import DeviceError

    with pytest.raises(DeviceError, match="unknown device 'banana'"):
        ft.finetune("tiny-llama", dataset, tmp_path / "sft", TINY, device="banana")
    assert list(tmp_path.iterdir()) == []


def test_finetune_refuses_dataset_without_usable_prompt(tmp_path) -> None:
    facts = tmp_path / "facts.csv"
    title = "The " + "Very " * 29 + "Long Night"
    facts.write_text(
        "movie_title,first_actor,second_actor\n"
        f"{title},Ana Smith,John Ponce\n{title} Two,Mia Lopez,Carl Berg\n"
    )
    data = generate_dataset(DatasetConfig(kind="custom", facts_path=facts), tmp_path / "data")
    # headline and qa prompts fit tiny-gpt2's 64 positions; only movie prompts are too long
    examples, drops = ft._usable_test_prompts(data, load_model("tiny-gpt2", device="cpu"))
    assert drops.dropped == {"too_long": 4} and {e.template for e in examples} == {"headline", "qa"}


@pytest.fixture(scope="module")
def straight(dataset, tmp_path_factory) -> Path:
    """An uninterrupted tiny finetune: what every resumed run must equal bit for bit."""
    out = tmp_path_factory.mktemp("straight") / "sft"
    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # as the tests' runs (module fixtures come before _seed_and_one_thread)
    try:
        return ft.finetune("tiny-llama", dataset, out, TINY, device="cpu", quiet=True)
    finally:
        torch.set_num_threads(threads)


def _assert_same_weights(out: Path, straight: Path) -> None:
    a = load_model(out, device="cpu").model.state_dict()
    b = load_model(straight, device="cpu").model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a)


def _interrupt_after_first_checkpoint(dataset, out: Path) -> Path:
    with pytest.raises(KeyboardInterrupt):
        ft.finetune(
            "tiny-llama",
            dataset,
            out,
            TINY,
            device="cpu",
            quiet=True,
            callbacks=[_InterruptAfterFirstSave()],
        )
    return ft.partial_dir(out) / "checkpoints"


@pytest.mark.slow
def test_resume_skips_a_checkpoint_cut_short_while_saving(
    dataset, straight, tmp_path, caplog
) -> None:
    """A run killed while the Trainer saved left checkpoint-12 with its configs only; every
    rerun then died in 'Can't find a valid checkpoint'."""
    out = tmp_path / "sft"
    checkpoints = _interrupt_after_first_checkpoint(dataset, out)
    half = checkpoints / "checkpoint-12"
    half.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(checkpoints / "checkpoint-6" / name, half / name)
    with caplog.at_level(logging.INFO, logger="graft.study.training.partial_folder"):
        ft.finetune("tiny-llama", dataset, out, TINY, device="cpu", quiet=True)
    assert "skipping the incomplete checkpoint(s) checkpoint-12" in caplog.text
    assert "resuming from checkpoint-6" in caplog.text
    assert json.loads((out / "train_log.json").read_text())["resumed_from"] == "checkpoint-6"
    _assert_same_weights(out, straight)


@pytest.mark.slow
def test_disk_full_while_saving_a_checkpoint_is_one_line_and_the_rerun_resumes(
    dataset, straight, tmp_path, monkeypatch
) -> None:
    out = tmp_path / "sft"
    saves = []
    original = transformers.Trainer._save_optimizer_and_scheduler

    def full_at_the_second_checkpoint(self, output_dir):
        saves.append(output_dir)
        if len(saves) == 2:
            path = str(Path(output_dir) / "optimizer.pt")
            raise OSError(errno.ENOSPC, "No space left on device", path)
        original(self, output_dir)

    monkeypatch.setattr(
        transformers.Trainer, "_save_optimizer_and_scheduler", full_at_the_second_checkpoint
    )
    with pytest.raises(StorageError, match="No space left on device.*checkpoint-12") as info:
        ft.finetune("tiny-llama", dataset, out, TINY, device="cpu", quiet=True)
    assert "\n" not in str(info.value) and "free space" in str(info.value)
    assert str(info.value).endswith("then rerun: it resumes where this run stopped")
    monkeypatch.undo()
    ft.finetune("tiny-llama", dataset, out, TINY, device="cpu", quiet=True)
    assert json.loads((out / "train_log.json").read_text())["resumed_from"] == "checkpoint-6"
    _assert_same_weights(out, straight)


@pytest.mark.slow
def test_disk_full_in_safetensors_is_one_line_and_the_rerun_starts_over(
    dataset, tmp_path, monkeypatch, caplog
) -> None:
    """safetensors says a full disk in a SafetensorError (no OSError), and leaves the
    checkpoint without weights: the rerun has no complete checkpoint and trains from the start."""
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    one_step = dataclasses.replace(TINY, max_steps=1)
    out = tmp_path / "sft"
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    with pytest.raises(StorageError, match=f"No space left on device: {ft.partial_dir(out)}"):
        ft.finetune("tiny-llama", dataset, out, one_step, device="cpu", quiet=True)
    assert (ft.partial_dir(out) / "checkpoints/checkpoint-1/config.json").is_file()
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING, logger="graft.study.training.partial_folder"):
        ft.finetune("tiny-llama", dataset, out, one_step, device="cpu", quiet=True)
    assert "checkpoint-1" in caplog.text and "training from the start" in caplog.text
    assert ft.is_finished(out)


@pytest.mark.slow
def test_unreadable_run_json_and_eval_pre_json_are_redone(dataset, tmp_path, caplog) -> None:
    """An older graft wrote them in place: a run killed meanwhile left them cut short, and
    every rerun was a JSONDecodeError traceback."""
    out = tmp_path / "sft"
    partial = ft.partial_dir(out)
    partial.mkdir()
    (partial / "run.json").write_text('{"model": {"na')
    (partial / "eval_pre.json").write_bytes(b"\x00\x9f garbage")
    one_step = dataclasses.replace(TINY, max_steps=1)
    with caplog.at_level(logging.WARNING, logger="graft.study.training"):
        ft.finetune("tiny-llama", dataset, out, one_step, device="cpu", quiet=True)
    assert f"{partial / 'run.json'} is unreadable" in caplog.text
    assert f"{partial / 'eval_pre.json'} is unreadable" in caplog.text
    assert ft.is_finished(out)
    assert set(json.loads((out / "eval.json").read_text())["pre"]) >= {"forward"}


@pytest.mark.parametrize("below", ["file", "/proc/graft-no-such"])
def test_cli_out_that_cannot_be_written_is_one_line_before_the_model_loads(
    tmp_path, monkeypatch, below
) -> None:
    """Was a FileNotFoundError traceback about '<out>.partial', after the model had loaded."""
    (tmp_path / "file").write_text("x")
    parent = tmp_path / below if below == "file" else Path(below)
    out = parent / "deeper" / "sft"

    def no_model_please(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(ft, "load_model", no_model_please)
    args = ["--model", "tiny-llama", "--n-facts", "3", "--workspace", str(tmp_path / "ws")]
    result = CliRunner().invoke(finetune_command, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and f"cannot write the output folder {out}" in errors[0]
    assert not (parent / "deeper").exists() and (tmp_path / "file").read_text() == "x"


@pytest.mark.slow
def test_finished_finetune_has_checksums_and_garbled_donor_weights_are_refused(
    straight, tmp_path, caplog
) -> None:
    """Garbled donor weights loaded silently (exit 0, other results)."""
    sums = json.loads((straight / "checksums.json").read_text())
    files = {p.name for p in straight.iterdir()} - {"checksums.json"}
    assert set(sums) == files and "model.safetensors" in files
    weights = (straight / "model.safetensors").read_bytes()
    assert sums["model.safetensors"] == hashlib.sha256(weights).hexdigest()

    donor = tmp_path / "donor"
    shutil.copytree(straight, donor)
    execution = resolve(
        ExperimentConfig(experiment="t", model="tiny-llama", device="cpu")
    ).execution
    paths = RunPaths("tiny-llama", {"sft": str(donor)})
    assert set(load_run_models(execution, paths, {}).donors) == {"sft"}  # intact: loads
    middle = len(weights) // 2
    (donor / "model.safetensors").write_bytes(weights[:middle] + bytes(64) + weights[middle + 64 :])
    with pytest.raises(DamagedFileError) as info:
        load_run_models(execution, paths, {})
    assert str(info.value) == (
        f"donor folder {donor}: model.safetensors does not match checksums.json (damaged or "
        f"edited); delete {donor} and rerun to finetune it again"
    )


def test_donor_verification_missing_extra_and_unverified_folders(
    straight, tmp_path, caplog
) -> None:
    donor = tmp_path / "donor"
    shutil.copytree(straight, donor)
    (donor / "pytorch_model.bin").write_bytes(b"weights from elsewhere")
    with pytest.raises(DamagedFileError, match="pytorch_model.bin is not listed in checksums"):
        verify_donor(donor)
    (donor / "pytorch_model.bin").unlink()
    (donor / "tokenizer.json").unlink()
    with pytest.raises(DamagedFileError, match="tokenizer.json is missing"):
        verify_donor(donor)
    (donor / "checksums.json").write_text("{not json")
    with pytest.raises(DamagedFileError, match="checksums.json is not a readable checksum list"):
        verify_donor(donor)
    (donor / "checksums.json").unlink()  # a finetune of graft's without them: refused
    with pytest.raises(DamagedFileError, match="checksums.json is missing.*graft-exp accept"):
        verify_donor(donor)
    (donor / "finetune_config.json").unlink()  # a folder a user brought: refused as a donor
    with pytest.raises(FinetuneError, match="has no checksums.json.*graft-exp accept"):
        verify_donor(donor)
    with caplog.at_level(logging.INFO, logger="graft.study.training.donors"):
        verify_donor(donor, "base")  # a base model loads as it is
    assert f"{donor} has no checksums.json" in caplog.text and "unverified" in caplog.text
    assert check_status(donor) == "unverified"
    accept_donor(donor)  # the explicit choice: checksums and accepted.json written
    verify_donor(donor)
    assert check_status(donor).startswith("accepted as is 20")
    (donor / "tokenizer_config.json").write_text("{}")  # checked from then on
    with pytest.raises(DamagedFileError, match="does not match"):
        verify_donor(donor)
    with pytest.raises(FinetuneError, match="already"):
        accept_donor(donor)


def test_a_partial_folder_left_beside_a_finished_finetune_is_removed(straight, tmp_path) -> None:
    """A run killed between renaming its folder into place and removing <out>.partial left
    the partial folder (checkpoints and all) for good."""
    ws = Workspace(tmp_path / "ws")
    # the dataset ``straight`` was trained on (a donor of other texts would be refused)
    donor = ws.locate_donor(
        DonorRequest("tiny-llama", "fake_movies_real_actors", "one", TINY, n_facts=20)
    )
    for finished in (tmp_path / "sft", donor.path):
        shutil.copytree(straight, finished)
        (ft.partial_dir(finished) / "checkpoints/checkpoint-6").mkdir(parents=True)
    assert ft.finetune("tiny-llama", "unused", tmp_path / "sft", TINY) == tmp_path / "sft"
    assert ws.finetune_donor(donor) == donor.path
    assert not ft.partial_dir(tmp_path / "sft").exists()
    assert not ft.partial_dir(donor.path).exists()


@pytest.mark.parametrize(
    ("params", "batch", "tokens", "measured_s"),
    [
        (134_515_008, 16, 32.8, 4.85),  # SmolLM2-135M, cpu preset, graft's texts
        (134_515_008, 16, 44.9, 7.3),  # SmolLM2-135M, cpu preset, the paper protocol's texts
        (134_515_008, 4, 32.0, 1.4),  # SmolLM2-135M, gentle preset (half generic); a progress bar
        (268_098_176, 16, 42.4, 16.5),  # Gemma3-270M, cpu preset, the paper protocol's texts
    ],
)
def test_the_duration_estimate_is_within_a_third_of_measured_steps(
    params, batch, tokens, measured_s
):
    """Seconds a step of the donors finetuned on the project's 2-core AMD EPYC (2 threads,
    their train_log.json): counting parameters alone put Gemma3's at 0.39 of what it took."""
    estimate = duration.estimate_seconds(params, batch, 100, "cpu", tokens) / 100
    assert measured_s / 1.35 <= estimate <= measured_s * 1.35


def test_the_duration_estimate_grows_with_the_texts_length():
    short = duration.estimate_seconds(10**8, 16, 10, "cpu", duration.tokens_per_text(["a" * 40]))
    long = duration.estimate_seconds(10**8, 16, 10, "cpu", duration.tokens_per_text(["a" * 400]))
    assert duration.tokens_per_text(["a" * 40, "a" * 120]) == 80 / duration.CHARS_PER_TOKEN
    assert duration.tokens_per_text([]) == 1.0
    assert 9 < (long - 0.5) / (short - 0.5) < 11  # 0.05 s a step of overhead, 10 steps
    assert duration.estimate_seconds(10**8, 16, 10, "cuda", 100) < long


@pytest.mark.slow
def test_max_steps_is_a_cap_and_a_long_estimate_is_said_first(
    dataset, tmp_path, caplog, monkeypatch
) -> None:
    # TINY trains 2 epochs of 6 steps; a cap of 100 must not stretch that to 100 steps
    monkeypatch.setattr(duration, "LONG_FINETUNE_S", 0.0)  # every estimate is "long" here
    capped = dataclasses.replace(TINY, max_steps=100)
    with caplog.at_level(logging.WARNING, logger="graft.study.training.duration"):
        out = ft.finetune("tiny-llama", dataset, tmp_path / "sft", capped, quiet=True)
    assert json.loads((out / "train_log.json").read_text())["global_step"] == 12
    assert "this finetune is 12 steps" in caplog.text and "more than a day" in caplog.text
    assert ft.training_steps(capped, 6) == 12
    assert ft.training_steps(dataclasses.replace(TINY, max_steps=5), 6) == 5
    assert ft.duration_text(3 * 86_400) == "3.0 days"


@pytest.mark.slow
def test_a_bfloat16_finetune_with_checkpointing_trains_and_saves_bfloat16(dataset, tmp_path):
    """The paper-bf16 preset's settings: weights, gradients and AdamW state in bfloat16,
    activations recomputed; the finetune moves the weights and saves them in bfloat16."""
    import dataclasses

    from safetensors.torch import load_file

    cfg = dataclasses.replace(TINY, weights_dtype="bfloat16", gradient_checkpointing=True)
    out = ft.finetune("tiny-llama", dataset, tmp_path / "sft", cfg, device="cpu", quiet=True)
    weights = load_file(out / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    base = load_model("tiny-llama", device="cpu").model.state_dict()
    # trained: not merely the pretrained weights rounded to bfloat16
    assert not torch.equal(weights["lm_head.weight"], base["lm_head.weight"].bfloat16())
    info = json.loads((out / "finetune_config.json").read_text())
    assert info["config"]["weights_dtype"] == "bfloat16"
    assert info["config"]["gradient_checkpointing"] is True
