"""How long a finetune takes, roughly: its steps, an estimate in seconds and in words, and
the warning said before a finetune longer than a day."""

from __future__ import annotations

import logging
import math

from torch import nn

from graft.study.specs.presets import FinetuneConfig

logger = logging.getLogger(__name__)

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


def warn_if_long(model: nn.Module, batch_size: int, steps: int, device_type: str) -> None:
    """Say before training when the estimate of ``steps`` steps of ``model`` exceeds
    :data:`LONG_FINETUNE_S`."""
    n_params = sum(p.numel() for p in model.parameters())
    seconds = estimate_seconds(n_params, batch_size, steps, device_type)
    if seconds > LONG_FINETUNE_S:
        logger.warning(
            "this finetune is %d steps, roughly %s on %s (an estimate): more than a day; lower "
            "--finetune-max-steps or --epochs, or run it on a GPU",
            steps, duration_text(seconds), device_type,
        )  # fmt: skip
