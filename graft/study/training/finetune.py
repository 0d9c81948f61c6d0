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
resumes, from its newest complete checkpoint: :mod:`graft.study.training.partial_folder`);
the finished folder is renamed into place at the end and never redone. The Trainer and its
arguments are :mod:`graft.study.training.trainer`'s, the duration estimate
:mod:`graft.study.training.duration`'s. Every JSON file is written atomically, and a full or read-only disk
is one :class:`~graft.errors.StorageError` line. Where a finetune lives in a workspace is
:mod:`graft.study.training.workspace`'s business.
"""

from __future__ import annotations

import contextlib
import errno
import logging
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

from graft.errors import DatasetError, FinetuneError, StorageError
from graft.models import (
    LoadedModel,
    context_length,
    load_model,
    resolve_device,
    resolve_model_name,
)
from graft.results.provenance import machine_info, package_versions
from graft.storage.failures import resumable, storage_errors
from graft.storage.files import check_commit, probe_writable, share_like_umask, write_json_atomic
from graft.storage.locks import exclusive
from graft.study.data.generic_corpus import GenericCorpus, choose, settle
from graft.study.data.prompts import DropReport, TestExample, load_test_prompts
from graft.study.data.training_data import FactDataset, load_fact_dataset, split_texts
from graft.study.specs.presets import FinetuneConfig, resolve_config
from graft.study.training.donors import write_checksums
from graft.study.training.duration import duration_text, estimate_seconds, training_steps
from graft.study.training.evaluate import donor_evaluation, evaluate_examples, format_eval
from graft.study.training.partial_folder import (
    drop_leftover_partial,
    is_finished,
    partial_dir,
    read_json,
    resume_checkpoint,
    start_partial,
)
from graft.study.training.trainer import build_trainer, mixed_precision, train_log

logger = logging.getLogger(__name__)

# the duration's names are imported from here by graft.study.planning.finetune_plan and
# graft.study.training.sources, mixed_precision and partial_dir by the tests
__all__ = [
    "FINETUNE_PACKAGES",
    "check_writable_parent",
    "drop_leftover_partial",
    "duration_text",
    "estimate_seconds",
    "finetune",
    "is_finished",
    "mixed_precision",
    "partial_dir",
    "training_steps",
]


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


@contextlib.contextmanager
def _storage_errors(what: str, path: Path) -> Iterator[None]:
    """:func:`~graft.storage.failures.storage_errors`, also for the writers of a checkpoint that
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
        graft.errors.StorageError: the output folder cannot be written (before the model
            loads), or a file of the finetune could not be (a full disk: the rerun resumes).
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
        with exclusive(out, f"finetuning {out}", lock_dir), resumable():
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
        start_partial(partial, run.info)
        train_texts, val_texts, texts = _texts(run)
        trainer = build_trainer(
            run.loaded,
            run.cfg,
            run.device,
            (train_texts, val_texts),
            partial / "checkpoints",
            callbacks,
            quiet,
        )
        pre = _pre_evaluation(run, partial, quiet)
        resume = resume_checkpoint(partial)
        started = time.perf_counter()
        trainer.train(resume_from_checkpoint=resume)
    log = train_log(trainer.state, resume, time.perf_counter() - started)
    assert isinstance(trainer.model, transformers.PreTrainedModel)  # the one build_trainer gave
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
        StorageError: the parent is below a file, on a read-only or full disk, or not writable.
    """
    parent = out.absolute().parent
    try:
        # the parent folders stay: other jobs of an array may be writing beside them
        probe_writable(parent)
    except OSError as err:
        where = err.filename or parent
        raise StorageError(
            f"cannot write the output folder {out} ({err.strerror or err}: {where}); choose "
            "a writable place"
        ) from None


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
        stored = read_json(path)
        if isinstance(stored, dict):
            return stored
        logger.warning("%s is unreadable (cut short or garbage); computing it again", path)
    pre = evaluate_examples(
        run.loaded.model, run.examples, pad_id=run.pad_id, desc="eval PRE", progress=not quiet
    )
    write_json_atomic(path, pre)
    return pre


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
    share_like_umask(result)  # safetensors writes its weights 0600: others could not read
    write_checksums(result)
    check_commit()  # a lease lost while paused: another process finetunes this donor now
    os.rename(result, run.out)
    shutil.rmtree(partial, ignore_errors=True)
