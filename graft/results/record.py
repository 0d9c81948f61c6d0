"""A run folder's ``config.json`` read back into typed objects: the one reader of a run's
record (:func:`read_run_record`). The runner writes the record
(:func:`graft.study.running.run_record.run_config`); reports, comparisons, publishing and
the analyses read it here, not as nested dicts."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graft.results.run_config import CONFIG_FILE, read_config_file


@dataclass(frozen=True)
class ModelEntry:
    """A model folder a run used.

    Fields:
        path: the folder (or hub id) as the run recorded it.
        fingerprint: a short hash of its weights' index ("" where none was recorded).
    """

    path: str
    fingerprint: str = ""

    @classmethod
    def of(cls, value: Any) -> ModelEntry | None:
        if not isinstance(value, Mapping) or not value.get("path"):
            return None
        return cls(str(value["path"]), str(value.get("fingerprint") or ""))


@dataclass(frozen=True)
class GraftEntry:
    """One graft of a run, in run order.

    Fields:
        name: its name in the tables (``FE+LT``, ``O+FFN``, ``SFT``, ...).
        group: the graft group (a component run's donor pair; "" for none).
        spec: its spec text.
    """

    name: str
    group: str = ""
    spec: str = ""


@dataclass(frozen=True)
class ReplicateEntry:
    """One replicate (data seed x finetune seed) of a replicated run.

    Fields:
        label: its label in the tables.
        data_seed: the seed of the dataset its test prompts came from.
        finetune_seed: the seed its donors were finetuned with.
        dataset: the folder of that dataset (None where not recorded).
    """

    label: str
    data_seed: int
    finetune_seed: int | None
    dataset: Path | None


@dataclass(frozen=True)
class RunRecord:
    """A run folder's ``config.json``, typed. Absent fields read as empty (a record of an
    older graft, or a combined or sweep record, lacks some).

    Fields:
        experiment: the experiment that ran (``position``, ``component``, ... ``custom``).
        options: the run's settings as recorded (``model``, seeds, ``n``, ``protocol``, ...);
            :meth:`graft.study.RunSpecs.from_record` reads them back into specs.
        grafts: the grafts in run order.
        base: the running model's folder.
        donors: donor name -> its folder.
        dataset: the folder of the dataset the test prompts came from (the first
            replicate's in a replicated run).
        replicates: the replicates of a replicated run (empty otherwise).
        pairs: the donor pairs' sub-folders of a combined component run.
        runs: the run folders of a sweep (``graft-exp patching``).
        run_key: the hash of the key fields every table of the run records.
        command, git_commit, git_dirty, created: how and when the run was started.
        packages, machine, engine: what computed it.
        resumes: each resume's time and what it changed.
        finetuned_models: each donor folder's own finetune record.
        raw: the whole JSON object (for a field this class does not name).
    """

    experiment: str
    options: Mapping[str, Any]
    grafts: tuple[GraftEntry, ...]
    base: ModelEntry | None
    donors: Mapping[str, ModelEntry]
    dataset: Path | None
    replicates: tuple[ReplicateEntry, ...]
    pairs: tuple[str, ...]
    runs: tuple[str, ...]
    run_key: str
    command: str | None
    git_commit: str | None
    git_dirty: bool | None
    created: str | None
    packages: Mapping[str, Any] | None
    machine: Mapping[str, Any] | None
    engine: Mapping[str, Any] | None
    resumes: tuple[Mapping[str, Any], ...]
    finetuned_models: Mapping[str, Any] | None
    raw: Mapping[str, Any] = field(repr=False)

    @property
    def model(self) -> str:
        """The base model's name as given (``?`` where not recorded)."""
        return str(self.options.get("model") or "?")

    @property
    def graft_names(self) -> list[str]:
        """The grafts' names in run order, each once."""
        return list(dict.fromkeys(g.name for g in self.grafts))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        """The record of the JSON object ``data`` (a run's ``config.json`` as parsed)."""

        def mapping(name: str) -> Mapping[str, Any] | None:
            value = data.get(name)
            return value if isinstance(value, Mapping) else None

        def names(name: str) -> tuple[str, ...]:
            return tuple(str(v) for v in data.get(name) or [])

        donors = {n: ModelEntry.of(v) for n, v in (mapping("donors") or {}).items()}
        dataset = mapping("dataset") or {}
        return cls(
            experiment=str(data.get("experiment") or "custom"),
            options=mapping("options") or {},
            grafts=tuple(
                GraftEntry(str(g.get("name")), str(g.get("group") or ""), str(g.get("spec") or ""))
                for g in data.get("grafts") or []
                if isinstance(g, Mapping)
            ),
            base=ModelEntry.of(data.get("base")),
            donors={n: e for n, e in donors.items() if e is not None},
            dataset=Path(dataset["path"]) if dataset.get("path") else None,
            replicates=tuple(_replicate(r) for r in data.get("replicates") or []),
            pairs=names("pairs"),
            runs=names("runs"),
            run_key=str(data.get("run_key") or ""),
            command=data.get("command"),
            git_commit=data.get("git_commit"),
            git_dirty=data.get("git_dirty"),
            created=data.get("created"),
            packages=mapping("packages"),
            machine=mapping("machine"),
            engine=mapping("engine"),
            resumes=tuple(r for r in data.get("resumes") or [] if isinstance(r, Mapping)),
            finetuned_models=mapping("finetuned_models"),
            raw=data,
        )


def _replicate(value: Mapping[str, Any]) -> ReplicateEntry:
    dataset = value.get("dataset") or {}
    seed = value.get("finetune_seed")
    return ReplicateEntry(
        label=str(value.get("label")),
        data_seed=int(value.get("data_seed") or 0),
        finetune_seed=None if seed is None else int(seed),
        dataset=Path(dataset["path"])
        if isinstance(dataset, Mapping) and dataset.get("path")
        else None,
    )


def read_run_record(path: str | os.PathLike[str]) -> RunRecord:
    """The record of the run folder ``path`` (or of the ``config.json`` file ``path``).

    Raises:
        FileNotFoundError: there is no ``config.json``.
        DamagedFileError: it is not a JSON object.
    """
    path = Path(path)
    file = path if path.suffix == ".json" else path / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist: {path} holds no run's record")
    return RunRecord.from_json(read_config_file(file))
