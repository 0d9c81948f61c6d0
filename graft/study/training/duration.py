"""How long a finetune takes, roughly: its steps, an estimate in seconds and in words, and
the warning said before a finetune longer than a day."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from torch import nn

from graft.study.specs.presets import FinetuneConfig

logger = logging.getLogger(__name__)

#: Rough finetune speed: seconds per step per parameter and per training token of the step
#: (batch x mean tokens of a text), on the CPU. Measured on a 2-core AMD EPYC, 2 threads
#: (each donor's ``train_log.json``): SmolLM2-135M, batch 16, 4.8 s/step on graft's texts
#: (33 tokens on average) and 7.3 s/step on the paper protocol's (45); batch 4, the gentle
#: preset, 1.4 s/step (32); Gemma3-270M, batch 16, 16.5 s/step (42): 6.8e-11 to 9.1e-11.
#: Counting parameters alone put Gemma3's paper-protocol donor at 16 min; it took 41.
#: CUDA is assumed ~30x faster; tiny models take about the fixed overhead per step.
_STEP_OVERHEAD_S = 0.05
_STEP_S_PER_PARAM_TOKEN = 8e-11
_CUDA_SPEEDUP = 30.0
#: Characters per token of English training text (SmolLM2's and Gemma3's tokenizers: 3.8 to
#: 4.2 on graft's fact texts, 5.0 on its generic passages), for a text's length in tokens
#: when only its characters are at hand.
CHARS_PER_TOKEN = 4.0
#: An estimate above this many seconds is announced as a warning before training starts.
LONG_FINETUNE_S = 86_400.0


def training_steps(cfg: FinetuneConfig, steps_per_epoch: int) -> int:
    """Optimisation steps of a finetune: ``cfg.epochs`` over ``steps_per_epoch`` steps,
    capped by ``cfg.max_steps`` (-1: no cap)."""
    steps = math.ceil(cfg.epochs * max(1, steps_per_epoch))
    return min(steps, cfg.max_steps) if cfg.max_steps >= 0 else steps


def estimate_seconds(
    n_params: int, batch_size: int, steps: int, device_type: str, tokens_per_text: float
) -> float:
    """A rough duration of ``steps`` training steps of a model of ``n_params`` parameters on
    batches of ``batch_size`` texts of ``tokens_per_text`` tokens on average."""
    per_step = _STEP_S_PER_PARAM_TOKEN * n_params * batch_size * max(tokens_per_text, 1.0)
    return steps * (_STEP_OVERHEAD_S + per_step / (_CUDA_SPEEDUP if device_type == "cuda" else 1.0))


def tokens_per_text(texts: Sequence[str]) -> float:
    """The mean length of ``texts`` in tokens, from their characters (:data:`CHARS_PER_TOKEN`;
    1 for no texts)."""
    if not texts:
        return 1.0
    return max(1.0, sum(len(t) for t in texts) / len(texts) / CHARS_PER_TOKEN)


def duration_text(seconds: float) -> str:
    """``seconds`` in words: s, min, h or days."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    if seconds < 2 * 86_400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} days"


def warn_if_long(
    model: nn.Module, batch_size: int, steps: int, device_type: str, tokens: float
) -> None:
    """Say before training when the estimate of ``steps`` steps of ``model`` on texts of
    ``tokens`` tokens on average exceeds :data:`LONG_FINETUNE_S`."""
    n_params = sum(p.numel() for p in model.parameters())
    seconds = estimate_seconds(n_params, batch_size, steps, device_type, tokens)
    if seconds > LONG_FINETUNE_S:
        logger.warning(
            "this finetune is %d steps, roughly %s on %s (an estimate): more than a day; lower "
            "--finetune-max-steps or --epochs, or run it on a GPU",
            steps,
            duration_text(seconds),
            device_type,
        )
