"""Publishing results into a ``results/NAME/`` folder, with the provenance of every table.

A ``results/`` folder holds the tables of finished runs and benchmarks in the layout
:func:`graft.results.paper.agreement.read_results` reads, and one ``provenance.json`` that says,
for each published experiment or benchmark, what computed it: the command line, the git
commit and whether the checkout was dirty, package versions, device and machine (CPU model,
CPU and thread count, GPU), when it was created and resumed, its seeds, n, model and
protocol, and the finetuned donors' own records (their machine, versions and seed).

:func:`publish_run` copies a run folder's CSV tables in (``graft-exp publish``):

- ``summary.csv``, ``contrasts.csv``, ``contrasts_name.csv`` become
  ``<name>_summary.csv``, ``<name>_contrasts.csv``, ``<name>_contrasts_name.csv``, with
  ``name`` the run's experiment (or the name it is published as, ``tokens_paper``);
- the tables of :data:`KEPT_NAMES` keep their own names (``top1_kinds.csv`` of a position
  run, ``lens_summary.csv`` of a lens run), unless another entry of the folder holds that
  name already (then they are prefixed too); when one would take the name of the run's own
  summary (a lens run's ``lens_summary.csv``), the run's own tables go under
  ``<name>_run_`` instead;
- every other CSV is prefixed: ``top_tokens.csv`` -> ``<name>_top_tokens.csv``;
- the per-prompt rows (``examples.parquet``) become ``<name>_examples.parquet``, written
  with zstd, so every cell and per-row claim can be recomputed from the results folder.

A component run of several donor pairs (its folder holds the combined summary and a run
folder per pair) publishes the pairs' contrasts as one table. A patching sweep (its folder
holds ``sweep.csv``, ``findings.csv``, ... and a run folder per direction and method)
publishes its combined tables, with the provenance its first run recorded completed by the
sweep's own record.

:func:`graft.results.benchmark_tables.write_benchmark_table` writes a benchmark's table
(``<name>.csv``) into a results folder with the same provenance, measured by the process
that calls it.

``provenance.json``::

    {"format": 1,
     "experiments": {"position": {"kind": "experiment", "files": {...}, "command": ...}},
     "benchmarks": {"paper_scale": {"kind": "benchmark", "files": {...}, ...}}}

Each entry's ``files`` maps a published file to its source (the run folder's file, or
``null`` for a benchmark's table); ``missing`` lists the fields the source did not record
(only with ``allow_incomplete``). See :func:`experiment_entry` for the other fields.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graft.errors import ResultsError, first_line
from graft.results.folder import RunFolder
from graft.results.provenance import command_line
from graft.results.record import RunRecord
from graft.results.run_config import CONFIG_FILE, read_config_file
from graft.results.run_reading import EXAMPLES_FILE, run_examples, run_tables, sweep_config
from graft.results.run_tables import (
    CONTRASTS_STEM,
    NAME_CONTRASTS_STEM,
    SUMMARY_STEM,
)
from graft.storage.failures import storage_errors
from graft.storage.files import atomic_path, utc_timestamp, write_json_atomic

logger = logging.getLogger(__name__)

PROVENANCE_FILE = "provenance.json"
FORMAT = 1
#: The tables every run folder may write, published as ``<name>_<stem>.csv``.
RUN_STEMS = (SUMMARY_STEM, CONTRASTS_STEM, NAME_CONTRASTS_STEM)
#: The table a finished sweep (``graft-exp patching``) writes instead of a summary.
SWEEP_STEM = "sweep"
#: Tables ``results/`` keeps under their own names (one experiment writes each).
KEPT_NAMES = ("top1_kinds", "lens_summary", "lens_top_tokens")
#: The fields of a run's ``config.json`` that say what computed it.
REQUIRED_FIELDS = (
    "command",
    "git_commit",
    "git_dirty",
    "packages",
    "machine",
    "created",
    "finetuned_models",
)
#: The fields of ``machine`` (:func:`graft.results.provenance.machine_info`) required.
MACHINE_FIELDS = ("cpu", "cpu_count", "torch_threads", "gpu")
#: The fields of a finetuned model's record required.
FINETUNE_FIELDS = ("seed", "machine", "versions")
#: The options recorded as the seeds of a run.
SEED_OPTIONS = ("seed", "data_seed", "data_seeds", "finetune_seeds", "control")
#: The options recorded as they are.
RUN_OPTIONS = (
    "model",
    "protocol",
    "preset",
    "n",
    "n_facts",
    "dataset",
    "templates",
    "head_policy",
    "dtype",
    "n_boot",
)


@dataclass
class Published:
    """What :func:`publish_run` did.

    Attributes:
        folder: the results folder.
        name: the name the run was published as.
        files: published file name -> the run folder's file it came from.
        missing: the provenance fields the run's config lacked (``allow_incomplete``).
        replaced: files of the results folder that no entry of its ``provenance.json``
            held (published before provenance existed) and that this publication replaced.
        removed: files the entry's earlier publication held and this one no longer does.
    """

    folder: Path
    name: str
    files: dict[str, str]
    missing: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """What was done, one line each: every file and its source, the notes, the entry."""
        lines = [f"{self.folder / file}  <- {source}" for file, source in self.files.items()]
        lines += [f"note: replaced {self.folder / f} (it had no provenance)" for f in self.replaced]
        lines += [
            f"note: removed {self.folder / f} (the earlier {self.name} held it)"
            for f in self.removed
        ]
        if self.missing:
            lines.append(f"note: recorded as missing: {', '.join(self.missing)}")
        return [*lines, f"provenance: {self.folder / PROVENANCE_FILE} ({self.name})"]


# ------------------------------------------------------------------ provenance of a run


def missing_fields(config: Mapping[str, Any]) -> list[str]:
    """The provenance fields ``config`` (a run's ``config.json``) lacks or records as
    unknown: top-level fields, ``machine.<field>``, and ``finetuned_models[PATH].<field>``."""
    missing: list[str] = []
    for name in REQUIRED_FIELDS:
        value = config.get(name)
        if value is None or (name in ("packages", "machine") and not isinstance(value, dict)):
            missing.append(name)
    machine = config.get("machine")
    if isinstance(machine, dict):
        for name in MACHINE_FIELDS:  # a CPU run records gpu as null: present, not missing
            if name not in machine or (name != "gpu" and machine[name] is None):
                missing.append(f"machine.{name}")
    finetuned = config.get("finetuned_models")
    if isinstance(finetuned, dict):
        for path, record in finetuned.items():
            record = record if isinstance(record, dict) else {}
            missing += [
                f"finetuned_models[{path}].{f}" for f in FINETUNE_FIELDS if record.get(f) is None
            ]
    return missing


def device_of(record: RunRecord) -> str:
    """The device a run computed on: its ``--device``, else ``cuda`` where its machine
    record names a GPU (recorded only for a CUDA device), else ``cpu``."""
    machine = record.machine or {}
    device = record.options.get("device") or ("cuda" if machine.get("gpu") else "cpu")
    return f"{device} ({machine['gpu']})" if machine.get("gpu") else str(device)


def experiment_entry(
    record: RunRecord, files: Mapping[str, str], source: str, missing: Sequence[str]
) -> dict[str, Any]:
    """The ``provenance.json`` entry of a run with the record ``record``.

    Fields: ``kind`` (``experiment``), ``experiment``, ``files`` (published -> source),
    ``source`` (the run folder), ``run_key``; what computed it: ``command``, ``git_commit``,
    ``git_dirty``, ``packages``, ``device``, ``machine``, ``engine``; when: ``created`` and
    ``resumes`` (each resume's time and what it changed, e.g. another machine); what it
    computed: ``model``, ``protocol``, ``preset``, ``n``, ``n_facts``, ``dataset``,
    ``templates``, ``head_policy``, ``dtype``, ``n_boot``, ``seeds`` (seed, data seed(s),
    finetune seeds, control), ``replicates`` (labels), ``grafts`` (names in run order), the
    donor ``pairs`` of a combined component run; ``finetuned_models`` (each donor's own
    record: preset, seed, data, device, machine, versions); ``published`` (when and by
    which command); ``missing`` (fields the config lacked)."""
    options = record.options
    entry: dict[str, Any] = {
        "kind": "experiment",
        "experiment": record.experiment,
        "files": dict(files),
        "source": source,
        "run_key": record.run_key or None,
        "command": record.command,
        "git_commit": record.git_commit,
        "git_dirty": record.git_dirty,
        "packages": record.packages,
        "device": device_of(record),
        "machine": record.machine,
        "engine": record.engine,
        "created": record.created,
        "resumes": list(record.resumes),
        **{name: options.get(name) for name in RUN_OPTIONS},
        "seeds": {name: options.get(name) for name in SEED_OPTIONS if name in options},
        "replicates": [r.label for r in record.replicates],
        "grafts": record.graft_names,
        "finetuned_models": record.finetuned_models,
        "published": {"time": utc_timestamp(), "command": command_line()},
        "missing": list(missing),
    }
    if record.pairs:
        entry["pairs"] = list(record.pairs)
    return entry


# ------------------------------------------------------------------ provenance.json


def read_provenance(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """``folder``'s ``provenance.json`` (an empty record when there is none).

    Raises:
        ResultsError: the file is not a provenance record.
    """
    path = Path(folder) / PROVENANCE_FILE
    if not path.is_file():
        return {"format": FORMAT, "experiments": {}, "benchmarks": {}}
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ResultsError(f"{path} is not readable JSON ({first_line(err, 200)})") from None
    if not isinstance(record, dict) or not isinstance(record.get("experiments", {}), dict):
        raise ResultsError(f"{path} is not a provenance record (no experiments object)")
    record.setdefault("format", FORMAT)
    record.setdefault("experiments", {})
    record.setdefault("benchmarks", {})
    return record


def provenance_entries(folder: str | os.PathLike[str]) -> list[tuple[str, dict[str, Any]]]:
    """``(name, entry)`` of every experiment, then every benchmark, of ``folder``."""
    record = read_provenance(folder)
    return [*record["experiments"].items(), *record["benchmarks"].items()]


def _owners(record: Mapping[str, Any]) -> dict[str, str]:
    """Published file -> ``kind:name`` of the entry that holds it."""
    owners = {}
    for kind in ("experiments", "benchmarks"):
        for name, entry in record.get(kind, {}).items():
            for file in entry.get("files", {}):
                owners[file] = f"{kind}:{name}"
    return owners


def _write_provenance(folder: Path, record: dict[str, Any]) -> Path:
    path = folder / PROVENANCE_FILE
    with storage_errors("the provenance record", path):
        return write_json_atomic(path, record)


def _copy(source: Path, target: Path) -> None:
    with storage_errors("a published table", target), atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)


# ------------------------------------------------------------------ publishing a run


def published_names(
    stems: Sequence[str], name: str, taken: Mapping[str, str], entry: str
) -> dict[str, str]:
    """stem -> published file name (the rules of this module's docstring). ``taken``: file
    -> the entry holding it; ``entry``: the entry being published (its own files are free)."""

    def free(file: str) -> bool:
        return taken.get(file, entry) == entry

    names: dict[str, str] = {}
    kept = {s: f"{s}.csv" for s in stems if s in KEPT_NAMES and free(f"{s}.csv")}
    own = name
    if any(f"{name}_{s}.csv" in kept.values() for s in stems if s in RUN_STEMS):
        own = f"{name}_run"
    for stem in stems:
        names[stem] = kept.get(stem) or f"{own if stem in RUN_STEMS else name}_{stem}.csv"
    return names


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "_-." for c in name) or name.startswith("."):
        raise ResultsError(
            f"cannot publish as {name!r}: use letters, digits, '_', '-' and '.'", param="name"
        )


def publish_run(
    run_folder: str | os.PathLike[str],
    to: str | os.PathLike[str],
    name: str | None = None,
    allow_incomplete: bool = False,
) -> Published:
    """Copy the CSV tables of the finished run in ``run_folder`` into the results folder
    ``to`` (named as this module's docstring says) and record the run's provenance there
    (:func:`experiment_entry`) under ``name`` (default: the run's experiment). Publishing
    under a name again replaces that entry and its files.

    Raises:
        ResultsError: ``run_folder`` is no finished run folder (no ``config.json`` or no
            ``summary.csv``); its config lacks provenance fields (:func:`missing_fields`;
            ``allow_incomplete`` publishes anyway and records them as missing); a file name
            is held by another entry of ``to``.
        StorageError: ``to`` cannot be written.
    """
    run, out = Path(run_folder), Path(to)
    if not (run / CONFIG_FILE).is_file() or not RunFolder(run).is_marked():
        raise ResultsError(f"{run} is not a run folder graft wrote (no {CONFIG_FILE} of a run)")
    config = sweep_config(run, read_config_file(run / CONFIG_FILE))
    run_record = RunRecord.from_json(config)
    finished = SWEEP_STEM if run_record.runs else SUMMARY_STEM
    if not (run / f"{finished}.csv").is_file():
        raise ResultsError(
            f"{run} holds no {finished}.csv: the run has not finished; rerun its command "
            "(it resumes), then publish"
        )
    if out.resolve() == run.resolve():
        raise ResultsError(f"{out} is the run folder itself; publish into another folder")
    name = name or run_record.experiment
    _check_name(name)
    missing = missing_fields(config)
    if missing and not allow_incomplete:
        raise ResultsError(
            f"{run / CONFIG_FILE} does not record {', '.join(missing)} (a run of an older "
            "graft): rerun it with this graft, or publish with --allow-incomplete to record "
            "them as missing"
        )
    record = read_provenance(out)
    key = f"experiments:{name}"
    owners = _owners(record)
    tables = run_tables(run, run_record)
    names = published_names(list(tables), name, owners, key)
    examples = run_examples(run, run_record)
    if examples is not None:
        names[EXAMPLES_FILE] = f"{name}_{EXAMPLES_FILE}"
    for file in names.values():
        if owners.get(file, key) != key:
            raise ResultsError(
                f"{out / file} is {owners[file].replace(':', ' ')}'s in {out / PROVENANCE_FILE}; "
                f"publish this run under another name (--as)"
            )
    if len(set(names.values())) != len(names):
        raise ResultsError(f"two tables of {run} would be published under one name: {names}")
    old_files = set(record["experiments"].get(name, {}).get("files", {}))
    replaced = sorted(f for f in names.values() if f not in owners and (out / f).exists())
    removed = sorted(old_files - set(names.values()))
    with storage_errors("the results folder", out):
        out.mkdir(parents=True, exist_ok=True)
    sources: dict[str, str] = {}
    for stem, file in names.items():
        if stem == EXAMPLES_FILE and examples is not None:
            with storage_errors("the per-prompt rows", out / file), atomic_path(out / file) as tmp:
                examples[0].write_parquet(tmp, compression="zstd", compression_level=19)
            sources[file] = examples[1]
            continue
        table = tables[stem]
        if isinstance(table, Path):
            _copy(table, out / file)
            sources[file] = table.name
        else:
            with storage_errors("a published table", out / file), atomic_path(out / file) as tmp:
                table.write_csv(tmp)
            own = (run / f"{stem}.csv").is_file()  # its checked table, or the pairs'
            sources[file] = f"{stem}.csv" if own else f"{{{','.join(run_record.pairs)}}}/{stem}.csv"
    for file in removed:
        (out / file).unlink(missing_ok=True)
    record["experiments"][name] = experiment_entry(run_record, sources, str(run), missing)
    _write_provenance(out, record)
    return Published(out, name, sources, list(missing), replaced, removed)
