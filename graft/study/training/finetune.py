"""Finetuning a base model on a fact dataset (the paper's SFT donor), with resumable runs.

A dataset folder (from :func:`graft.study.data.datasets.generate_dataset`) holds ``train.jsonl``
(one JSON object per line with at least ``text`` and ``set``), ``test_prompts.jsonl`` and
``manifest.json``. :func:`finetune` trains with the HF ``Trainer`` (AdamW, linear schedule) on
a seeded 80/20 split *of the texts* (every fact has several renderings, so each fact is still
trained on), keeps the checkpoint with the best validation loss, and writes into the output
folder:

- the model (safetensors) and tokenizer;
- ``finetune_config.json``: resolved config, model and dataset provenance, seed, versions;
- ``data_manifest.json``: copy of the dataset's manifest;
- ``train_log.json``: Trainer log history, best checkpoint, wall time;
- ``eval.json``: top-k accuracy of the target per test template and direction, for the
  finetuned (``sft``) and the pretrained (``pre``) model (computed by
  :mod:`graft.study.training.evaluate`, written here so the finished folder is renamed into place whole);
- ``checksums.json``: the sha256 of every other file, written last
  (:func:`graft.study.training.donors.verify_donor` checks it before an experiment loads the donor).

Training happens in ``<out>.partial/`` (checkpoints live there, so an interrupted run
resumes, from its newest complete checkpoint); the finished folder is renamed into place at
the end and never redone. Every JSON file is written atomically, and a full or read-only disk
is one :class:`~graft.errors.StorageError` line. Where a finetune lives in a workspace is
:mod:`graft.study.training.workspace`'s business.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import SafetensorError

from graft.errors import DatasetError, FinetuneError
from graft.models import (
    LoadedModel,
    context_length,
    load_model,
    resolve_device,
    resolve_model_name,
)
from graft.results.provenance import machine_info, package_versions
from graft.storage.files import probe_writable, storage_errors, write_json_atomic
from graft.storage.locks import exclusive
from graft.study.data.generic_corpus import GenericCorpus, choose, settle
from graft.study.data.prompts import DropReport, TestExample, load_test_prompts
from graft.study.data.training_data import (
    CausalCollator,
    FactDataset,
    TokenisedTexts,
    load_fact_dataset,
    split_texts,
)
from graft.study.specs.presets import FinetuneConfig, resolve_config
from graft.study.training.donors import write_checksums
from graft.study.training.evaluate import donor_evaluation, evaluate_examples, format_eval

logger = logging.getLogger(__name__)


def _usable_test_prompts(
    dataset: Path, loaded: LoadedModel
) -> tuple[list[TestExample], DropReport]:
    """The dataset's test prompts (both directions) for ``loaded``; none usable is an error,
    found before any training."""
    try:
        examples, drops = load_test_prompts(
            dataset, loaded.tokenizer, directions=None, max_length=context_length(loaded.model)
        )
    except DatasetError as err:
        raise FinetuneError(str(err)) from None
    if not examples:
        raise FinetuneError(
            f"no test prompt of {dataset} is usable with {loaded.name} ({drops.summary()}); "
            "use another dataset or model"
        )
    return examples, drops


#: Packages whose versions a finetune records.
FINETUNE_PACKAGES = ("torch", "transformers", "nnsight", "graft", "tokenizers", "accelerate")


def is_finished(out: str | Path) -> bool:
    """Whether ``out`` holds a finished finetune (it is only ever renamed into place whole)."""
    return (Path(out) / "eval.json").is_file() and (Path(out) / "finetune_config.json").is_file()


def partial_dir(out: str | Path) -> Path:
    """Where an unfinished finetune of ``out`` keeps its checkpoints."""
    return Path(out).with_name(Path(out).name + ".partial")


def drop_leftover_partial(out: str | Path) -> None:
    """Remove ``<out>.partial`` beside a finished ``out``: left by a run killed after it renamed
    its folder into place, before it removed the partial one."""
    partial = partial_dir(out)
    if partial.exists() and is_finished(out):
        logger.info("removing %s, left by a finetune killed after it finished", partial)
        shutil.rmtree(partial, ignore_errors=True)


def _read_json(path: Path) -> Any:
    """The JSON in ``path``, or ``None`` if it is missing or unreadable (a file cut short by
    a killed run of an older graft, which wrote it in place, or garbage)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _storage_errors(what: str, path: Path) -> Iterator[None]:
    """:func:`~graft.storage.files.storage_errors`, also for the writers of a checkpoint that
    raise no ``OSError`` on a full disk: safetensors (a ``SafetensorError`` naming the errno)
    and ``torch.save`` (a ``RuntimeError`` of its zip writer that names no errno)."""
    with storage_errors(what, path, wrapped=(SafetensorError,)):
        try:
            yield
        except RuntimeError as err:
            if not any(sign in str(err) for sign in ("PytorchStreamWriter", "unexpected pos")):
                raise
            raise OSError(
                errno.ENOSPC, "torch.save could not write (disk full?)", str(path)
            ) from err


