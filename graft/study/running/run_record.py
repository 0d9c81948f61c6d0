"""What a run's ``config.json`` records: the options that produced its numbers, the grafts,
the models (paths and fingerprints) and datasets of every replicate, the finetunes used, and
the engine path that computed the rows. Also which fields a resumed run must share
(:func:`key_fields`), and the check of those knowable before any work
(:func:`check_stored_config`: before the datasets, and before any finetune)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from graft.models.hub import offline_note
from graft.results.folder import RunFolder
from graft.study.data.datasets import load_manifest
from graft.study.running.batches import group_batches
from graft.study.running.fullname import resume_key
from graft.study.running.run_inputs import RunModels, RunPaths
from graft.study.specs.config import Replicate
from graft.study.specs.grafts import NamedGraft
from graft.study.specs.run import REPLICATE_OPTIONS, ExecutionSpec, RunSpecs
from graft.study.training.donors import check_status
from graft.study.training.sources import (
    finetune_record,
    model_fingerprint,
)

logger = logging.getLogger(__name__)


#: Options a resumed run must share with the stored config.
KEY_OPTIONS = ("templates", "directions", "n", "batch_size", "seed", "dtype", "head_policy")


def engine_entry(execution: ExecutionSpec, models: RunModels) -> dict[str, Any]:
    """How the engine computes this run's rows (:func:`graft.core.execution.engine.engine_path`),
    and how many stored batches each engine call runs together."""
    from graft.core.execution.engine import engine_path

    remote = execution.remote_run is not None
    donors = {n: m.model for n, m in models.donors.items()}
    path = engine_path(models.base.model, donors, remote=remote)
    return path | {"group_batches": group_batches(execution)}


def _model_entry(path: str) -> dict[str, Any]:
    return {"path": path, "fingerprint": model_fingerprint(path)}


def _graft_entries(grafts: Sequence[NamedGraft]) -> list[dict[str, str]]:
    return [{"name": g.name, "group": g.group, "spec": str(g.spec)} for g in grafts]


def _dataset_entry(data_path: Path) -> dict[str, Any]:
    manifest = load_manifest(data_path)
    manifest_hash = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    return {"path": str(data_path), "manifest_sha256": manifest_hash[:16]}


def run_config(
    run: RunSpecs,
    grafts: Sequence[NamedGraft],
    paths: Mapping[Replicate, RunPaths],
    data_paths: Mapping[int, Path],
    extra_config: dict[str, Any] | None,
) -> dict[str, Any]:
    """The ``config.json`` of the run: what produced its numbers. ``base``, ``donors`` and
    ``dataset`` are the first replicate's; ``replicates`` lists every replicate's (when
    there are several); ``finetuned_models`` holds the ``finetune_config.json`` of every
    finetuned model used (preset, seed, data, machine, package versions); ``hub`` why the
    models came from the hub cache offline, when the hub did not answer."""
    from graft.remote.client import server_versions

    first = paths[run.replicates[0]]
    remote = run.execution.remote
    config = {
        "experiment": run.experiment,
        "options": run.record(),
        "grafts": _graft_entries(grafts),
        "base": _model_entry(first.base),
        "donors": {n: _model_entry(p) for n, p in first.donors.items()},
        "dataset": _dataset_entry(data_paths[run.data.data_seed]),
        "remote": None if remote is None else str(remote),
        "remote_server": None if remote is None else server_versions(remote),
    }
    if run.replicated:
        replicates: list[dict[str, Any]] = [
            {
                "label": str(rep.label),
                "data_seed": rep.data_seed,
                "finetune_seed": rep.finetune_seed,
                "control": rep.control,
                "train_data_seed": rep.train_data_seed,
                "dataset": _dataset_entry(data_paths[rep.data_seed]),
                "base": _model_entry(p.base),
                "donors": {n: _model_entry(d) for n, d in p.donors.items()},
            }
            for rep, p in paths.items()
        ]
        config["replicates"] = replicates
    records = {path: finetune_record(path) for p in paths.values() for path in p.all()}
    config["finetuned_models"] = {path: r for path, r in records.items() if r is not None}
    # how each model folder is checked when it loads (a donor accepted as it is shows here)
    config["model_checks"] = {
        path: check_status(path) for p in paths.values() for path in p.all() if Path(path).is_dir()
    }
    if offline_note() is not None:  # the hub did not answer: the models came from its cache
        config["hub"] = offline_note()
    return config | (extra_config or {})


def key_fields(run: RunSpecs, stored: Mapping[str, Any] | None) -> list[str]:
    """The ``config.json`` fields a resumed run must share with ``stored`` (the folder's
    config, None for a new run): what decides its numbers."""
    key = ["experiment", "grafts", "base", "donors", "dataset"]
    key += [f"options.{k}" for k in KEY_OPTIONS + REPLICATE_OPTIONS]
    key += ["replicates"] if run.replicated else []
    return key + resume_key(run.analysis, stored)


def check_stored_config(
    folder: RunFolder,
    run: RunSpecs,
    grafts: Sequence[NamedGraft],
    data_paths: Mapping[int, Path] | None = None,
    paths: Callable[[], RunPaths] | None = None,
    *,
    planned_dataset: Path | None = None,
) -> None:
    """Refuse now a run folder whose ``config.json`` differs in a key field that is known
    before any work (:meth:`RunFolder.check_config`'s one line): the experiment, the grafts
    and the key options; with ``planned_dataset`` (the first data seed's dataset folder,
    which may not exist yet) the dataset's path, with ``data_paths`` (data seed -> dataset
    folder) its whole entry, with ``paths`` (called only when the folder holds a config:
    where the first replicate's models are, or will be once finetuned) the models' paths.
    The models' fingerprints are compared when the config is written, once they exist. A
    new run, or one with ``overwrite``, passes.

    Raises:
        graft.errors.ConfigMismatchError: a stored config differs in one of those fields.
    """
    stored = None if run.execution.overwrite else folder.read_config()
    if stored is None:
        return
    known = ("experiment", "grafts", "options")
    key = [f for f in key_fields(run, stored) if f.split(".")[0] in known]
    config: dict[str, Any] = {
        "experiment": run.experiment,
        "options": run.record(),
        "grafts": _graft_entries(grafts),
    }
    if planned_dataset is not None:
        config["dataset"] = {"path": str(planned_dataset)}
        key.append("dataset.path")
    if data_paths is not None:
        config["dataset"] = _dataset_entry(data_paths[run.data.data_seed])
        key.append("dataset")
    if paths is not None:
        models = paths()
        config["base"] = {"path": models.base}
        config["donors"] = {n: {"path": p} for n, p in models.donors.items()}
        old = stored.get("donors")
        names = dict.fromkeys([*models.donors, *(old if isinstance(old, dict) else ())])
        key += ["base.path", *(f"donors.{n}.path" for n in names)]
    folder.check_config(config, key)
