"""How much memory a finetune or a grafting run needs, from a transformers config alone.

Nothing here loads weights: a model's parameters, widths and the activations a finetune
keeps for its backward pass are counted on the meta device
(:mod:`graft.study.planning.model_size`), so every family transformers builds is sized the
same way.

A finetune step holds, at its peak (``P`` parameters, ``w`` bytes per weight: 4 in
float32 and in mixed precision, whose master weights are float32; 2 in bfloat16)::

    weights (P w) + AdamW state (2 P w) + max(gradients (P w) [+ 2 head w if tied],
        autocast copies + saved activations + loss head + the head's gradient)

the first term of the ``max`` being the end of the backward pass and the optimizer step
(a head tied to the embedding gets two gradients, summed out of place: three copies at
once), the second the start of the backward pass, when every activation is still held and
the loss head's two float32 [tokens, vocabulary] gradients exist. Mixed precision casts every matrix-product weight to
16 bits once per forward (2 bytes a parameter), and its activations are partly 16-bit; its
saved activations are taken as the mean of the float32 and the bfloat16 trace
(:data:`MIXED_ACTIVATION_SHARE`). Gradient checkpointing keeps each layer's input and
recomputes one layer at a time in the backward pass.

A grafting run holds the base and each donor whole, one forward pass's working set
(no gradients: the largest of a layer's attention and feed-forward intermediates on top of
the residual stream), the key/value cache of the prompts a step shares
(:func:`graft.core.planning.prefix.step_rows` rows), and each row's last-position logits.

These are the tensors' bytes, what CUDA's allocator counts (within 5% of the finetunes and
8% of the forward passes measured on an H200 at the paper's sizes); what a device needs
besides, and whether a plan fits, is :mod:`graft.study.planning.device_memory`'s business.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from graft.core.planning.prefix import step_rows
from graft.errors import GraftError
from graft.study.planning.model_size import (
    DTYPE_BYTES,
    ModelSize,
    model_size,
    precision_name,
    saved_activation_bytes,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig

#: Training precisions: the weights' dtype while training, ``mixed`` being float32 master
#: weights with 16-bit autocast (the Trainer's ``fp16``/``bf16``).
PRECISIONS = ("float32", "mixed", "bfloat16", "float16")
OPTIMIZERS = ("adamw",)
#: Host memory of a loaded fast tokenizer per vocabulary entry (Gemma 3's 262,144 entries:
#: 260 MiB; SmolLM2's 49,152: 13-70 MiB).
TOKENIZER_BYTES_PER_TOKEN = 1024
#: Where mixed precision's saved activations lie between the float32 trace (0) and the
#: bfloat16 one (1): matrix products keep 16-bit inputs, norms and the residual stream
#: stay float32.
MIXED_ACTIVATION_SHARE = 0.5


@dataclass(frozen=True)
class MemoryPlan:
    """The memory a finetune or a grafting run needs at its peak, and its parts (bytes).

    Args:
        kind: ``"finetune"`` or ``"grafting"``.
        dtype: the precision (:data:`PRECISIONS`; a grafting run's model dtype).
        batch_size: texts per optimisation step, or rows per forward pass.
        seq_len: tokens per text or row (the longest).
        n_params: parameters of one model.
        weights_bytes: the weights held (a grafting run: base and donors).
        gradients_bytes: the gradients (0 for grafting).
        optimizer_bytes: the optimizer state (AdamW: two moments a parameter).
        cast_bytes: mixed precision's 16-bit copies of the matrix-product weights.
        activations_bytes: a finetune's saved activations, or a grafting forward pass's
            working set and shared key/value cache.
        logits_bytes: the loss head's float32 [tokens, vocabulary] gradients, or a
            grafting batch's last-position logits and log-probabilities.
        peak_bytes: the peak, as the module docstring combines the parts.
        host_bytes: host memory the run holds besides tensors: a grafting run's tokenizers
            (base and donors, :data:`TOKENIZER_BYTES_PER_TOKEN` a vocabulary entry); not in
            the peak, which is the device's (on the CPU,
            :func:`graft.study.planning.device_memory.needed_bytes` adds it).
    """

    kind: str
    dtype: str
    batch_size: int
    seq_len: int
    n_params: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    cast_bytes: int
    activations_bytes: int
    logits_bytes: int
    peak_bytes: int
    host_bytes: int = 0

    def parts(self) -> dict[str, int]:
        """The non-zero parts, by name (weights, gradients, optimizer, ...)."""
        names = ("weights", "gradients", "optimizer", "cast", "activations", "logits")
        return {n: getattr(self, f"{n}_bytes") for n in names if getattr(self, f"{n}_bytes")}

    def scaled(self, extra_bytes: int) -> MemoryPlan:
        """The same plan with ``extra_bytes`` more held throughout (added to the peak)."""
        return dataclasses.replace(self, peak_bytes=self.peak_bytes + extra_bytes)


def _check_sizes(batch_size: int, seq_len: int) -> None:
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if not isinstance(value, int) or value < 1:
            raise GraftError(f"{name} must be a whole number of at least 1, got {value!r}")


def estimate_finetune_bytes(
    config: PretrainedConfig,
    *,
    dtype: str | torch.dtype,
    batch_size: int,
    seq_len: int,
    optimizer: str = "adamw",
    gradient_checkpointing: bool = False,
) -> MemoryPlan:
    """The peak memory of finetuning ``config``'s model with AdamW (module docstring).

    Args:
        config: the model's transformers config (nothing is loaded).
        dtype: ``"float32"``, ``"mixed"`` (float32 weights, 16-bit autocast),
            ``"bfloat16"`` or ``"float16"`` (weights, gradients and AdamW state in 16 bits).
        batch_size: texts per optimisation step.
        seq_len: tokens of the longest text (batches are padded to their longest).
        optimizer: ``"adamw"`` (torch's, state in the weights' dtype).
        gradient_checkpointing: keep only each layer's input, recompute the rest.

    Raises:
        GraftError: an unknown dtype or optimizer, or a size below 1.
    """
    precision = precision_name(dtype)
    if precision not in PRECISIONS:
        raise GraftError(f"cannot finetune in {precision}; choose one of {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZERS:
        raise GraftError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    _check_sizes(batch_size, seq_len)
    size = model_size(config)
    w = DTYPE_BYTES[precision]
    weights = size.n_params * w + size.buffer_bytes
    gradients = size.n_params * w
    state = 2 * size.n_params * w
    cast = 2 * size.matmul_params if precision == "mixed" else 0
    activations = _finetune_activations(
        config, size, precision, batch_size, seq_len, gradient_checkpointing
    )
    logits = 2 * 4 * batch_size * seq_len * size.vocab
    backward_start = cast + activations + logits + size.head_params * w
    # a tied head's gradient arrives twice and is summed out of place at the end
    backward_end = gradients + (2 * size.head_params * w if size.tied else 0)
    peak = weights + state + max(backward_end, backward_start)
    return MemoryPlan(
        "finetune",
        precision,
        batch_size,
        seq_len,
        size.n_params,
        weights,
        gradients,
        state,
        cast,
        activations,
        logits,
        peak,
    )


def _finetune_activations(
    config: PretrainedConfig,
    size: ModelSize,
    precision: str,
    batch: int,
    seq: int,
    checkpointing: bool,
) -> int:
    def traced(dtype: str, ckpt: bool) -> int:
        return saved_activation_bytes(
            config, dtype=dtype, batch_size=batch, seq_len=seq, gradient_checkpointing=ckpt
        )

    def one(dtype: str) -> int:
        full = traced(dtype, False)
        if not checkpointing:
            return full
        kept = traced(dtype, True)
        return kept + max(0, full - kept) // max(1, size.n_layers)  # one layer recomputed

    if precision != "mixed":
        return one(precision)
    wide, narrow = one("float32"), one("bfloat16")
    return round(wide + MIXED_ACTIVATION_SHARE * (narrow - wide))


def estimate_grafting_bytes(
    config: PretrainedConfig,
    *,
    dtype: str | torch.dtype,
    batch_size: int,
    seq_len: int,
    n_donors: int = 1,
) -> MemoryPlan:
    """The peak memory of grafting with ``config``'s model: the base and ``n_donors`` donors
    whole in ``dtype``, one forward pass of ``batch_size`` rows of ``seq_len`` tokens, the
    key/value cache of a step's shared prompts, and the rows' last-position logits.

    Raises:
        GraftError: an unknown dtype, a size below 1 or a negative donor count.
    """
    precision = precision_name(dtype)
    if precision == "mixed":
        raise GraftError(
            "grafting runs in one dtype, not mixed; choose float32, bfloat16 or float16"
        )
    _check_sizes(batch_size, seq_len)
    if not isinstance(n_donors, int) or n_donors < 0:
        raise GraftError(f"n_donors must be 0 or more, got {n_donors!r}")
    size = model_size(config)
    b = DTYPE_BYTES[precision]
    weights = (1 + n_donors) * (size.n_params * b + size.buffer_bytes)
    tokens = batch_size * seq_len
    stream = 3 * tokens * size.hidden
    attention = (
        tokens * (size.hidden + 2 * size.kv_width) + 2 * batch_size * size.heads * seq_len**2
    )
    feed_forward = (3 if size.gated else 2) * tokens * size.intermediate
    cache = step_rows(batch_size) * seq_len * size.n_layers * 2 * size.kv_width
    working = (stream + max(attention, feed_forward) + cache) * b
    logits = batch_size * size.vocab * (b + 2 * 4)  # logits, then float32 log-probabilities
    tokenizers = (1 + n_donors) * size.vocab * TOKENIZER_BYTES_PER_TOKEN
    return MemoryPlan(
        "grafting",
        precision,
        batch_size,
        seq_len,
        size.n_params,
        weights,
        0,
        0,
        0,
        working,
        logits,
        weights + working + logits,
        tokenizers,
    )


def gib(n_bytes: float) -> str:
    """``n_bytes`` as GiB (MiB below one GiB), e.g. ``"25.1 GiB"``."""
    if abs(n_bytes) < 2**30:
        return f"{n_bytes / 2**20:,.0f} MiB"
    return f"{n_bytes / 2**30:,.1f} GiB"


def count_text(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless one: ``1 donor``, ``2 donors``."""
    return f"{count} {noun}{'s' * (count != 1)}"


def describe(plan: MemoryPlan) -> str:
    """One line: each part and the peak, e.g. ``weights 5.8 GiB + ... -> peak 25.3 GiB``."""
    words = {"optimizer": "AdamW state", "cast": "16-bit weight copies"}
    parts = " + ".join(f"{words.get(n, n)} {gib(v)}" for n, v in plan.parts().items())
    return f"{parts} -> peak {gib(plan.peak_bytes)}"
