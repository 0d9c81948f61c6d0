"""Whether a finetuned model knows its facts, before anything is grafted from it.

A finetune (:mod:`graft.study.training.finetune`) writes ``eval.json``: acc@5 of the
finetuned model (SFT) and of the pretrained one (PRE) on the dataset's test prompts, per
direction. A model that learned its facts recalls them on the prompts of the direction(s)
it was trained on (``forward`` for a ``one``-direction dataset, ``forward`` and ``reverse``
for ``both``) clearly better than PRE: by at least :data:`MIN_GAIN`. A run grafting from a
model below that measures nothing (bars of PRE's level), so the runner stops before
grafting (:func:`check_recall`) unless the run allows weak donors; graft's own ``tiny-*``
random models, which learn nothing in a trial's few steps, are said and let through.
A model folder without ``eval.json`` (a pretrained model, a folder a user brought) is not
checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from graft.errors import ExperimentError
from graft.study.training.donors import FINETUNE_RECORD

#: The least acc@5 gain over the pretrained model, on the prompts of the direction(s) a model
#: was trained on, for it to count as knowing its facts (absolute: 0.10 = 10 points).
MIN_GAIN = 0.10
#: The k of the acc@k compared.
RECALL_K = 5
#: The test directions a model trained on a dataset of each direction learned.
TRAINED_DIRECTIONS = {"one": ("forward",), "both": ("forward", "reverse")}
#: What to change when a donor does not know its facts (library words: a command writes its
#: flags).
WEAK_FIX = (
    "train it more: more steps (a higher finetune_max_steps, or none for the preset's "
    "epochs) or another preset (its learning rate and epochs: cpu, gentle, paper), or your "
    "own (graft-exp finetune --lr, --epochs, --out DIR; then DIR as the donor); or pass "
    "allow_weak_donor to graft from it anyway"
)


@dataclass(frozen=True)
class Recall:
    """How well a finetuned model recalls its facts (from its ``eval.json``), on the trained
    direction where it gains least over the pretrained model.

    Args:
        path: the model folder.
        direction: that test direction (``forward`` or ``reverse``).
        sft: the finetuned model's acc@5 there.
        pre: the pretrained model's acc@5 there.
        n: test prompts there.
        tiny: the model is a finetune of one of graft's ``tiny-*`` random models.
    """

    path: str
    direction: str
    sft: float
    pre: float
    n: int
    tiny: bool = False

    @property
    def gain(self) -> float:
        return self.sft - self.pre

    @property
    def weak(self) -> bool:
        """Whether it does not know its facts (gains less than :data:`MIN_GAIN`)."""
        return self.gain < MIN_GAIN - 1e-9

    def numbers(self) -> str:
        return (
            f"acc@{RECALL_K} {self.sft:.2f} on its {self.direction} test prompts (n = "
            f"{self.n}), the pretrained model's {self.pre:.2f}"
        )

    def line(self) -> str:
        """One line on the model: whether it knows its facts, with the numbers."""
        if not self.weak:
            return f"{self.path} knows its facts: {self.numbers()}"
        return (
            f"{self.path} does not know its facts: {self.numbers()}; a donor must beat the "
            f"pretrained model there by at least {MIN_GAIN:.2f} to be grafted from"
        )


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def model_recall(path: str | Path) -> Recall | None:
    """The :class:`Recall` of the finetuned model folder ``path``, or None when it holds no
    readable ``eval.json`` of graft's (nothing to check)."""
    folder = Path(path)
    evaluation = _read(folder / "eval.json")
    if not isinstance(evaluation, dict) or not isinstance(evaluation.get("sft"), dict):
        return None
    manifest = _read(folder / "data_manifest.json")
    direction = manifest.get("direction") if isinstance(manifest, dict) else None
    record = _read(folder / FINETUNE_RECORD)
    model = record.get("model") if isinstance(record, dict) else None
    tiny = isinstance(model, dict) and model.get("source") == "tiny"
    found = []
    for test in TRAINED_DIRECTIONS.get(str(direction), ("forward",)):
        sft = evaluation["sft"].get(test, {}).get("overall", {})
        pre = (evaluation.get("pre") or {}).get(test, {}).get("overall", {})
        key = f"top{RECALL_K}"
        if key in sft:
            found.append(
                Recall(str(path), test, sft[key], pre.get(key, 0.0), int(sft.get("n", 0)), tiny)
            )
    return min(found, key=lambda r: r.gain) if found else None


def training_line(path: str | Path) -> str | None:
    """One line on how the finetune of the model folder ``path`` went, from its
    ``train_log.json`` (steps, first and last training loss, best validation loss), or None
    when it has none: the Trainer's metrics go to the run's log, not the console."""
    log = _read(Path(path) / "train_log.json")
    if not isinstance(log, dict):
        return None
    history = log.get("log_history") or []
    losses = [e["loss"] for e in history if isinstance(e, dict) and "loss" in e]
    parts = [f"trained {log.get('global_step', '?')} steps"]
    if losses:
        parts.append(f"training loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    if isinstance(log.get("best_val_loss"), float):
        parts.append(
            f"best validation loss {log['best_val_loss']:.3f} ({log.get('best_checkpoint')})"
        )
    return "; ".join(parts) + f" (every logged step in {Path(path) / 'train_log.json'})"


def trained_model_lines(path: str | Path) -> list[str]:
    """What ``graft-exp finetune`` says last of the model folder ``path``: how its training
    went (:func:`training_line`) and whether it knows its facts (:class:`Recall`), a weak one
    as a warning saying what the experiments do with it and what to change."""
    trained = training_line(path)
    lines = [trained] if trained else []
    recall = model_recall(path)
    if recall is None:
        return lines
    if not recall.weak:
        return [*lines, recall.line()]
    return [
        *lines,
        f"warning: {recall.line()}; the experiments stop before grafting from it: train it "
        "more (a higher --epochs, --finetune-max-steps or --lr, or another --preset), or "
        "give them --allow-weak-donor",
    ]


def check_recall(paths: Iterable[str], allow_weak: bool = False) -> dict[str, dict[str, Any]]:
    """Check that every finetuned model among ``paths`` knows its facts; return, for each
    model checked, its record for ``config.json`` (the numbers, ``weak``, and what let a
    weak one through: ``allow_weak_donor`` or ``tiny model``).

    Raises:
        ExperimentError: a model does not know its facts, it is no ``tiny-*`` finetune and
            ``allow_weak`` is not set (one line: the numbers and what to change).
    """
    records: dict[str, dict[str, Any]] = {}
    for path in dict.fromkeys(paths):
        recall = model_recall(path)
        if recall is None:
            continue
        if recall.weak and not (allow_weak or recall.tiny):
            raise ExperimentError(f"{recall.line()}; {WEAK_FIX}", param="allow_weak_donor")
        through = None
        if recall.weak:
            through = "allow_weak_donor" if allow_weak else "tiny model"
        records[path] = asdict(recall) | {"weak": recall.weak, "let_through": through}
    return records


def let_through_line(record: dict[str, Any]) -> str:
    """The warning for a weak model :func:`check_recall` let through (its ``record``)."""
    recall = Recall(**{k: v for k, v in record.items() if k not in ("weak", "let_through")})
    why = (
        "allow_weak_donor is set"
        if record["let_through"] == "allow_weak_donor"
        else "it is a finetune of one of graft's tiny random test models, which learn "
        "nothing in a trial's few steps (a real model stops here)"
    )
    return f"{recall.line()}; grafted from anyway: {why}"