@contextlib.contextmanager
def _transformers_quiet(quiet: bool) -> Iterator[None]:
    """Inside: no transformers progress bars (checkpoint writing) and errors-only logging."""
    hf_logging = transformers.utils.logging
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    if quiet:
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def finetune(
    model: str,
    dataset: str | Path,
    out: str | Path,
    config: FinetuneConfig | str | None = None,
    *,
    train_set: str | None = None,
    device: str | None = None,
    callbacks: Sequence[transformers.TrainerCallback] = (),
    quiet: bool = False,
    lock_dir: str | Path | None = None,
    corpus_dir: str | Path | None = None,
) -> Path:
    """Finetune ``model`` on the dataset folder ``dataset`` into ``out``; return ``out``.

    A finished ``out`` is returned as is. An interrupted run resumes from the last checkpoint
    in ``<out>.partial``; that folder is refused if it was started with other settings.

    Args:
        model: registry name, hub id or local model folder (see :func:`graft.models.load_model`).
        dataset: dataset folder (``train.jsonl``, ``test_prompts.jsonl``, ``manifest.json``).
        out: output folder for the finished model.
        config: a :class:`FinetuneConfig` or a preset name; ``None``: :func:`default_preset`.
        train_set: ``"A"``/``"B"`` to train on one set of a split dataset.
        device: ``"cpu"``/``"cuda"``; default CUDA when available.
        callbacks: extra ``TrainerCallback`` objects (tests use one to interrupt a run).
        quiet: no progress bars.
        lock_dir: a workspace's lock folder: one process trains ``out`` while others that ask
            for it wait, then find it finished (:func:`graft.storage.locks.exclusive`).
        corpus_dir: a workspace's ``corpora`` folder, where the paper's generic corpus is
            kept once downloaded (:mod:`graft.study.data.generic_corpus`); ``None``: not kept.

    Raises:
        FinetuneError: bad dataset, config or output folder, or no usable test prompt
            (nothing is written).
        graft.models.ModelNotFoundError: unknown model.
        graft.models.DeviceError: unknown device, or one this machine does not have.
    """
    out = Path(out)
    cfg = resolve_config(config, device=device)  # checks a given FinetuneConfig's ranges too
    if is_finished(out):
        logger.info("finetune already done: %s", out)
        drop_leftover_partial(out)
        return out
    with _transformers_quiet(quiet):
        run = _prepare(model, dataset, out, cfg, train_set, device, corpus_dir)
        # one process trains ``out`` (job arrays on one workspace): the others wait, then
        # find it finished; a checkpoint in the partial folder is then a dead job's
        with exclusive(out, f"finetuning {out}", lock_dir):
            # checked again under the lock: another process may have finished it meanwhile
            # (while this one loaded the model), whether this one had to wait or not
            if is_finished(out):
                logger.info("finetune done by another process: %s", out)
                drop_leftover_partial(out)
                return out
            evaluation = _train(run, callbacks, quiet)
    if not quiet:
        logger.info("%s", format_eval(evaluation))
    logger.info("finetuned model saved to %s", out)
    return out


