"""A study file: models x finetune seeds x experiments x options in one TOML file, read and
checked (:func:`read_study`) before anything is written.

::

    models = ["tiny-llama", "tiny-gpt2"]     # or [models.tiny-llama] tables with options;
                                             # a folder is relative to the file's folder
    finetune_seeds = [0, 1]
    experiments = ["position", "necessity"]  # or [experiments.position] tables with options
    workspace = "workspace"                  # relative to the file's folder
    out = "runs"

    [options]                                # any ExperimentConfig field, for every run
    n = 1

    [slurm]                                  # graft-exp study submit only (all optional)
    partition = "gpu"
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from graft.errors import InputError
from graft.models.registry import EMBEDDED_MODELS, HUB_MODELS, TINY_MODELS
from graft.storage.files import refuse_special
from graft.study.specs.config import ExperimentConfig
from graft.study.studies.kinds import DESIGNS

#: The top-level keys of a study file.
KEYS = ("models", "finetune_seeds", "experiments", "options", "workspace", "out", "slurm")
#: The keys of a study file's ``[slurm]`` table (:mod:`graft.study.studies.slurm`), each with
#: the type it takes and an example of it.
SLURM_KEYS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "partition": (str, '"gpu"'),
    "account": (str, '"my-lab"'),
    "cpus": (int, "4"),
    "mem": ((int, str), '"16G" (or a number of MiB)'),
    "time": ((int, str), '"2:00:00" (or a number of minutes)'),
    "extra": (list, '["--gres=gpu:1"] (sbatch options, one a line)'),
    "python": (str, '"/path/to/venv/bin/python" (the nodes\' Python; default: this one)'),
}
#: What a text ``mem`` (a size, sbatch's units) and ``time`` (sbatch's forms) look like.
SLURM_FORMATS = {"mem": r"\d+[KMGT]?", "time": r"(\d+-)?\d+(:\d+){0,2}"}
#: ExperimentConfig fields a study sets itself, and where the file gives them instead.
RESERVED = {
    "experiment": "list it under experiments",
    "model": "list it under models",
    "finetune_seeds": "give finetune_seeds at the top of the file",
    "out": "give out at the top of the file (each run gets <out>/<model>/seed<S>/<experiment>)",
    "workspace": "give workspace at the top of the file",
    "remote": "a study runs on this machine",
}
#: The options every run of a study may take (:class:`ExperimentConfig` fields).
OPTIONS = tuple(f.name for f in fields(ExperimentConfig) if f.name not in RESERVED)


@dataclass(frozen=True)
class Study:
    """A study: every (model, finetune seed, experiment) is one run.

    Args:
        path: the study file.
        models: model (registry name, hub id or folder) -> its own options over ``options``.
        finetune_seeds: the finetune seeds; each run trains (or finds) its donors with one.
        experiments: experiment name -> its design's own options (``positions``, ``pairs``,
            ...: the keyword arguments of its ``graft.study`` design function).
        options: :class:`ExperimentConfig` fields shared by every run.
        workspace: where datasets and donors live (shared by every run).
        out: where the runs go: ``<out>/<model>/seed<S>/<experiment>``, and ``collected/``.
        slurm: the ``[slurm]`` table: what ``graft-exp study submit`` asks SLURM for, over
            the plan (keys: :data:`SLURM_KEYS`).
    """

    path: Path
    models: dict[str, dict[str, Any]]
    finetune_seeds: tuple[int, ...]
    experiments: dict[str, dict[str, Any]]
    options: dict[str, Any]
    workspace: Path
    out: Path
    slurm: dict[str, Any] = field(default_factory=dict)

    def model_source(self, model: str) -> str:
        """What graft loads for the file's entry ``model``: a relative folder resolved
        against the file's folder (as ``workspace`` and ``out``), any other entry as it is."""
        return model_source(self.path.resolve().parent, model)


def model_source(folder: Path, model: str) -> str:
    """``model`` (a study file's entry) as graft loads it: a relative path that starts with
    ``./`` or ``../``, or that names something in ``folder`` (the file's folder), as a path
    under ``folder``; a registry name, a hub id that is no such path, and an absolute path as
    they are."""
    name = model.replace("\\", "/")
    if _registry_name(model) or Path(model).expanduser().is_absolute():
        return model
    explicit = name.startswith(("./", "../")) or name in (".", "..")
    if explicit or (folder / model).exists():
        return str((folder / model).resolve())
    return model


def _registry_name(model: str) -> bool:
    tiny = "tiny-" + model.removeprefix("tiny-").replace("-", "_")
    return model in EMBEDDED_MODELS or model in HUB_MODELS or tiny in TINY_MODELS


