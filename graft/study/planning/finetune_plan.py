"""The plan of a finetune before the model loads: its texts, steps and rough duration, its
memory (:mod:`graft.study.planning.memory`) and the GPU sizes it fits, and the setting that makes
it fit a device (:func:`finetune_fix`). Datasets the workspace lacks are generated into a
scratch folder (:class:`PlanWorkspace`), never into the workspace. An experiment's whole
plan is :mod:`graft.study.planning.run_plan`'s."""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from graft.core.families.arch import family_of_config
from graft.errors import GraftError
from graft.models import device_type as type_of_device
from graft.models.configs import FoundConfig, local_tokenizer, model_config
from graft.study.data.files import load_generic_texts
from graft.study.data.generic_corpus import settle
from graft.study.data.training_data import TokenisedTexts, generic_texts, load_fact_dataset
from graft.study.planning.device_memory import (
    FIT_SHARE,
    DeviceMemory,
    needed_bytes,
    verdict,
)
from graft.study.planning.memory import MemoryPlan, describe, estimate_finetune_bytes, gib
from graft.study.planning.model_size import model_size
from graft.study.specs.donor import DatasetRequest, DonorRequest
from graft.study.specs.presets import LEAN_PRESETS, FinetuneConfig
from graft.study.training.finetune import duration_text, estimate_seconds, is_finished
from graft.study.training.sources import finetune_steps, trained_mix
from graft.study.training.workspace import Workspace, donor_dataset

#: Free memory of common GPU sizes once their CUDA context is up (GiB), for "needs ...".
GPU_SIZES = {"24 GB": 23.0, "40 GB": 39.0, "80 GB": 78.5}
#: Characters per token when no tokenizer is at hand (English BPE has 3-5; fewer is safer).
CHARS_PER_TOKEN = 3.0


@dataclass(frozen=True)
class Lengths:
    """The longest text of a set, in tokens, and the set's mean.

    Args:
        tokens: the longest text's length.
        counted: counted with the model's tokenizer (else estimated from characters).
        mean: the mean length of a text (what a training step's time grows with).
    """

    tokens: int
    counted: bool
    mean: float = 1.0

    def words(self) -> str:
        return f"{self.tokens} tokens" + ("" if self.counted else " (estimated from characters)")


def token_lengths(texts: Sequence[str], tokenizer: Any, limit: int) -> tuple[list[int], bool]:
    """Each text's length in tokens, cut at ``limit``, and whether the tokenizer counted them
    (without one: estimated from characters, :data:`CHARS_PER_TOKEN`)."""
    if tokenizer is None:
        return [min(math.ceil(len(t) / CHARS_PER_TOKEN) + 1, limit) for t in texts], False
    return [len(ids) for ids in TokenisedTexts(texts, tokenizer, limit).items], True


def longest(
    texts: Sequence[str], tokenizer: Any, limit: int, weights: Sequence[float] | None = None
) -> Lengths:
    """The longest of ``texts`` and their mean (weighted by ``weights`` when given: how often
    each text is trained on)."""
    lengths, counted = token_lengths(texts, tokenizer, limit)
    if not lengths:
        return Lengths(1, tokenizer is not None)
    if weights is None or sum(weights) <= 0:
        weights = [1.0] * len(lengths)
    mean = sum(n * w for n, w in zip(lengths, weights, strict=True)) / sum(weights)
    return Lengths(max(1, *lengths), counted, max(1.0, mean))


