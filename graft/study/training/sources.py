"""The models and dataset of an experiment: found in the workspace, or made first.

A :class:`~graft.study.specs.config.ModelSource` is the pretrained model, an explicit folder, or a
finetune variant that :class:`~graft.study.training.workspace.Workspace` finds or finetunes. Before a
run starts, :func:`pending_finetune` announces each finetune it needs with a rough duration.

A finetune variant is located per :class:`~graft.study.specs.config.Replicate`: the run's preset
with ``seed`` set to the replicate's finetune seed (``dataclasses.replace(preset, seed=s)``:
folder ``<preset>`` for the preset's own seed, ``<preset>-<hash>`` otherwise, as
:meth:`~graft.study.specs.presets.FinetuneConfig.key` names it), trained on the generated dataset
of the replicate's training data seed (its data seed, plus the control offset for a control
model). Where a replicate's models are, or will be: :func:`replicate_paths`, the runner's and
its stored-config check's alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graft.errors import ExperimentError, FinetuneError, GraftError, ModelNotFoundError
from graft.models import device_type, missing_folder, resolve_model_name
from graft.study.data.training_data import load_fact_dataset, split_texts
from graft.study.specs.config import ModelSource, Replicate
from graft.study.specs.donor import DonorRequest
from graft.study.specs.presets import FinetuneConfig, resolve_config
from graft.study.specs.run import DonorSpec, RunSpecs
from graft.study.training.duration import tokens_per_text
from graft.study.training.finetune import duration_text, estimate_seconds, training_steps
from graft.study.training.workspace import DonorLocation, Workspace, parse_variant


def _workspace(run: RunSpecs) -> Workspace:
    return Workspace.at(run.execution.workspace)


def dataset_dir(
    run: RunSpecs, direction: str = "one", data_seed: int | None = None, *, planned: bool = False
) -> Path:
    """The dataset folder of ``run`` (generated into the workspace when ``dataset`` is a kind,
    with ``data_seed``, default ``run.data.data_seed``; a folder is taken as it is).
    ``planned``: the folder it will be, generating and checking nothing."""
    workspace = _workspace(run)
    find = workspace.planned_dataset if planned else workspace.find_dataset
    return find(run.data.where(direction, data_seed))


def needs_finetune(source: ModelSource) -> bool:
    """Whether ``source`` is a finetune variant (found in, or finetuned into, the workspace)."""
    return not source.path and source.variant != "pretrained"


def finetune_preset(
    donors: DonorSpec, device: str | None, finetune_seed: int = 0
) -> FinetuneConfig:
    """The finetune config of a run's models for one finetune seed: the preset (with
    ``finetune_max_steps`` and ``generic_corpus``) with ``seed`` replaced; without one, the
    protocol's (``--protocol paper``: the paper's own, A.3.3: lr 2e-5, weight decay 0.01,
    batch 4, 10 epochs, on any device), else the device's default."""
    return resolve_config(
        donors.preset,
        device=device,
        max_steps=donors.finetune_max_steps,
        seed=finetune_seed,
        generic_corpus=donors.generic_corpus,
    )


def donor_request(run: RunSpecs, source: ModelSource, replicate: Replicate) -> DonorRequest:
    """The donor that the finetune variant ``source`` names in ``replicate`` of ``run``: the
    one object the workspace locates it by and the planner plans it by."""
    return DonorRequest(
        run.donors.model,
        run.data.dataset,
        source.variant,
        finetune_preset(run.donors, run.execution.device, replicate.finetune_seed),
        split=run.data.split,
        n_facts=run.data.n_facts,
        data_seed=replicate.train_data_seed,
        shuffle=run.data.shuffle,
        device=run.execution.device,
        protocol=run.protocol,
    )


def _donor(run: RunSpecs, source: ModelSource, replicate: Replicate | None = None) -> DonorLocation:
    """Where the finetune variant ``source`` of ``replicate`` (default: the run's first) is;
    its dataset is generated if missing."""
    request = donor_request(run, source, replicate or run.replicates[0])
    return _workspace(run).locate_donor(request)


def resolve_model_path(
    run: RunSpecs, source: ModelSource, replicate: Replicate | None = None
) -> str:
    """Model name or folder for ``source`` in ``replicate`` (default: the run's first),
    finetuning it first when it is missing."""
    if source.path:
        return source.path
    if source.variant == "pretrained":
        return run.donors.model
    donor = _donor(run, source, replicate)
    workspace = _workspace(run)
    quiet = not run.execution.progress
    return str(workspace.finetune_donor(donor, device=run.execution.device, quiet=quiet))


def planned_model_path(
    run: RunSpecs, source: ModelSource, replicate: Replicate | None = None
) -> str:
    """The model name or folder :func:`resolve_model_path` gives for ``source``, without
    finetuning anything (a finetune variant's folder may not exist yet)."""
    if source.path or source.variant == "pretrained":
        return resolve_model_path(run, source, replicate)
    return str(_donor(run, source, replicate).path)


@dataclass
class RunPaths:
    """Where the models of one replicate are.

    Args:
        base: the base model's name or folder.
        donors: donor name -> name or folder.
    """

    base: str
    donors: dict[str, str]

    def all(self) -> list[str]:
        return [self.base, *self.donors.values()]


