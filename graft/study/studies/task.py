"""One job of a study submitted to SLURM (:mod:`graft.study.studies.slurm`): a donor's
finetune or one run, with the code :func:`~graft.study.studies.execute.run_study` runs for
it, so that a job does exactly what ``graft-exp study run`` does for that piece::

    python -m graft.study.studies.task STUDY_FILE donor K   # the plan's K-th donor
    python -m graft.study.studies.task STUDY_FILE run I     # the I-th run, in run order

Exit 0 when it is done, 1 when it failed (its error recorded like a local run's, in
``<out>/study_failures.json``, and said in the job's log), 2 for a bad file or index.
"""

from __future__ import annotations

import sys

from graft.errors import InputError
from graft.study.studies.execute import make_donor, run_one
from graft.study.studies.plan import plan_study
from graft.study.studies.runs import study_runs
from graft.study.studies.study_file import read_study

#: What a task may be.
TASKS = ("donor", "run")


def run_task(file: str, kind: str, index: int) -> int:
    """Run the ``index``-th donor or run of the study in ``file``; return the exit code.

    Raises:
        InputError: a bad file, kind or index.
    """
    study = read_study(file)
    if kind not in TASKS:
        raise InputError(f"a task is one of {', '.join(TASKS)}, got {kind!r}")
    if kind == "donor":
        donors = list(plan_study(study).donors.values())
        _check(index, len(donors), "donors", file)
        return 0 if make_donor(study, donors[index], print) is None else 1
    runs = study_runs(study)
    _check(index, len(runs), "runs", file)
    _result, error = run_one(study, runs[index], print)
    if error is None:
        print(f"run {runs[index].name}: done")
    return 0 if error is None else 1


def _check(index: int, count: int, what: str, file: str) -> None:
    if not 0 <= index < count:
        raise InputError(f"{file} has {count} {what}; no index {index} (the file changed?)")


def main(argv: list[str] | None = None) -> int:
    """``python -m graft.study.studies.task FILE donor|run INDEX``."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) != 3 or not args[2].isdigit():
            raise InputError("usage: python -m graft.study.studies.task FILE donor|run INDEX")
        return run_task(args[0], args[1], int(args[2]))
    except InputError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
