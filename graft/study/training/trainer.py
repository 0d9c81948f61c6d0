"""The Hugging Face ``Trainer`` of a finetune: its arguments (AdamW on a linear schedule, a
checkpoint per epoch, the best one kept, mixed precision and gradient checkpointing as the
config asks, reporting to the tracker a command chose: :mod:`graft.results.tracking`), built
on the training and validation texts, and the log it leaves."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

from graft.models import LoadedModel
from graft.results.run_log import file_only
from graft.results.tracking import finish_trainer_run, trainer_reporting
from graft.storage.files import check_commit
from graft.study.data.training_data import CausalCollator, TokenisedTexts
from graft.study.specs.presets import FinetuneConfig
from graft.study.training.duration import training_steps, warn_if_long

logger = logging.getLogger(__name__)

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
            cfg.name,
            model_type,
        )
        return "bf16"
    return "fp16"


def _trainer_max_steps(cfg: FinetuneConfig, steps_per_epoch: int) -> int:
    """The Trainer's ``max_steps``: ``cfg.max_steps`` is a cap, while the Trainer's would
    override the epochs (train longer than they ask); -1 when the epochs end first."""
    epochs_end = training_steps(dataclasses.replace(cfg, max_steps=-1), steps_per_epoch)
    return cfg.max_steps if 0 < cfg.max_steps < epochs_end else -1


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
    report_to: Sequence[str] = ("none",),
    run_name: str | None = None,
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
        report_to=list(report_to),
        run_name=run_name,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=quiet,
        log_level="error" if quiet else "passive",
    )


class LogToFile(transformers.TrainerCallback):
    """The Trainer's metrics (loss, learning rate, evaluation) one line each, into the run's
    log alone (:func:`~graft.results.run_log.file_only`): the console keeps its bar."""

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ARG002 (the callback's signature)
        if state.is_world_process_zero and logs:
            shown = {k: round(v, 6) if isinstance(v, float) else v for k, v in logs.items()}
            shown.pop("total_flos", None)
            file_only().info(
                "trainer step %d: %s", state.global_step, json.dumps(shown, default=str)
            )


class BarOnly(transformers.ProgressCallback):
    """The Trainer's progress bars without the metrics dicts it writes between them."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass


class FinishRun(transformers.TrainerCallback):
    """At the end of training: end the tracker's run the Trainer started (a W&B run would
    otherwise stay open until the process exits, and take the next run's logs)."""

    def on_train_end(self, args, state, control, **kwargs):  # noqa: ARG002 (the callback's signature)
        finish_trainer_run()


def _run_name(ckpt_dir: Path) -> str:
    """A finetune's name for the tracker: its output folder below ``finetuned/`` (the
    checkpoints lie in ``<out>.partial/checkpoints``)."""
    out = ckpt_dir.parent
    parts = [*out.parent.parts, out.name.removesuffix(".partial")]
    below = parts[parts.index("finetuned") + 1 :] if "finetuned" in parts else parts[-1:]
    return "finetune-" + "-".join(below)


class CommitCheck(transformers.TrainerCallback):
    """Before a step's checkpoint is written into the shared partial folder: stop when this
    process lost its lock (:func:`graft.storage.files.check_commit`)."""

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ARG002 (the callback's signature)
        check_commit()


def build_trainer(
    loaded: LoadedModel,
    cfg: FinetuneConfig,
    device: torch.device,
    texts: tuple[Sequence[str], Sequence[str]],
    ckpt_dir: Path,
    callbacks: Sequence[transformers.TrainerCallback],
    quiet: bool,
) -> transformers.Trainer:
    """The seeded Trainer of ``loaded`` on ``texts`` (training, validation), its checkpoints
    under ``ckpt_dir``; a finetune estimated longer than a day is said first."""
    transformers.set_seed(cfg.seed)
    train_texts, val_texts = texts
    tok = loaded.tokenizer
    positions = getattr(loaded.model.config, "n_positions", None)  # GPT-2's learned positions
    max_length = min(cfg.max_length, positions) if positions else cfg.max_length
    train_ds = TokenisedTexts(train_texts, tok, max_length)
    steps_per_epoch = max(1, -(-len(train_ds) // cfg.batch_size))
    tokens = sum(map(len, train_ds.items)) / max(1, len(train_ds))
    steps = training_steps(cfg, steps_per_epoch)
    warn_if_long(loaded.model, cfg.batch_size, steps, device.type, tokens)
    half = mixed_precision(cfg, device, loaded.model.config.model_type)
    with trainer_reporting(_run_name(ckpt_dir)) as (report_to, run_name):
        args = _training_arguments(
            cfg, device, ckpt_dir, steps_per_epoch, quiet, half, report_to, run_name
        )
        trainer = transformers.Trainer(
            model=loaded.model,
            args=args,
            train_dataset=train_ds,
            eval_dataset=TokenisedTexts(val_texts, tok, max_length),
            data_collator=CausalCollator(tok.pad_token_id),
            processing_class=tok,
            callbacks=[*callbacks, CommitCheck(), FinishRun()],
        )
    # without tqdm the Trainer prints every log dict, with it writes them between the bars:
    # the dicts go to the run's log instead
    trainer.remove_callback(transformers.PrinterCallback)
    if trainer.pop_callback(transformers.ProgressCallback) is not None:
        trainer.add_callback(BarOnly())
    trainer.add_callback(LogToFile())
    return trainer


def train_log(state: transformers.TrainerState, resume: str | None, wall: float) -> dict[str, Any]:
    """``train_log.json``: the best checkpoint and its validation loss, the steps, this
    session's wall time, the checkpoint resumed from and the Trainer's log history."""
    best = state.best_model_checkpoint
    return {
        "best_checkpoint": Path(best).name if best else None,
        "best_val_loss": state.best_metric,
        "global_step": state.global_step,
        "train_seconds_this_session": round(wall, 1),
        "resumed_from": Path(resume).name if resume else None,
        "log_history": state.log_history,
    }