def read_study(path: str | Path) -> Study:
    """The study in the TOML file ``path``, every key checked (the runs' designs are checked
    when its runs are made, :func:`graft.study.studies.runs.study_runs`).

    Raises:
        InputError: one line naming the file, the key and the fix: an unreadable file, an
            unknown key, experiment or option, no models, no experiments, bad seeds.
    """
    file = Path(path)
    refuse_special(file)  # a FIFO would wait for a writer forever
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise InputError(f"cannot read the study file {file}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"{file} is not valid TOML: {err}") from None
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise InputError(f"{file}: unknown key {unknown[0]!r}; the keys are {', '.join(KEYS)}")
    models = _named(file, data, "models", '["smollm2-135m"]')
    experiments = _named(file, data, "experiments", '["position"]')
    for name, options in experiments.items():
        if name not in DESIGNS:
            raise InputError(
                f"{file}: unknown experiment {name!r}; use {', '.join(DESIGNS)}", param=name
            )
        allowed = DESIGNS[name].options
        for key in options:
            if key not in allowed:
                raise InputError(
                    f"{file}: [experiments.{name}] has no option {key!r}; use "
                    f"{', '.join(allowed) or 'none'}"
                )
    options = _table(file, data.get("options", {}), "options")
    for where, table in [("options", options), *((f"models.{m}", o) for m, o in models.items())]:
        _check_options(file, where, table)
    folder = file.resolve().parent
    return Study(
        path=file,
        models=models,
        finetune_seeds=_seeds(file, data.get("finetune_seeds", [0])),
        experiments=experiments,
        options=options,
        workspace=(folder / _text(file, data.get("workspace", "workspace"), "workspace")).resolve(),
        out=(folder / _text(file, data.get("out", "runs"), "out")).resolve(),
        slurm=_slurm(file, _table(file, data.get("slurm", {}), "slurm")),
    )


def _named(file: Path, data: Mapping[str, Any], key: str, example: str) -> dict[str, dict]:
    """``key`` as name -> options: a list of names, or a table of tables (one per name)."""
    value = data.get(key)
    if not value:
        raise InputError(f"{file}: no {key}; add {key} = {example}", param=key)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        if len(set(value)) != len(value):
            raise InputError(f"{file}: {key} lists a name twice; give each once", param=key)
        return {name: {} for name in value}
    if isinstance(value, dict):
        return {name: _table(file, v, f"{key}.{name}") for name, v in value.items()}
    raise InputError(
        f"{file}: {key} must be a list of names or [{key}.NAME] tables, got {value!r}", param=key
    )


def _table(file: Path, value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"{file}: [{where}] must be a table of options, got {value!r}")
    return dict(value)


def _check_options(file: Path, where: str, options: Mapping[str, Any]) -> None:
    for key in options:
        if key in RESERVED:
            raise InputError(f"{file}: [{where}] {key}: {RESERVED[key]}", param=key)
        if key not in OPTIONS:
            raise InputError(
                f"{file}: [{where}] has no option {key!r}; the options are the experiment "
                f"options: {', '.join(OPTIONS)}",
                param=key,
            )


def _slurm(file: Path, table: dict[str, Any]) -> dict[str, Any]:
    for key, value in table.items():
        if key not in SLURM_KEYS:
            raise InputError(
                f"{file}: [slurm] has no key {key!r}; the keys are {', '.join(SLURM_KEYS)}",
                param=key,
            )
        kind, example = SLURM_KEYS[key]
        good = isinstance(value, kind) and not isinstance(value, bool) and value != ""
        if key == "extra":
            good = good and all(isinstance(v, str) and v.startswith("-") for v in value)
        elif key in ("cpus", "mem", "time") and isinstance(value, int):
            good = good and value >= 1
        elif key in SLURM_FORMATS and isinstance(value, str):
            good = re.fullmatch(SLURM_FORMATS[key], value) is not None
        if not good:
            raise InputError(f"{file}: [slurm] {key} = {value!r}: give, say, {example}", param=key)
    return table


def _seeds(file: Path, value: Any) -> tuple[int, ...]:
    seeds = [value] if isinstance(value, int) else value
    good = isinstance(seeds, list) and seeds and len(set(seeds)) == len(seeds)
    if not good or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise InputError(
            f"{file}: finetune_seeds must be a list of distinct whole numbers >= 0, got {value!r}",
            param="finetune_seeds",
        )
    return tuple(seeds)


def _text(file: Path, value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(f"{file}: {key} must be a folder path, got {value!r}", param=key)
    return value