def _train(
    run: _Run, callbacks: Sequence[transformers.TrainerCallback], quiet: bool
) -> dict[str, Any]:
    """Train ``run`` (resuming its partial folder), evaluate and save it; its evaluation."""
    partial = partial_dir(run.out)
    with _storage_errors("the finetune's files", partial):
        _start_partial(run, partial)
        trainer, texts = _trainer(run, partial, callbacks, quiet)
        pre = _pre_evaluation(run, partial, quiet)
        resume = _resume_checkpoint(partial)
        started = time.perf_counter()
        trainer.train(resume_from_checkpoint=resume)
    log = _train_log(trainer.state, resume, time.perf_counter() - started)
    assert isinstance(trainer.model, transformers.PreTrainedModel)  # the one _trainer gave it
    sft = evaluate_examples(
        trainer.model, run.examples, pad_id=run.pad_id, desc="eval SFT", progress=not quiet
    )
    evaluation = donor_evaluation(sft, pre, run.drops.summary(), run.drops.dropped)
    with _storage_errors("the finetuned model", partial):
        _save(run, trainer, partial, {**run.info, **texts}, log, evaluation)
    return evaluation


@dataclass
class _Run:
    """A finetune's inputs, checked before anything is written.

    Args:
        out: the finished folder.
        cfg: the resolved config.
        device: the training device.
        data: the training texts and manifest.
        loaded: the model to train (float32 master weights, or bfloat16 ones as
            ``cfg.weights_dtype`` says) and its tokenizer.
        examples: the usable test prompts (both directions).
        drops: what the tokenizer could not use.
        info: model, dataset, set and config: what a resumed run must match.
        generic: the generic corpus mixed in (``None``: none).
    """

    out: Path
    cfg: FinetuneConfig
    device: torch.device
    data: FactDataset
    loaded: LoadedModel
    examples: list[TestExample]
    drops: DropReport
    info: dict[str, Any]
    generic: GenericCorpus | None = None

    @property
    def pad_id(self) -> int:
        return self.loaded.tokenizer.pad_token_id


def _prepare(
    model: str,
    dataset: str | Path,
    out: Path,
    cfg: FinetuneConfig,
    train_set: str | None,
    device: str | None,
    corpus_dir: str | Path | None = None,
) -> _Run:
    if out.exists():
        raise FinetuneError(f"output folder {out} exists but is not a finished finetune; remove it")
    resolve_model_name(model)
    dev = resolve_device(device)
    data = load_fact_dataset(dataset, train_set)
    # the corpus is fixed (a bad one fails) before the model loads
    where = Path(corpus_dir) if corpus_dir is not None else None
    cfg = settle(cfg, data.path, where)
    generic = choose(cfg, data.path, where) if cfg.generic_ratio > 0 else None
    check_writable_parent(out)
    # Float32 master weights (fp16, when asked for on CUDA, is autocast by the Trainer), or
    # bfloat16 throughout (cfg.weights_dtype)
    loaded = load_model(model, dtype=getattr(torch, cfg.weights_dtype), device=dev)
    examples, drops = _usable_test_prompts(data.path, loaded)
    info = {
        "model": loaded.describe(),
        "dataset": str(data.path.resolve()),
        "train_set": data.train_set,
        "config": cfg.to_dict(),
    }
    return _Run(out, cfg, dev, data, loaded, examples, drops, info, generic)


def check_writable_parent(out: Path) -> None:
    """Refuse ``out`` unless its parent folder can be created and written (checked before the
    model loads); on refusal nothing is left behind.

    Raises:
        FinetuneError: the parent is below a file, on a read-only or full disk, or not writable.
    """
    parent = out.absolute().parent
    try:
        # the parent folders stay: other jobs of an array may be writing beside them
        probe_writable(parent)
    except OSError as err:
        where = err.filename or parent
        raise FinetuneError(
            f"cannot write the output folder {out} ({err.strerror or err}: {where}); choose "
            "a writable place"
        ) from None


