"""What publishing reads of a finished run folder: its record completed for a sweep (the
first run's donors, options and the provenance of its rows), its CSV tables (a combined
component run's pairs' tables joined) and its per-prompt rows (a sweep's runs' joined, with
a ``run`` column), each checked against the marks its folder recorded."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from graft.results.record import RunRecord
from graft.results.run_config import CONFIG_FILE, read_config_file
from graft.results.run_tables import (
    CONTRASTS_STEM,
    NAME_CONTRASTS_STEM,
    check_recorded_tables,
    read_recorded,
)

#: A run's per-prompt rows, published as ``<name>_examples.parquet`` (zstd).
EXAMPLES_FILE = "examples.parquet"


def _pair_tables(run: Path, record: RunRecord, stem: str) -> pl.DataFrame | None:
    """A combined component run's ``stem`` table over its pairs' run folders (as text,
    so every number is copied as written), or None when no pair has one."""
    files = [run / p / f"{stem}.csv" for p in record.pairs]
    frames = [pl.read_csv(f, infer_schema_length=0) for f in files if f.is_file()]
    return pl.concat(frames, how="diagonal_relaxed") if frames else None


#: What a sweep's first run records of the computation of its rows, which the sweep's own
#: record (written with its tables, perhaps by a later call at another commit) must not hide.
ROWS_PROVENANCE = (
    "packages",
    "git_commit",
    "git_dirty",
    "machine",
    "command",
    "created",
    "resumes",
)


def sweep_config(run: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (``run``'s ``config.json``), and for a sweep (``graft-exp patching``: its
    ``runs`` are run folders inside ``run``) completed with what its first run recorded and
    the sweep's record lacks: the donors' records, the options, the dataset; and what
    computed the rows (:data:`ROWS_PROVENANCE`: commit, packages, machine, command, when,
    and each resume, e.g. the call that wrote the tables) taken from that first run."""
    runs = config.get("runs") or []
    first = run / str(runs[0]) / CONFIG_FILE if runs else None
    if first is None or not first.is_file():
        return dict(config)
    merged = read_config_file(first)
    rows = {k: merged[k] for k in ROWS_PROVENANCE if merged.get(k) is not None}
    merged.update({k: v for k, v in config.items() if v is not None})
    merged.update(rows)
    return merged


def run_tables(run: Path, record: RunRecord) -> dict[str, Path | pl.DataFrame]:
    """The CSV tables of the run folder ``run``: stem -> file (or a frame: the pairs' tables
    of a combined component run, a mirror that differs from its table in a folder this user
    may not write). A mirror's table, and the pairs' or a sweep's runs', whose marks differ
    is refused (:func:`~graft.results.run_tables.check_recorded_tables`)."""
    stale = check_recorded_tables(run)
    for folder in (run / p for p in (*record.pairs, *record.runs)):
        if folder.is_dir():
            check_recorded_tables(folder)
    tables: dict[str, Path | pl.DataFrame] = {
        p.stem: stale.get(p.stem, p) for p in sorted(run.glob("*.csv")) if p.name[0] != "."
    }
    for stem in (CONTRASTS_STEM, NAME_CONTRASTS_STEM):
        if stem not in tables and record.pairs:
            combined = _pair_tables(run, record, stem)
            if combined is not None:
                tables[stem] = combined
    return tables


def run_examples(run: Path, record: RunRecord) -> tuple[pl.DataFrame, str] | None:
    """The per-prompt rows of the run folder ``run`` (its ``examples.parquet``; of a
    component run's pairs or a sweep's runs, each folder's, with a ``run`` column for a
    sweep), each checked against its folder's record, and where they came from, or None
    where it has none."""
    parts = list(record.runs or record.pairs)
    if not parts:
        own = run / EXAMPLES_FILE
        return (read_recorded(own), EXAMPLES_FILE) if own.is_file() else None
    frames = [
        read_recorded(run / p / EXAMPLES_FILE).with_columns(pl.lit(p).alias("run"))
        if record.runs
        else read_recorded(run / p / EXAMPLES_FILE)
        for p in parts
        if (run / p / EXAMPLES_FILE).is_file()
    ]
    if not frames:
        return None
    return pl.concat(frames, how="diagonal_relaxed"), f"{{{','.join(parts)}}}/{EXAMPLES_FILE}"
