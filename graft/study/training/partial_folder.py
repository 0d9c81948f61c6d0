"""An unfinished finetune's folder, ``<out>.partial``: where it is, the settings it was
started with (``run.json``), its Trainer checkpoints and the newest complete one to resume
from; and whether ``out`` holds a finished finetune."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from graft.errors import FinetuneError
from graft.storage.files import write_json_atomic

logger = logging.getLogger(__name__)

#: Weight files of a checkpoint (one of them), and the other files the Trainer needs to resume
#: the same run: without them it warns and goes on with a fresh optimiser or random state.
CHECKPOINT_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
CHECKPOINT_STATE = ("optimizer.pt", "scheduler.pt", "rng_state.pth")


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


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or ``None`` if it is missing or unreadable (a file cut short by
    a killed run of an older graft, which wrote it in place, or garbage)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def start_partial(partial: Path, info: dict[str, Any]) -> None:
    """Create ``partial``, or refuse it if it holds another finetune (other ``info``). An
    unreadable ``run.json`` is rewritten, and the checkpoints beside it (of unknown settings)
    removed."""
    run_path = partial / "run.json"
    if run_path.is_file():
        stored = read_json(run_path)
        if stored is None:
            logger.warning(
                "%s is unreadable (cut short or garbage); rewriting it and training from the "
                "start, since its checkpoints' settings are unknown",
                run_path,
            )
            shutil.rmtree(partial / "checkpoints", ignore_errors=True)
        elif stored != info:
            raise FinetuneError(
                f"{partial} holds an unfinished finetune with other settings; remove it or "
                "rerun with the same model, dataset and config"
            )
    partial.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_path, info)


def checkpoint_complete(checkpoint: Path) -> bool:
    """Whether a Trainer checkpoint holds everything a resume needs. The Trainer (transformers
    5) writes the weights, then optimizer, scheduler (and scaler) and RNG state, and
    ``trainer_state.json`` last, so a run killed while saving leaves a folder without a whole
    ``trainer_state.json``."""
    if not isinstance(read_json(checkpoint / "trainer_state.json"), dict):
        return False
    weights = any((checkpoint / name).is_file() for name in CHECKPOINT_WEIGHTS)
    return weights and all((checkpoint / name).is_file() for name in CHECKPOINT_STATE)


def _checkpoints(ckpt_dir: Path) -> list[Path]:
    """The ``checkpoint-<step>`` folders of ``ckpt_dir``, newest (highest step) first."""
    if not ckpt_dir.is_dir():
        return []
    found = [p for p in ckpt_dir.glob("checkpoint-*") if p.is_dir() and p.name[11:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[11:]), reverse=True)


def resume_checkpoint(partial: Path) -> str | None:
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