def _start_partial(run: _Run, partial: Path) -> None:
    """Create ``partial``, or refuse it if it holds another finetune. An unreadable
    ``run.json`` is rewritten, and the checkpoints beside it (of unknown settings) removed."""
    run_path = partial / "run.json"
    if run_path.is_file():
        stored = _read_json(run_path)
        if stored is None:
            logger.warning(
                "%s is unreadable (cut short or garbage); rewriting it and training from the "
                "start, since its checkpoints' settings are unknown",
                run_path,
            )
            shutil.rmtree(partial / "checkpoints", ignore_errors=True)
        elif stored != run.info:
            raise FinetuneError(
                f"{partial} holds an unfinished finetune with other settings; remove it or "
                "rerun with the same model, dataset and config"
            )
    partial.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_path, run.info)


def _texts(run: _Run) -> tuple[list[str], list[str], dict[str, Any]]:
    """Training and validation texts (generic passages mixed into training), and their counts."""
    cfg = run.cfg
    train, val = split_texts([r["text"] for r in run.data.train], cfg.val_fraction, cfg.seed)
    generic = run.generic.texts if run.generic is not None else []
    n_generic = round(cfg.generic_ratio * len(train)) if generic else 0
    if n_generic:
        picked = [generic[i % len(generic)] for i in range(n_generic)]
        random.Random(cfg.seed + 1).shuffle(picked)
        train = train + picked
    counts = {"n_train_texts": len(train), "n_val_texts": len(val), "n_generic_texts": n_generic}
    if not n_generic or run.generic is None:
        return train, val, counts
    return train, val, counts | {"generic_corpus": run.generic.record()}


def _pre_evaluation(run: _Run, partial: Path, quiet: bool) -> dict[str, Any]:
    """The pretrained model's evaluation (kept in the partial folder across resumes)."""
    path = partial / "eval_pre.json"
    if path.is_file():
        stored = _read_json(path)
        if isinstance(stored, dict):
            return stored
        logger.warning("%s is unreadable (cut short or garbage); computing it again", path)
    pre = evaluate_examples(
        run.loaded.model, run.examples, pad_id=run.pad_id, desc="eval PRE", progress=not quiet
    )
    write_json_atomic(path, pre)
    return pre


#: Model types whose activations overflow float16 (Gemma's scaled embeddings and wide
#: GeGLU): trained in bfloat16 where a preset asks for fp16.
FP16_UNSAFE = ("gemma", "gemma2", "gemma3", "gemma3_text")


def mixed_precision(cfg: FinetuneConfig, device: torch.device, model_type: str) -> str | None:
    """``"fp16"``, ``"bf16"`` or ``None`` (no autocast): the preset's fp16 on CUDA, bfloat16
    instead for the model types of :data:`FP16_UNSAFE` (said in a warning); none on CPU or
    for bfloat16 weights (``cfg.weights_dtype``)."""
    if not (cfg.fp16_on_cuda and device.type == "cuda") or cfg.weights_dtype != "float32":
        return None
    if model_type in FP16_UNSAFE:
        logger.warning(
            "the %s preset trains in fp16, which overflows in %s models; training in bf16",
            cfg.name, model_type,
        )  # fmt: skip
        return "bf16"
    return "fp16"


#: Rough finetune speed for the announcements before a finetune (measured: smollm2-135m,
#: batch 16, 3.3 s/step on a 2-core CPU; tiny models ~0.08 s/step). CUDA is assumed ~30x faster.
_STEP_OVERHEAD_S = 0.05
_STEP_S_PER_PARAM_TEXT = 1.5e-9
_CUDA_SPEEDUP = 30.0
#: An estimate above this many seconds is announced as a warning before training starts.
LONG_FINETUNE_S = 86_400.0


def training_steps(cfg: FinetuneConfig, steps_per_epoch: int) -> int:
    """Optimisation steps of a finetune: ``cfg.epochs`` over ``steps_per_epoch`` steps,
    capped by ``cfg.max_steps`` (-1: no cap)."""
    steps = math.ceil(cfg.epochs * max(1, steps_per_epoch))
    return min(steps, cfg.max_steps) if cfg.max_steps >= 0 else steps


def estimate_seconds(n_params: int, batch_size: int, steps: int, device_type: str) -> float:
    """A rough duration of ``steps`` training steps of a model of ``n_params`` parameters."""
    per_step = _STEP_S_PER_PARAM_TEXT * n_params * batch_size
    return steps * (_STEP_OVERHEAD_S + per_step / (_CUDA_SPEEDUP if device_type == "cuda" else 1.0))