@dataclass(frozen=True)
class FinetunePlan:
    """One finetune a command makes.

    Args:
        model: the model finetuned.
        what: what is finetuned, in words (``the 'one' donor (finetune seed 0)``).
        config: its hyper-parameters.
        precision: ``float32``, ``mixed`` (float32 weights, 16-bit autocast) or ``bfloat16``.
        n_texts: training texts (the split's training part, generic passages included).
        steps: optimisation steps.
        length: the longest training text.
        seconds: a rough duration (:func:`graft.study.training.finetune.estimate_seconds`).
        device_type: ``cpu`` or ``cuda``.
        memory: its memory plan.
        held_bytes: other models held while it trains (an experiment's pretrained model).
        folder: where it is written.
        gpu_needed: what it would need of a GPU (in the precision it takes there), for the
            GPU sizes it fits.
        finished: it is already in the workspace (nothing to train).
        model_here: the model is on this machine (not only its published config).
    """

    model: str
    what: str
    config: FinetuneConfig
    precision: str
    n_texts: int
    steps: int
    length: Lengths
    seconds: float
    device_type: str
    memory: MemoryPlan
    held_bytes: int
    folder: Path
    gpu_needed: int
    finished: bool = False
    model_here: bool = True

    @property
    def needed(self) -> int:
        """What it needs of the device: its peak (on the CPU with the heap's share) and what
        is held meanwhile."""
        return needed_bytes(self.memory, self.device_type) + self.held_bytes

    def gpu_words(self) -> str:
        """What :attr:`gpu_needed` counts, with its size: every GPU verdict says the same."""
        held = ", the pretrained model held included" if self.held_bytes else ""
        precision = _precision_words(finetune_precision(self.config, "cuda"))
        return f"{precision}{held}: {gib(self.gpu_needed)}"

    def lines(self) -> list[str]:
        if self.finished:
            return [f"{self.what}: already finetuned in {self.folder}"]
        cfg = self.config
        extras = " + gradient checkpointing" if cfg.gradient_checkpointing else ""
        held = f" + {gib(self.held_bytes)} held (the pretrained model)" if self.held_bytes else ""
        return [
            f"{self.what}: finetuned first into {self.folder}",
            f"  {cfg.name} preset ({_precision_words(self.precision)}{extras}, AdamW): "
            f"{self.steps} steps of {cfg.batch_size} texts of at most {self.length.words()} "
            f"({self.n_texts} training texts), roughly {duration_text(self.seconds)} on "
            f"{self.device_type} (an estimate)",
            f"  memory: {describe(self.memory)}{held}",
            f"  on a GPU ({self.gpu_words()}): {gpu_sizes(self.gpu_needed)}",
        ]


def _precision_words(precision: str) -> str:
    return {
        "mixed": "mixed precision: float32 weights and AdamW state, 16-bit autocast",
        "bfloat16": "weights, gradients and AdamW state in bfloat16",
    }.get(precision, precision)


def gpu_sizes(needed: int) -> str:
    """Which common GPU sizes ``needed`` bytes fit: ``24 GB: no, 40 GB: tight, 80 GB: yes``."""
    memory = {k: DeviceMemory("cuda", k, round(v * 2**30), None) for k, v in GPU_SIZES.items()}
    words = {"fits": "yes", "tight": "tight", "does not fit": "no"}
    return ", ".join(f"{k} {words[verdict(needed, m)]}" for k, m in memory.items())


def finetune_precision(cfg: FinetuneConfig, device_type: str) -> str:
    """The precision a finetune with ``cfg`` trains in on ``device_type``."""
    if cfg.weights_dtype == "bfloat16":
        return "bfloat16"
    return "mixed" if cfg.fp16_on_cuda and device_type == "cuda" else "float32"


def check_family(model: str) -> None:
    """Raise the UnsupportedModelError of ``model`` when its config, as found on this machine
    (nothing downloaded), is of a family graft has no table for; a run that skips the memory
    plan says so before it finetunes or loads anything."""
    found = model_config(model)
    if found is not None:
        family_of_config(found.config)


def found_config(model: str) -> FoundConfig:
    """``model``'s config as found on this machine, of a family graft supports.

    Raises:
        UnsupportedModelError: its architecture has no family table (before any weights or
            memory planning, which would trace it).
        GraftError: no config on this machine and no published one.
    """
    found = model_config(model)
    if found is None:
        raise GraftError(
            f"cannot plan {model}: its config is neither on this machine nor one of graft's "
            "published ones; download the model once (or pass its folder)"
        )
    family_of_config(found.config)
    return found


