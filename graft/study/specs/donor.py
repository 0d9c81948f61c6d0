"""Which donor a run needs, typed once: the model, the data it learns and the settings, from
which the workspace locates it and the planner plans it (one object for both)."""

from __future__ import annotations

from dataclasses import dataclass

from graft.study.specs.presets import FinetuneConfig
from graft.study.specs.protocol import Protocol


@dataclass(frozen=True)
class DonorRequest:
    """A finetuned donor: what it is finetuned from, on and with.

    Args:
        model: the pretrained model (registry name, hub id or folder).
        dataset: a data kind (generated into the workspace) or a dataset folder.
        variant: the data variant (``one``, ``both``, ``task``, ``both-A``, ...).
        config: the finetune settings (a preset with its overrides and seed).
        split: generate the split dataset even for an unsplit variant.
        n_facts: facts per set of a generated dataset (None: the kind's default).
        data_seed: the generated dataset's seed.
        shuffle: how a generated ``real_movies_shuffled`` shuffles the real casts.
        device: the device it is trained on (None: CUDA if available, else the CPU).
        protocol: the dataset's protocol (None: graft's for a data kind, any for a folder).
    """

    model: str
    dataset: str
    variant: str
    config: FinetuneConfig
    split: bool = False
    n_facts: int | None = None
    data_seed: int = 0
    shuffle: str = "relations"
    device: str | None = None
    protocol: Protocol | None = None
