"""A benchmark's table in a ``results/`` folder, with the provenance
:mod:`graft.results.publish` records for runs (``provenance.json``, entry
``benchmarks.<name>``), measured by the process that writes it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from graft.errors import ResultsError
from graft.results.provenance import git_commit, git_dirty, machine_info, package_versions
from graft.results.publish import (
    _check_name,
    _owners,
    _write_provenance,
    read_provenance,
)
from graft.storage.failures import storage_errors
from graft.storage.files import atomic_path, utc_timestamp


def machine_label(machine: Mapping[str, Any]) -> str:
    """A machine in a few words: the GPU's name, else ``<n>-core <CPU model>``."""
    if machine.get("gpu"):
        return str(machine["gpu"])
    return f"{machine.get('cpu_count')}-core {machine.get('cpu')}"


def write_benchmark_table(
    out: str | os.PathLike[str],
    name: str,
    table: pl.DataFrame | Sequence[Mapping[str, Any]],
    command: str,
    device: Any = None,
    settings: Mapping[str, Any] | None = None,
) -> Path:
    """Write a benchmark's table as ``out/<name>.csv`` and its provenance into
    ``out/provenance.json`` (entry ``benchmarks.<name>``): ``command`` (the benchmark's
    command line), the git commit and dirtiness of graft's checkout, package versions,
    ``device``, this process's machine (:func:`~graft.results.provenance.machine_info`),
    ``created``, and ``settings`` (the benchmark's own: prompts, batch size, ...). Return
    the CSV's path.

    Raises:
        ResultsError: ``<name>.csv`` is held by an experiment entry of ``out``.
        StorageError: ``out`` cannot be written.
    """
    _check_name(name)
    out = Path(out)
    frame = table if isinstance(table, pl.DataFrame) else pl.DataFrame([dict(r) for r in table])
    file = f"{name}.csv"
    record = read_provenance(out)
    key = f"benchmarks:{name}"
    owner = _owners(record).get(file, key)
    if owner != key:
        raise ResultsError(f"{out / file} is {owner.replace(':', ' ')}'s; choose another name")
    machine = machine_info(device)
    # the checkout as the benchmark ran it: before this table changes a tracked file
    commit, dirty = git_commit(), git_dirty()
    with storage_errors("a benchmark table", out / file):
        out.mkdir(parents=True, exist_ok=True)
        with atomic_path(out / file) as tmp:
            frame.write_csv(tmp)
    record["benchmarks"][name] = {
        "kind": "benchmark",
        "files": {file: None},
        "command": command,
        "git_commit": commit,
        "git_dirty": dirty,
        "packages": package_versions(),
        "device": f"cuda ({machine['gpu']})" if machine.get("gpu") else str(device or "cpu"),
        "machine": machine,
        "created": utc_timestamp(),
        "settings": dict(settings or {}),
        "missing": [],
    }
    _write_provenance(out, record)
    return out / file