def plan_finetune(
    model: str,
    dataset_dir: Path,
    config: FinetuneConfig,
    *,
    train_set: str | None = None,
    device: str | None = None,
    folder: Path | None = None,
    what: str | None = None,
    held_bytes: int = 0,
    corpus_dir: Path | None = None,
) -> FinetunePlan:
    """The plan of finetuning ``model`` on the dataset folder ``dataset_dir`` (as
    :func:`graft.study.training.finetune.finetune` would), without loading the model; a generic
    corpus not downloaded yet is not downloaded (its lengths are guessed from the stand-in's)."""
    device_type = type_of_device(device)
    found = found_config(model)
    data = load_fact_dataset(dataset_dir, train_set)
    generic, _ = generic_texts(config, data.path, corpus_dir, fetch=False)
    if config.generic_ratio > 0 and not generic:
        generic = load_generic_texts()  # the hub's, not downloaded yet: lengths alike
    texts = [r["text"] for r in data.train]
    steps = finetune_steps(config, len(texts))
    positions = getattr(found.config, "n_positions", None)  # GPT-2's learned positions
    limit = min(config.max_length, positions) if positions else config.max_length
    # the mean as trained: the fact texts' training part and the generic passages mixed in
    n_fact, n_generic = trained_mix(config, len(texts))
    weights = [n_fact / max(1, len(texts))] * len(texts)
    weights += [n_generic / len(generic)] * len(generic) if generic else []
    length = longest(texts + generic, local_tokenizer(model), limit, weights)
    precision = finetune_precision(config, device_type)

    def memory_in(dtype: str) -> MemoryPlan:
        return estimate_finetune_bytes(
            found.config,
            dtype=dtype,
            batch_size=config.batch_size,
            seq_len=length.tokens,
            gradient_checkpointing=config.gradient_checkpointing,
        )

    memory = memory_in(precision)
    on_gpu = memory_in(finetune_precision(config, "cuda"))
    n_params = model_size(found.config).n_params
    return FinetunePlan(
        model=model,
        what=what or f"{model} on {Path(dataset_dir).name}",
        config=config,
        precision=precision,
        n_texts=n_fact + n_generic,
        steps=steps,
        length=length,
        seconds=estimate_seconds(n_params, config.batch_size, steps, device_type, length.mean),
        device_type=device_type,
        memory=memory,
        held_bytes=held_bytes,
        folder=Path(folder) if folder is not None else Path(dataset_dir),
        gpu_needed=needed_bytes(on_gpu, "cuda") + held_bytes,
        finished=folder is not None and is_finished(folder),
        model_here=found.local,
    )


# --------------------------------------------------------------- datasets, not written


class PlanWorkspace:
    """A workspace as a plan sees it: datasets it holds are read where they are, others are
    generated into a scratch folder (:func:`scratch_workspace`), never into the workspace.

    Args:
        real: the workspace.
        scratch: where missing datasets are generated for reading.
    """

    def __init__(self, real: Workspace, scratch: Path) -> None:
        self.real = real
        self.scratch = Workspace(scratch)

    def dataset(self, data: DatasetRequest) -> tuple[Path, Path]:
        """(where ``data`` is or will be in the workspace, a folder to read it from)."""
        if data.is_folder:
            path = self.real.find_dataset(data)
            return path, path
        read = self.scratch.find_dataset(data)  # checks as the run does
        real = self.real.root / "datasets" / read.name
        return real, real if (real / "manifest.json").is_file() else read


@contextlib.contextmanager
def scratch_workspace(workspace: str | None) -> Iterator[PlanWorkspace]:
    with tempfile.TemporaryDirectory(prefix="graft-plan-") as tmp:
        yield PlanWorkspace(Workspace.at(workspace), Path(tmp))


