"""Running a study: its donors first, each once, then every run with the one runner (each
resumable); a run that fails is recorded (``<out>/study_failures.json``) and the others
still run.

Donors come first, from the study's plan (:func:`graft.study.running.donor_job.run_donor_job`),
rather than by the first run that needs one: a donor that cannot be trained then fails
once, with its own error, and the runs that need it are recorded as failed without trying
it again; and each run's time is its grafting alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from graft.errors import first_line
from graft.storage.failures import storage_errors
from graft.storage.files import write_json_atomic
from graft.storage.locks import exclusive
from graft.study.designs.design import DesignRun, run_design
from graft.study.running.donor_job import run_donor_job
from graft.study.studies.plan import Donor, plan_study
from graft.study.studies.runs import StudyRun
from graft.study.studies.study_file import Study

#: The file, in the study's ``out`` folder, of the runs whose last attempt failed.
FAILURES_FILE = "study_failures.json"


@dataclass
class StudyResult:
    """What :func:`run_study` did.

    Args:
        study: the study.
        runs: run name (``<model>/seed<S>/<experiment>``) -> what it produced, for each run
            that finished.
        failed: run name -> its error, its whole first line, for each run that failed.
        donors: donor folder -> its error, for each donor that could not be finetuned.
    """

    study: Study
    runs: dict[str, DesignRun] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    donors: dict[Path, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed

    def failure_line(self) -> str:
        """How many runs failed and which, and the way on (one line)."""
        return (
            f"{len(self.failed)} of {len(self.failed) + len(self.runs)} runs failed "
            f"({', '.join(self.failed)}); fix them and run again (finished runs are kept)"
        )


def read_failures(study: Study) -> dict[str, str]:
    """Run name -> error of the runs whose last attempt failed (empty without a record)."""
    path = study.out / FAILURES_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in record.items()} if isinstance(record, dict) else {}


def _error(err: Exception) -> str:
    """``err`` as its type and its whole first line: never cut, since graft's messages end
    with their fix (a weak donor's ``allow_weak_donor``, say)."""
    return f"{type(err).__name__}: {first_line(err)}"


def run_study(study: Study, echo: Callable[[str], None] | None = None) -> StudyResult:
    """Finetune the donors ``study`` lacks (each once), then run each run with
    :func:`~graft.study.designs.design.run_design` (resuming a run folder that holds part
    of it). A failing donor or run is recorded and said, and the next run goes on; the
    record is ``<out>/study_failures.json`` (a run that finishes later leaves it).

    Raises:
        InputError: the study's runs cannot be made (before anything is written).
    """
    say = echo or (lambda _line: None)
    plan = plan_study(study)
    done = StudyResult(study)
    for folder, donor in plan.donors.items():
        if donor.plan.finished:
            continue
        error = make_donor(study, donor, echo)
        if error is not None:
            done.donors[folder] = error
    for run_plan in plan.runs:
        run = run_plan.run
        missing = [d for d in run_plan.donors if d in done.donors]
        cause = f"its donor {missing[0]} failed: {done.donors[missing[0]]}" if missing else ""
        result, error = run_one(study, run, echo, cause)
        if error is None:
            done.runs[run.name] = result  # type: ignore[assignment]
        else:
            done.failed[run.name] = error
    say(
        f"study: {len(done.runs)} runs done, {len(done.failed)} failed"
        + "".join(f"\n  failed: {name}: {error}" for name, error in done.failed.items())
    )
    return done


def make_donor(study: Study, donor: Donor, echo: Callable[[str], None] | None = None) -> str | None:
    """Finetune ``donor`` into the study's workspace (as it is, if finished); return its
    error in one line, said, or None (a SLURM donor job runs this too)."""
    say = echo or (lambda _line: None)
    say(f"donor: {donor.plan.folder}")
    try:
        quiet = not study.options.get("progress", True)
        run_donor_job(donor.request, str(study.workspace), quiet=quiet)
    except Exception as err:  # recorded, said; the runs that need it are skipped
        say(f"donor failed: {donor.plan.folder}: {_error(err)}")
        return _error(err)
    return None


def run_one(
    study: Study, run: StudyRun, echo: Callable[[str], None] | None = None, cause: str = ""
) -> tuple[DesignRun | None, str | None]:
    """Run ``run`` (resuming its folder); its outcome goes into ``<out>/study_failures.json``
    (a failure recorded, a success clearing it). Return what it produced, or its error in one
    line (``cause``: a reason not to try, as the error). A SLURM array task runs this too."""
    say = echo or (lambda _line: None)
    say(f"run {run.name} -> {run.folder}")
    error, result = (f"not run: {cause}" if cause else None), None
    if error is None:
        try:
            result = run_design(run.design, echo=echo)
        except Exception as err:  # one run's failure must not stop the others
            error = _error(err)
    if error is not None:
        say(f"run failed: {run.name}: {error}")
        record_outcome(study, run.name, error)
        return None, error
    record_outcome(study, run.name, None)
    return result, None


def record_outcome(study: Study, name: str, error: str | None) -> None:
    """Record run ``name``'s failure (``error``) or clear it (None) in
    ``<out>/study_failures.json``, under the workspace's lock: the array tasks of a SLURM
    study end at once."""
    path = study.out / FAILURES_FILE
    if error is None and name not in read_failures(study):
        return  # only this run's own task writes its name
    with exclusive(path, "recording a study's failures", study.workspace / ".locks"):
        failures = read_failures(study)
        if error is None and name not in failures:
            return
        if error is None:
            failures.pop(name)
        else:
            failures[name] = error
        with storage_errors("the study's failures", path):
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, failures)
