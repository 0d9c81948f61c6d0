"""Finetuning hyper-parameters: :class:`FinetuneConfig` and the named presets."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass
from typing import Any

from graft.errors import FinetuneError
from graft.ranges import SEED, Range, first_problem

#: Most optimisation steps of one finetune (``max_steps``, ``--finetune-max-steps``).
MAX_STEPS = 1_000_000
#: The range of a finetune's step count.
STEPS = Range(1, MAX_STEPS, integer=True)
#: The dtypes a finetune may hold its weights, gradients and optimizer state in.
WEIGHTS_DTYPES = ("float32", "bfloat16")
#: Fields added after finetunes were first stored, with their defaults (left out of
#: :meth:`FinetuneConfig.to_dict` at the default).
LATER_FIELDS: dict[str, Any] = {
    "weights_dtype": "float32",
    "gradient_checkpointing": False,
    "generic_corpus_id": None,
}
#: The ranges of :class:`FinetuneConfig`'s numeric fields (``max_steps`` may also be -1).
FINETUNE_RANGES: dict[str, Range] = {
    "learning_rate": Range(0, 1, low_open=True),
    "weight_decay": Range(0, 1),
    "batch_size": Range(1, sys.maxsize, integer=True),  # torch's batch sampler takes no more
    "epochs": Range(0, 1000, low_open=True),
    "warmup_steps": Range(0, MAX_STEPS, integer=True),
    "val_fraction": Range(0, 1, low_open=True, high_open=True),
    "generic_ratio": Range(0, 100),
    "max_length": Range(1, 1_000_000, integer=True),
    "max_steps": STEPS,
    "seed": SEED,
}


@dataclass(frozen=True)
class FinetuneConfig:
    """Hyper-parameters of one finetune. Presets: :data:`PRESETS`.

    Args:
        name: preset name this config came from (kept when fields are overridden).
        learning_rate: peak AdamW learning rate (linear decay to 0 after warmup).
        weight_decay: AdamW weight decay.
        batch_size: texts per optimisation step (per device).
        epochs: passes over the training texts.
        warmup_steps: linear warmup steps.
        val_fraction: fraction of the fact texts held out for validation (best checkpoint).
        fp16_on_cuda: mixed precision (fp16) when training on CUDA; CPU always trains in float32.
        generic_ratio: generic-text passages added to the training set per fact text (0 = none).
        generic_corpus: file of generic passages (one per line, or JSONL with ``text``),
            or ``"stand-in"`` for the shipped ``graft/resources/generic_text.txt``;
            ``None`` = the dataset's own ``corpus.jsonl`` when it has one, else the paper's
            openwebtext + IMDB sample from the hub, else the stand-in, with a warning
            (:mod:`graft.study.data.generic_corpus`).
        generic_corpus_id: what the generic corpus is (hub ids and sample seed, a file's
            sha256, the stand-in's), fixed by :func:`graft.study.data.generic_corpus.settle`
            before a donor is located; part of :meth:`key`. ``None``: not fixed yet.
        max_length: texts are truncated to this many tokens.
        max_steps: stop after this many optimisation steps (-1 = run all epochs).
        seed: seed of the split, the generic-text sample, data order and initialisation.
        weights_dtype: ``"float32"`` (master weights, gradients and AdamW state in float32:
            16 bytes a parameter) or ``"bfloat16"`` (all three in bfloat16: 8 bytes a
            parameter, no autocast; an AdamW update smaller than half a bfloat16 step of its
            weight, most of them at the paper's learning rate, is rounded away).
        gradient_checkpointing: keep only each layer's input for the backward pass and
            recompute the rest (less activation memory, about a third more compute).

    Every number must be finite and in its range (:data:`FINETUNE_RANGES`: learning rate
    in (0, 1], weight decay in [0, 1], epochs in (0, 1000], ``max_steps`` -1 or 1 to
    :data:`MAX_STEPS`, seed 0 to 2**32-1, ...); anything else raises a one-line
    :class:`~graft.errors.FinetuneError` naming the field.
    """

    name: str
    learning_rate: float
    weight_decay: float
    batch_size: int
    epochs: float
    warmup_steps: int = 0
    val_fraction: float = 0.2
    fp16_on_cuda: bool = False
    generic_ratio: float = 0.0
    generic_corpus: str | None = None
    max_length: int = 128
    max_steps: int = -1
    seed: int = 0
    weights_dtype: str = "float32"
    gradient_checkpointing: bool = False
    generic_corpus_id: str | None = None

    def __post_init__(self) -> None:
        if self.weights_dtype not in WEIGHTS_DTYPES:
            raise FinetuneError(
                f"weights_dtype {self.weights_dtype!r} unknown: use {' or '.join(WEIGHTS_DTYPES)}",
                param="weights_dtype",
            )
        if self.max_steps != -1 and isinstance(self.max_steps, int) and self.max_steps < 1:
            raise FinetuneError(
                f"max_steps must be at least 1 (or -1 to train all epochs), got {self.max_steps}",
                param="max_steps",
            )
        skip = ("max_steps",) if self.max_steps == -1 else ()
        found = first_problem(FINETUNE_RANGES, self, skip)
        if found:
            raise FinetuneError(found[1], param=found[0])

    def to_dict(self) -> dict[str, Any]:
        """The fields; those added after the first finetunes (:data:`LATER_FIELDS`) only
        when they differ from their default, so the folders (:meth:`key`) and records of
        finetunes made before them stay the same."""
        data = dataclasses.asdict(self)
        for name, default in LATER_FIELDS.items():
            if data[name] == default:
                del data[name]
        return data

    def key(self) -> str:
        """Folder name: the preset name, plus a short hash when fields differ from the preset."""
        base = PRESETS.get(self.name)
        if base == self:
            return self.name
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return f"{self.name}-{hashlib.sha256(blob).hexdigest()[:8]}"


#: The paper's settings (Appendix: lr 2e-5, weight decay 0.01, batch 4, 10 epochs, fp16):
#: float32 master weights and AdamW state with fp16 autocast, 16 bytes a parameter. The
#: paper's models need an 80 GB GPU for it (planned peaks at batch 4 x 128 tokens: gpt2-xl
#: 25 GiB, llama3.2-1b 20 GiB, gemma-1.1-2b 41 GiB, pythia-2.8b 41 GiB;
#: ``graft-exp finetune --model M --dry-run`` prints the plan for this machine).
PAPER = FinetuneConfig(
    name="paper", learning_rate=2e-5, weight_decay=0.01, batch_size=4, epochs=10, fp16_on_cuda=True
)
#: The paper's hyper-parameters for a 24 GB GPU: weights, gradients and AdamW state in
#: bfloat16 (8 bytes a parameter) and gradient checkpointing. Planned peaks at batch 4 x 128
#: tokens: gpt2-xl 12 GiB, llama3.2-1b 10 GiB, gemma-1.1-2b 21 GiB, pythia-2.8b 21 GiB
#: (tight on a 24 GB card). Not the paper's numerics: bfloat16 rounds away AdamW updates
#: smaller than half a step of their weight, most of them at lr 2e-5.
PAPER_BF16 = dataclasses.replace(
    PAPER,
    name="paper-bf16",
    fp16_on_cuda=False,
    weights_dtype="bfloat16",
    gradient_checkpointing=True,
)
#: The paper's "gentle" finetuning (C.4): lr 2e-6, no weight decay, generic text mixed in.
GENTLE = FinetuneConfig(
    name="gentle",
    learning_rate=2e-6,
    weight_decay=0.0,
    batch_size=4,
    epochs=10,
    fp16_on_cuda=True,
    generic_ratio=1.0,
)
#: For the embedded models on a small CPU: memorises the default dataset (50 facts, 480
#: training texts) in 3 epochs (90 steps, ~4 min for SmolLM2-135M on 2 cores). A higher rate
#: over fewer epochs than the paper's: 4e-4 x 3 epochs reached the same headline top-5 (0.92)
#: as 1.5e-4 x 10 epochs on seed 0, in 90 steps instead of 300.
CPU = FinetuneConfig(name="cpu", learning_rate=4e-4, weight_decay=0.0, batch_size=16, epochs=3)

PRESETS: dict[str, FinetuneConfig] = {c.name: c for c in (PAPER, PAPER_BF16, GENTLE, CPU)}
#: The preset a donor of a preset takes where that one does not fit in memory: the same
#: hyper-parameters with bfloat16 weights and gradient checkpointing.
LEAN_PRESETS: dict[str, FinetuneConfig] = {PAPER.name: PAPER_BF16}


def default_preset(device: str | None = None) -> str:
    """``paper`` when training runs on CUDA (``device``, default: CUDA if available), else ``cpu``."""
    from graft.models import device_type  # torch: only when a preset is chosen

    return "paper" if device_type(device) == "cuda" else "cpu"


def resolve_config(
    preset: str | FinetuneConfig | None = None, *, device: str | None = None, **overrides: Any
) -> FinetuneConfig:
    """A preset (by name; ``None``: :func:`default_preset` of ``device``) with the non-``None``
    ``overrides`` applied; the ranges are checked (by :class:`FinetuneConfig`)."""
    if preset is None:
        preset = default_preset(device)
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise FinetuneError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        preset = PRESETS[preset]
    changes = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(changes) - {f.name for f in dataclasses.fields(FinetuneConfig)}
    if unknown:
        raise FinetuneError(f"unknown finetune setting(s): {', '.join(sorted(unknown))}")
    return dataclasses.replace(preset, **changes)  # FinetuneConfig checks the ranges


# ----------------------------------------------------------------------------- data
