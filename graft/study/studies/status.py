"""Where each run of a study stands, read from its run folders: ``done`` (every run of its
design wrote its summary, as the runner does last), ``partial`` (a run folder graft started:
its config or some batches), ``failed`` (its last attempt failed, ``study_failures.json``,
and it is not done) or ``not started``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graft.results.folder import RunFolder
from graft.results.run_tables import PARTS_DIR, SUMMARY_STEM
from graft.study.studies.execute import read_failures
from graft.study.studies.runs import StudyRun, study_runs
from graft.study.studies.study_file import Study

#: The states of a run, in the order a report counts them.
STATES = ("done", "partial", "failed", "not started")


@dataclass(frozen=True)
class RunStatus:
    """Where a run of a study stands.

    Args:
        run: the run.
        state: one of :data:`STATES`.
        detail: what of it is there (finished runs of its design, stored batches), or the
            error of its last attempt.
    """

    run: StudyRun
    state: str
    detail: str = ""

    def line(self) -> str:
        return f"{self.run.name}: {self.state}" + (f" ({self.detail})" if self.detail else "")


def _batches(folder: Path) -> int:
    parts = folder / PARTS_DIR
    return sum(1 for _ in parts.rglob("*.parquet")) if parts.is_dir() else 0


def run_status(run: StudyRun, failures: dict[str, str]) -> RunStatus:
    """Where ``run`` stands (``failures``: :func:`~graft.study.studies.execute.read_failures`)."""
    folders = run.run_folders()
    finished = [n for n, f in folders.items() if (f / f"{SUMMARY_STEM}.parquet").is_file()]
    if len(finished) == len(folders):
        return RunStatus(run, "done", str(run.folder))
    if run.name in failures:
        return RunStatus(run, "failed", failures[run.name])
    started = [f for f in folders.values() if RunFolder(f).is_marked()]
    if started:
        batches = sum(_batches(f) for f in started)
        pieces = f"{len(finished)} of {len(folders)} runs finished, " if len(folders) > 1 else ""
        return RunStatus(run, "partial", f"{pieces}{batches} batches stored")
    return RunStatus(run, "not started")


def study_status(study: Study) -> list[RunStatus]:
    """Where each run of ``study`` stands, in run order; nothing is written."""
    failures = read_failures(study)
    return [run_status(run, failures) for run in study_runs(study)]


def status_lines(statuses: list[RunStatus]) -> list[str]:
    """One line per run, then the count of each state."""
    counts = {s: sum(1 for x in statuses if x.state == s) for s in STATES}
    total = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    return [*(s.line() for s in statuses), f"study: {len(statuses)} runs: {total}"]
