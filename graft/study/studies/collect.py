"""A study's results in one place, ``<out>/collected/``: every finished run's summary rows
in one table (``summary.csv``, ``summary.parquet``) with the columns ``model``,
``finetune_seed``, ``experiment`` (and ``run``: the design's run, ``run_folder``) in front,
a ``provenance.json`` naming each run folder with what computed it (its command, commit,
machine, options: :func:`graft.results.publish.experiment_entry`), and a figure per
experiment across models and seeds (:mod:`graft.study.studies.figures`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from graft.errors import ResultsError
from graft.results.publish import experiment_entry, missing_fields
from graft.results.record import read_run_record
from graft.results.run_tables import SUMMARY_STEM
from graft.storage.failures import storage_errors
from graft.storage.files import atomic_path, utc_timestamp, write_json_atomic
from graft.storage.tables import write_csv
from graft.study.studies.execute import read_failures
from graft.study.studies.figures import draw_study_figures
from graft.study.studies.runs import study_runs
from graft.study.studies.status import run_status
from graft.study.studies.study_file import Study

#: The folder, in the study's ``out``, that :func:`collect_study` writes.
COLLECTED = "collected"
#: The columns that say which run a row came from, in front of the summary's own.
RUN_COLUMNS = ("model", "finetune_seed", "experiment", "run", "run_folder")


@dataclass
class Collected:
    """What :func:`collect_study` wrote.

    Args:
        folder: ``<out>/collected``.
        table: every finished run's summary rows, :data:`RUN_COLUMNS` in front.
        files: name -> path of each file written (tables, provenance, figures).
        missing: the runs not finished (their rows are not in the table), by name.
    """

    folder: Path
    table: pl.DataFrame
    files: dict[str, Path] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """What was collected, one line each: the rows, every file, the runs left out."""
        return [
            f"collected {self.table.height} rows into {self.folder}",
            *(f"{name}: {path}" for name, path in self.files.items()),
            *(f"not finished (left out): {name}" for name in self.missing),
        ]


def collect_study(study: Study) -> Collected:
    """Collect the finished runs of ``study`` into ``<out>/collected/`` (see the module
    docstring); runs not finished are left out and named.

    Raises:
        ResultsError: no run of the study has finished.
    """
    frames, entries, missing = [], [], []
    failures = read_failures(study)
    for run in study_runs(study):
        if run_status(run, failures).state != "done":
            missing.append(run.name)
            continue
        for name, folder in run.run_folders().items():
            columns = [run.model, run.finetune_seed, run.experiment, name, str(folder)]
            front = [pl.lit(v).alias(c) for c, v in zip(RUN_COLUMNS, columns, strict=True)]
            summary = pl.read_parquet(folder / f"{SUMMARY_STEM}.parquet")
            frames.append(summary.drop(RUN_COLUMNS, strict=False).select(*front, pl.all()))
            entries.append(_entry(run.name, name, folder))
    if not frames:
        raise ResultsError(
            f"no run of {study.path} has finished yet; run it first (graft-exp study run)"
        )
    out = Collected(study.out / COLLECTED, pl.concat(frames, how="diagonal_relaxed"))
    out.missing = missing
    with storage_errors("the collected tables", out.folder):
        out.folder.mkdir(parents=True, exist_ok=True)
    out.files["summary.csv"] = write_csv(out.table, out.folder / f"{SUMMARY_STEM}.csv")
    parquet = out.folder / f"{SUMMARY_STEM}.parquet"
    with storage_errors("the collected table", parquet), atomic_path(parquet) as tmp:
        out.table.write_parquet(tmp)
    out.files["summary.parquet"] = parquet
    record = {
        "study": str(study.path.resolve()),
        "collected": utc_timestamp(),
        "runs": entries,
        "not_finished": missing,
    }
    out.files["provenance.json"] = write_json_atomic(out.folder / "provenance.json", record)
    for png in draw_study_figures(out.table, out.folder / "figures"):
        out.files[png.name] = png
    return out


def _entry(study_run: str, name: str, folder: Path) -> dict[str, Any]:
    """The provenance of one run folder: the study's run, the design's run, and the
    entry ``graft-exp publish`` would record of it."""
    record = read_run_record(folder)
    entry = experiment_entry(record, {}, str(folder), missing_fields(record.raw))
    return {"study_run": study_run, "run": name, "folder": str(folder), **entry}