def duration_text(seconds: float) -> str:
    """``seconds`` in words: s, min, h or days."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    if seconds < 2 * 86_400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} days"


def _trainer_max_steps(cfg: FinetuneConfig, steps_per_epoch: int) -> int:
    """The Trainer's ``max_steps``: ``cfg.max_steps`` is a cap, while the Trainer's would
    override the epochs (train longer than they ask); -1 when the epochs end first."""
    epochs_end = training_steps(dataclasses.replace(cfg, max_steps=-1), steps_per_epoch)
    return cfg.max_steps if 0 < cfg.max_steps < epochs_end else -1


def _warn_if_long(run: _Run, steps: int) -> None:
    """Say before training when the estimate exceeds :data:`LONG_FINETUNE_S`."""
    n_params = sum(p.numel() for p in run.loaded.model.parameters())
    seconds = estimate_seconds(n_params, run.cfg.batch_size, steps, run.device.type)
    if seconds > LONG_FINETUNE_S:
        logger.warning(
            "this finetune is %d steps, roughly %s on %s (an estimate): more than a day; lower "
            "--finetune-max-steps or --epochs, or run it on a GPU",
            steps, duration_text(seconds), run.device.type,
        )  # fmt: skip


def _checkpointing(on: bool) -> dict[str, Any]:
    """The ``TrainingArguments`` keyword of gradient checkpointing when ``on`` (transformers
    5.24 renamed ``gradient_checkpointing`` to ``activation_checkpointing``)."""
    if not on:
        return {}
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    new = "activation_checkpointing"
    return {new if new in fields else "gradient_checkpointing": True}


def _training_arguments(
    cfg: FinetuneConfig,
    dev: torch.device,
    ckpt_dir: Path,
    steps_per_epoch: int,
    quiet: bool,
    half: str | None = None,
) -> transformers.TrainingArguments:
    return transformers.TrainingArguments(
        output_dir=str(ckpt_dir),
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size,
        num_train_epochs=cfg.epochs,
        max_steps=_trainer_max_steps(cfg, steps_per_epoch),
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        warmup_steps=cfg.warmup_steps,
        lr_scheduler_type="linear",
        optim="adamw_torch_fused",  # fused on CPU too: the step costs ~0.1 s, not ~0.6 s
        eval_strategy="epoch",
        save_strategy="epoch",
        save_total_limit=1,  # plus the best one, which the Trainer always keeps
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        greater_is_better=False,
        logging_strategy="steps",
        logging_steps=max(1, steps_per_epoch // 4),
        seed=cfg.seed,
        data_seed=cfg.seed,
        fp16=half == "fp16",
        bf16=half == "bf16",
        **_checkpointing(cfg.gradient_checkpointing),
        use_cpu=dev.type == "cpu",
        report_to="none",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=quiet,
        log_level="error" if quiet else "passive",
    )


def _trainer(
    run: _Run, partial: Path, callbacks: Sequence[transformers.TrainerCallback], quiet: bool
) -> tuple[transformers.Trainer, dict[str, Any]]:
    """The seeded Trainer of ``run`` (checkpoints under ``partial``) and its text counts."""
    transformers.set_seed(run.cfg.seed)
    train_texts, val_texts, counts = _texts(run)
    tok = run.loaded.tokenizer
    positions = getattr(run.loaded.model.config, "n_positions", None)  # GPT-2's learned positions
    max_length = min(run.cfg.max_length, positions) if positions else run.cfg.max_length
    train_ds = TokenisedTexts(train_texts, tok, max_length)
    steps_per_epoch = max(1, -(-len(train_ds) // run.cfg.batch_size))
    _warn_if_long(run, training_steps(run.cfg, steps_per_epoch))
    half = mixed_precision(run.cfg, run.device, run.loaded.model.config.model_type)
    args = _training_arguments(
        run.cfg, run.device, partial / "checkpoints", steps_per_epoch, quiet, half
    )
    trainer = transformers.Trainer(
        model=run.loaded.model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=TokenisedTexts(val_texts, tok, max_length),
        data_collator=CausalCollator(tok.pad_token_id),
        processing_class=tok,
        callbacks=list(callbacks),
    )
    if quiet:  # without tqdm the Trainer prints every log dict instead
        trainer.remove_callback(transformers.PrinterCallback)
    return trainer, counts


#: Weight files of a checkpoint (one of them), and the other files the Trainer needs to resume
#: the same run: without them it warns and goes on with a fresh optimiser or random state.
CHECKPOINT_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
CHECKPOINT_STATE = ("optimizer.pt", "scheduler.pt", "rng_state.pth")


def checkpoint_complete(checkpoint: Path) -> bool:
    """Whether a Trainer checkpoint holds everything a resume needs. The Trainer (transformers
    5) writes the weights, then optimizer, scheduler (and scaler) and RNG state, and
    ``trainer_state.json`` last, so a run killed while saving leaves a folder without a whole
    ``trainer_state.json``."""
    if not isinstance(_read_json(checkpoint / "trainer_state.json"), dict):
        return False
    weights = any((checkpoint / name).is_file() for name in CHECKPOINT_WEIGHTS)
    return weights and all((checkpoint / name).is_file() for name in CHECKPOINT_STATE)


def _checkpoints(ckpt_dir: Path) -> list[Path]:
    """The ``checkpoint-<step>`` folders of ``ckpt_dir``, newest (highest step) first."""
    if not ckpt_dir.is_dir():
        return []
    found = [p for p in ckpt_dir.glob("checkpoint-*") if p.is_dir() and p.name[11:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[11:]), reverse=True)


def _resume_checkpoint(partial: Path) -> str | None:
    """The newest complete checkpoint in ``partial``; newer incomplete ones (a run killed
    while saving, or a full disk) are removed, with a warning."""
    skipped: list[Path] = []
    for checkpoint in _checkpoints(partial / "checkpoints"):
        if checkpoint_complete(checkpoint):
            if skipped:
                logger.warning(
                    "skipping the incomplete checkpoint(s) %s (cut short while saving); "
                    "resuming from %s",
                    ", ".join(p.name for p in skipped),
                    checkpoint.name,
                )
            logger.info("resuming finetune from %s", checkpoint)
            return str(checkpoint)
        skipped.append(checkpoint)
        shutil.rmtree(checkpoint)
    if skipped:
        logger.warning(
            "skipping the incomplete checkpoint(s) %s (cut short while saving); no complete "
            "checkpoint is left, training from the start",
            ", ".join(p.name for p in skipped),
        )
    return None


def _train_log(state: transformers.TrainerState, resume: str | None, wall: float) -> dict[str, Any]:
    best = state.best_model_checkpoint
    return {
        "best_checkpoint": Path(best).name if best else None,
        "best_val_loss": state.best_metric,
        "global_step": state.global_step,
        "train_seconds_this_session": round(wall, 1),
        "resumed_from": Path(resume).name if resume else None,
        "log_history": state.log_history,
    }


def _save(
    run: _Run,
    trainer: transformers.Trainer,
    partial: Path,
    info: dict[str, Any],
    log: dict[str, Any],
    evaluation: dict[str, Any],
) -> None:
    """Write the finished folder in ``partial`` and rename it into place. Its
    ``finetune_config.json`` records what produced the weights: config, seed, device, the
    machine (CPU model, GPU name on CUDA, torch threads) and package versions; the same
    finetune on another machine need not give the same bits."""
    result = partial / "result"
    if result.exists():
        shutil.rmtree(result)
    trainer.save_model(str(result))
    run.loaded.tokenizer.save_pretrained(str(result))
    config = {
        **info,
        "seed": run.cfg.seed,
        "device": run.device.type,
        "machine": machine_info(run.device),
        "versions": package_versions(FINETUNE_PACKAGES),
    }
    write_json_atomic(result / "finetune_config.json", config)
    write_json_atomic(result / "data_manifest.json", run.data.manifest)
    write_json_atomic(result / "train_log.json", log)
    write_json_atomic(result / "eval.json", evaluation)
    write_checksums(result)
    os.rename(result, run.out)
    shutil.rmtree(partial, ignore_errors=True)