def plan_donor(
    request: DonorRequest,
    *,
    workspace: PlanWorkspace,
    out: Path | None = None,
    what: str | None = None,
    held_bytes: int = 0,
) -> FinetunePlan:
    """The plan of the donor :meth:`Workspace.locate_donor` names for ``request`` (its
    dataset generated into the scratch folder if the workspace lacks it); ``out``: another
    folder than the workspace's; ``what``: how the plan names it."""
    train_set, data = donor_dataset(request)
    real, read = workspace.dataset(data)
    corpora = workspace.real.corpus_dir
    config = settle(request.config, read, corpora, fetch=False)
    folder = out or workspace.real.donor_dir(request.model, real, train_set, config)
    return plan_finetune(
        request.model,
        read,
        config,
        train_set=train_set,
        device=request.device,
        folder=folder,
        what=what or f"the {request.variant!r} model",
        held_bytes=held_bytes,
        corpus_dir=corpora,
    )


def verdict_lines(needed: int, memory: DeviceMemory, fixes: list[str]) -> list[str]:
    result = verdict(needed, memory)
    if result == "unknown" and memory.device.startswith("cuda"):
        return [f"needs about {gib(needed)}: on a GPU of {gpu_sizes(needed)}"]
    head = f"needs about {gib(needed)}: {result}"
    if result == "tight":
        head += f" (above {FIT_SHARE:.0%} of the free memory)"
    lines = [head]
    return lines + (fixes if result in ("tight", "does not fit") else [])


def fixes_of(plan: FinetunePlan, memory: DeviceMemory) -> list[str]:
    """The fix lines of a lone finetune (the finetune command's own settings)."""
    if plan.finished or verdict(plan.needed, memory) == "fits":
        return []
    return [finetune_fix(plan, memory, presets_only=False)]


def finetune_lines(plan: FinetunePlan, memory: DeviceMemory) -> list[str]:
    """What ``graft-exp finetune --dry-run`` prints."""
    lines = ["plan of finetune (nothing loaded, nothing written):", *plan.lines()]
    lines.append(f"device: {memory.describe()}")
    if plan.finished:
        return lines
    return lines + verdict_lines(plan.needed, memory, fixes_of(plan, memory))


def finetune_fix(plan: FinetunePlan, memory: DeviceMemory, *, presets_only: bool) -> str:
    """The first setting that makes finetune ``plan`` fit ``memory``: gradient
    checkpointing, then bfloat16 weights with it (as a preset, ``preset='paper-bf16'``, when
    ``presets_only``: an experiment's donors take presets); or that none does."""
    cfg = plan.config
    options: list[tuple[str, FinetuneConfig]] = []
    if not cfg.gradient_checkpointing and not presets_only:
        options.append(("gradient_checkpointing", replace(cfg, gradient_checkpointing=True)))
    lean = replace(cfg, weights_dtype="bfloat16", gradient_checkpointing=True, fp16_on_cuda=False)
    if cfg.weights_dtype != "bfloat16":
        if not presets_only:
            options.append(("weights_dtype='bfloat16' with gradient_checkpointing", lean))
        elif cfg.name in LEAN_PRESETS:
            options.append((f"preset={LEAN_PRESETS[cfg.name].name!r}", lean))
    found = found_config(plan.model)
    for words, option in options:
        memory_plan = estimate_finetune_bytes(
            found.config,
            dtype=finetune_precision(option, plan.device_type),
            batch_size=option.batch_size,
            seq_len=plan.length.tokens,
            gradient_checkpointing=option.gradient_checkpointing,
        )
        needed = needed_bytes(memory_plan, plan.device_type) + plan.held_bytes
        if verdict(needed, memory) == "fits":
            return f"to fit the finetune: {words} ({gib(needed)})"
    return (
        f"the finetune needs about {gib(plan.needed)} and no setting here makes it fit: "
        f"use a device with more free memory (on a GPU, {plan.gpu_words()}: "
        f"{gpu_sizes(plan.gpu_needed)})"
    )
