"""The loaded pieces of an experiment run: its prompts per data seed, and its models per
replicate, each loaded once (a replicate keeps what it shares with the one before) and
checked against the run's options."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from graft.core.families.arch import check_compatible
from graft.core.language.spec import SpecError
from graft.errors import ExperimentError
from graft.models import LoadedModel, load_model
from graft.study.data.prompts import TestExample
from graft.study.specs.config import ModelSource
from graft.study.specs.run import ExecutionSpec, RunSpecs
from graft.study.training.donors import verify_donor
from graft.study.training.sources import RunPaths, replicate_paths

logger = logging.getLogger(__name__)


@dataclass
class RunPrompts:
    """The rows of a run.

    Args:
        examples: the sampled test examples.
        drops: template -> drop reason -> count.
        rows: (example index, graft index), shortest prompts first.
        skipped: graft name -> examples lacking one of its spans.
    """

    examples: list[TestExample]
    drops: dict[str, dict[str, int]]
    rows: list[tuple[int, int]]
    skipped: dict[str, int]


@dataclass
class RunModels:
    """The loaded models of one replicate.

    Args:
        base: the base model.
        donors: donor name -> model.
        base_path: where the base came from.
        donor_paths: donor name -> where it came from.
    """

    base: LoadedModel
    donors: dict[str, LoadedModel]
    base_path: str
    donor_paths: dict[str, str]


def _check_models(
    execution: ExecutionSpec, base: LoadedModel, donors: Mapping[str, LoadedModel]
) -> None:
    """Donors must match the base's architecture; a remote run needs the base's model key."""
    try:
        for name, donor in donors.items():
            check_compatible(base.model, donor.model, name)
    except SpecError as err:
        raise ExperimentError(str(err)) from None
    if execution.remote is not None and execution.remote.mode == "remote":
        execution.remote.resolved_model_key(base.model)


def load_run_models(
    execution: ExecutionSpec, paths: RunPaths, loaded: dict[str, LoadedModel]
) -> RunModels:
    """The models of one replicate, each loaded once: ``loaded`` (path -> model) keeps what
    the replicate shares with the previous one and drops the rest. Model folders are checked
    against their ``checksums.json`` first (:func:`graft.study.training.donors.verify_donor`; hashes
    are cached, so a folder shared by replicates is read once).

    Raises:
        graft.errors.DamagedFileError: a model folder does not match its checksums.
    """
    for path in [p for p in loaded if p not in paths.all()]:
        del loaded[path]
    for path in paths.all():
        if Path(path).is_dir():
            verify_donor(path, "base" if path == paths.base else "donor")
    for path in paths.all():
        if path not in loaded:
            loaded[path] = load_model(path, dtype=execution.dtype, device=execution.device)
    models = RunModels(
        loaded[paths.base],
        {n: loaded[p] for n, p in paths.donors.items()},
        paths.base,
        dict(paths.donors),
    )
    _check_models(execution, models.base, models.donors)
    return models


def planned_paths(run: RunSpecs, base: ModelSource, donors: Mapping[str, ModelSource]) -> RunPaths:
    """Where the first replicate's models are, or will be once finetuned (nothing is
    trained)."""
    return replicate_paths(run, base, donors, run.replicates[0], planned=True)