def replicate_paths(
    run: RunSpecs,
    base: ModelSource,
    donors: Mapping[str, ModelSource],
    replicate: Replicate,
    *,
    planned: bool = False,
) -> RunPaths:
    """Where the models of ``replicate`` are, each finetuned first where it is missing;
    ``planned``: where they are or will be, nothing trained (the one place the runner and its
    stored-config check work them out)."""
    find = planned_model_path if planned else resolve_model_path
    return RunPaths(
        find(run, base, replicate),
        {name: find(run, src, replicate) for name, src in donors.items()},
    )


def trained_mix(preset: FinetuneConfig, n_fact_texts: int) -> tuple[int, int]:
    """``(fact texts, generic passages)`` a finetune with ``preset`` trains on, of
    ``n_fact_texts`` fact texts: the split's training part and the passages mixed in."""
    # only the split's sizes matter here: placeholder texts
    train, _ = split_texts([""] * n_fact_texts, preset.val_fraction, preset.seed)
    return len(train), round(preset.generic_ratio * len(train)) if preset.generic_ratio else 0


def training_texts(preset: FinetuneConfig, n_fact_texts: int) -> int:
    """Texts a finetune with ``preset`` trains on, of ``n_fact_texts`` fact texts
    (:func:`trained_mix`, both parts)."""
    return sum(trained_mix(preset, n_fact_texts))


def finetune_steps(preset: FinetuneConfig, n_fact_texts: int) -> int:
    """Optimisation steps of a finetune with ``preset`` on ``n_fact_texts`` texts."""
    return training_steps(
        preset, math.ceil(training_texts(preset, n_fact_texts) / preset.batch_size)
    )


def pending_finetune(
    run: RunSpecs, source: ModelSource, n_params: int, replicate: Replicate | None = None
) -> str | None:
    """A line announcing the finetune ``source`` of ``replicate`` (default: the run's first)
    needs first (steps and a rough duration), or None when it needs none (pretrained, an
    explicit path, or already finetuned)."""
    if not needs_finetune(source):
        return None
    donor = _donor(run, source, replicate)
    if donor.finished:
        return None
    texts = [row["text"] for row in load_fact_dataset(donor.dataset_dir, donor.train_set).train]
    steps = finetune_steps(donor.config, len(texts))
    device = device_type(run.execution.device)
    rep = replicate or run.replicates[0]
    which = f" (finetune seed {rep.finetune_seed}, data seed {rep.train_data_seed})"
    which = which if run.replicated else ""
    seconds = estimate_seconds(
        n_params, donor.config.batch_size, steps, device, tokens_per_text(texts)
    )
    gpu_work = device == "cpu" and seconds > 3 * 3600
    return (
        f"the {source.variant!r} model{which} of {run.donors.model} is not in the workspace yet; it "
        f"is finetuned first: {steps} steps ({donor.config.name} preset), roughly "
        f"{duration_text(seconds)} of training on {device} (an estimate)"
        + (
            "; this is GPU work: run it on a GPU, or choose the cpu preset for a CPU-sized finetune"
            if gpu_work
            else ""
        )
    )


def finetune_record(path: str) -> dict[str, Any] | None:
    """The ``finetune_config.json`` a finetuned model folder holds (preset, seed, data,
    device, machine, package versions), or None for any other model."""
    file = Path(path) / "finetune_config.json"
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def model_fingerprint(path: str) -> str | None:
    """A short hash of a local model folder's config and weight-file sizes (cheap, stable)."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    h = hashlib.sha256()
    for file in sorted(folder.glob("*")):
        if file.is_file() and file.suffix in (".json", ".safetensors"):
            h.update(file.name.encode())
            h.update(str(file.stat().st_size).encode())
            if file.suffix == ".json":
                h.update(file.read_bytes())
    return h.hexdigest()[:16]


def model_source(text: str, param: str = "donors") -> ModelSource:
    """The model source ``text`` names: ``pretrained``, a finetune variant (``one``,
    ``both``, ``task``, ``both-A``, ...) or a model (folder, registry name or hub id).

    Raises:
        ExperimentError: ``text`` is none of them (its parameter: ``param``).
    """
    if text == "pretrained":
        return ModelSource(text)
    with contextlib.suppress(FinetuneError):
        parse_variant(text)
        return ModelSource(text)
    try:
        resolve_model_name(text)
    except ModelNotFoundError:
        raise ExperimentError(
            missing_folder(text)
            or f"{text!r} is neither a variant (pretrained, one, both, task, relation, one-A, "
            "one-B, both-A, both-B) nor a model folder, registry name or hub id",
            param=param,
        ) from None
    except GraftError as err:  # e.g. a folder that holds no model
        raise ExperimentError(str(err), param=param) from None
    return ModelSource(path=text)


def model_sources(texts: Sequence[str], param: str = "donors") -> dict[str, ModelSource]:
    """Name -> model source of ``texts``, each ``NAME=VARIANT`` or ``NAME=PATH``
    (:func:`model_source`).

    Raises:
        ExperimentError: a text of another form, a name given twice, a source that names
            nothing (its parameter: ``param``).
    """
    sources: dict[str, ModelSource] = {}
    for text in texts:
        name, sep, source = (part.strip() for part in text.partition("="))
        if not sep or not name or not source:
            raise ExperimentError(f"{text!r}: use NAME=VARIANT or NAME=PATH", param=param)
        if name in sources:
            raise ExperimentError(f"{name!r} is given twice", param=param)
        sources[name] = model_source(source, param)
    return sources
