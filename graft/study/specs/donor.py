"""Which dataset and which donor a run needs, typed once: the dataset a run reads or a
donor learns (:class:`DatasetRequest`), and the donor's model, data and settings
(:class:`DonorRequest`), from which the workspace locates them and the planner plans them
(one object for both)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from graft.study.specs.config import DatasetConfig
from graft.study.specs.presets import FinetuneConfig
from graft.study.specs.protocol import GRAFT, Protocol


@dataclass(frozen=True)
class DatasetRequest:
    """A dataset a run reads or a donor learns: a dataset folder as it is, or a data kind
    generated into the workspace.

    Args:
        dataset: a data kind or a dataset folder.
        direction: ``one`` or ``both`` (None: ``one`` for a kind, any for a folder).
        split: a generated dataset split into fact sets A and B.
        n_facts: facts per set of a generated dataset (None: the kind's default).
        seed: the generated dataset's seed.
        protocol: the dataset's protocol (None: graft's for a kind, any for a folder).
        shuffle: how a generated ``real_movies_shuffled`` shuffles the real casts.
    """

    dataset: str | os.PathLike[str]
    direction: str | None = None
    split: bool = False
    n_facts: int | None = None
    seed: int = 0
    protocol: Protocol | None = None
    shuffle: str = "relations"

    @property
    def is_folder(self) -> bool:
        """Whether :attr:`dataset` is an existing folder (taken as it is)."""
        return Path(self.dataset).is_dir()

    def generated_config(self) -> DatasetConfig:
        """The :class:`~graft.study.specs.config.DatasetConfig` of the kind :attr:`dataset`
        (its defaults applied), not yet validated."""
        return DatasetConfig(
            str(self.dataset),
            self.n_facts,
            self.seed,
            self.direction or "one",
            self.split,
            protocol=self.protocol or GRAFT,
            shuffle=self.shuffle,
        )


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
