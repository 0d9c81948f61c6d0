"""Studies: models x finetune seeds x experiments x options from one TOML file, the highest
room of graft.study (each run is a design of :mod:`graft.study.designs`, run by its one
function).

- ``study_file``: :class:`Study` and :func:`read_study` (every key checked first);
- ``kinds``: the experiments a study lists, each a design function and its options;
- ``runs``: each (model, finetune seed, experiment) as its design and run folder;
- ``plan``: :func:`plan_study`: the runs' plans and the donors they share, nothing written;
- ``execute``: :func:`run_study`: the donors once each, then every run, failures recorded;
- ``status``: :func:`study_status`: done, partial, failed or not started, per run;
- ``collect``: :func:`collect_study`: one table, its provenance, the figures;
- ``figures``: a metric per graft, one marker per seed, one panel per model;
- ``slurm``: :func:`submit_study`: a job per donor, then the runs as one SLURM job array;
- ``task``: one of those jobs (``python -m graft.study.studies.task FILE donor|run INDEX``).
"""

from graft.study.studies.collect import COLLECTED, Collected, collect_study
from graft.study.studies.execute import FAILURES_FILE, StudyResult, run_study
from graft.study.studies.plan import StudyPlan, plan_study
from graft.study.studies.runs import StudyRun, study_runs
from graft.study.studies.slurm import Submission, slurm_status_lines, submit_study
from graft.study.studies.status import STATES, RunStatus, status_lines, study_status
from graft.study.studies.study_file import Study, read_study

__all__ = [
    "COLLECTED",
    "FAILURES_FILE",
    "STATES",
    "Collected",
    "RunStatus",
    "Study",
    "StudyPlan",
    "StudyResult",
    "StudyRun",
    "Submission",
    "collect_study",
    "plan_study",
    "read_study",
    "run_study",
    "slurm_status_lines",
    "status_lines",
    "study_runs",
    "study_status",
    "submit_study",
]
