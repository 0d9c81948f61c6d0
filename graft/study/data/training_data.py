"""What a finetune trains on: a dataset folder's texts, the validation split, generic text,
and their tokenized form for the HF ``Trainer``."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from graft.errors import DatasetError, FinetuneError
from graft.study.data import generic_corpus
from graft.study.data.datasets import check_dataset_folder, load_manifest
from graft.study.data.files import read_jsonl
from graft.study.data.prompts import char_bound
from graft.study.specs.presets import FinetuneConfig


@dataclass
class FactDataset:
    """A dataset folder's training texts and manifest, checked.

    Args:
        path: the folder.
        train: rows of ``train.jsonl`` kept for training (each has ``text``).
        train_set: the fact set trained on: ``"all"`` (unsplit), ``"A"`` or ``"B"``.
        manifest: ``manifest.json`` (empty dict when the folder has none).
    """

    path: Path
    train: list[dict[str, Any]]
    train_set: str
    manifest: dict[str, Any]


def load_fact_dataset(path: str | Path, train_set: str | None = None) -> FactDataset:
    """Read and check a dataset folder; :class:`FinetuneError` names what is wrong
    (:class:`~graft.errors.DamagedFileError` a file the manifest's sha256 does not match).

    Args:
        path: folder with ``train.jsonl`` and ``test_prompts.jsonl``.
        train_set: ``"A"`` or ``"B"`` for a split dataset (task / relation model); must be
            ``None`` (or ``"all"``) for an unsplit one.
    """
    try:
        path = check_dataset_folder(path, ["train.jsonl", "test_prompts.jsonl"])
        rows = read_jsonl(path / "train.jsonl")
    except DatasetError as err:
        raise FinetuneError(str(err)) from None
    bad = [i for i, r in enumerate(rows, 1) if not isinstance(r.get("text"), str)]
    if bad:
        raise FinetuneError(f"{path / 'train.jsonl'}: line {bad[0]} has no text")
    sets = sorted({str(r.get("set", "all")) for r in rows})
    if train_set in (None, "all"):
        if sets not in ([], ["all"]):
            raise FinetuneError(
                f"dataset {path} is split into sets {'/'.join(sets)}; choose the set to train on "
                "(A = task model, B = relation model)"
            )
        train_set = "all"
    else:
        if sets in ([], ["all"]):
            raise FinetuneError(
                f"dataset {path} is not split, so it has no fact set {train_set!r} (only all); "
                "use a split dataset: generate it with `graft-exp data --split`, or give a "
                "data kind, which is generated split "
                "(articles and relation datasets cannot be split)"
            )
        if train_set not in sets:
            raise FinetuneError(
                f"dataset {path} has no fact set {train_set!r} (it has {', '.join(sets) or 'none'})"
            )
        rows = [r for r in rows if r.get("set") == train_set]
    if len(rows) < 2:
        raise FinetuneError(f"{path / 'train.jsonl'} needs at least 2 texts, has {len(rows)}")
    manifest = load_manifest(path) if (path / "manifest.json").is_file() else {}
    return FactDataset(path, rows, train_set, manifest)


def split_texts(
    texts: Sequence[str], val_fraction: float, seed: int
) -> tuple[list[str], list[str]]:
    """Seeded split of texts (not facts) into (train, validation); both non-empty."""
    order = list(texts)
    random.Random(seed).shuffle(order)
    n_val = min(max(1, round(len(order) * val_fraction)), len(order) - 1)
    return order[n_val:], order[:n_val]


def generic_texts(
    cfg: FinetuneConfig,
    dataset: str | Path,
    corpus_dir: Path | None = None,
    *,
    fetch: bool = True,
) -> tuple[list[str], str]:
    """The generic passages ``cfg`` mixes in, and where they come from
    (:func:`graft.study.data.generic_corpus.choose`; ``corpus_dir`` keeps the paper's corpus
    once downloaded). None when ``cfg.generic_ratio`` is 0."""
    if cfg.generic_ratio <= 0:
        return [], "none"
    corpus = generic_corpus.choose(cfg, dataset, corpus_dir, fetch=fetch)
    return corpus.texts, corpus.source


def cut_for_tokens(text: str, max_length: int) -> str:
    """``text`` cut to twice the characters ``max_length`` tokens can cover
    (:func:`graft.study.data.prompts.char_bound`), so a huge text is never tokenized whole (a
    10 MB line took 2.7 GB before truncation). Its first ``max_length`` tokens are those of
    the whole text: they end long before the cut (realistic text has 3-5 characters per
    token, the bound 128), and BPE's choices near the cut do not reach back that far."""
    return text[: 2 * char_bound(max_length)]


class TokenisedTexts(torch.utils.data.Dataset[dict[str, list[int]]]):
    """Texts as token ids (truncated to ``max_length``), one training example each; each
    text is cut first (:func:`cut_for_tokens`) so that its length costs no memory."""

    def __init__(self, texts: Sequence[str], tokenizer: Any, max_length: int):
        self.items = [
            tokenizer(cut_for_tokens(t, max_length), truncation=True, max_length=max_length)[
                "input_ids"
            ]
            for t in texts
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return {"input_ids": self.items[i]}


@dataclass
class CausalCollator:
    """Pads a batch on the right; the labels are the inputs, padding masked out.

    Args:
        pad_id: the padding token id.
    """

    pad_id: int

    def __call__(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, : len(r["input_ids"])] = 1
        # Masked by attention, not by pad id: the pad token may double as EOS.
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
