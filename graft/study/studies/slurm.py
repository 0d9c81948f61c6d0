"""A study on a cluster, through SLURM's ``sbatch``: one job per donor to finetune (each
once: the plan's shared donors), then every run as ONE job array that starts after them
(``--dependency=afterok:...``), each array task running its one run with the library
(:mod:`graft.study.studies.task`, the code :func:`run_study` runs). Resources come from the
plan (memory, a donor's time with a margin), over which the study file's ``[slurm]`` table
wins. ``<out>/slurm/`` holds the scripts (``<N>-donor<K>.sbatch``, ``<N>-runs.sbatch`` for
submission N), ``logs/`` (one per job and array task) and ``jobs.json`` (every submission's
job ids); ``rerun_failed`` submits only the runs not done, with the donors they lack.

SLURM's state of a job comes from ``scontrol show job`` while SLURM still knows the job;
afterwards the runs' own folders say what was done (:func:`study_status`).
"""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graft.errors import InputError
from graft.storage.failures import storage_errors
from graft.storage.files import utc_timestamp, write_json_atomic
from graft.study.studies.execute import read_failures
from graft.study.studies.plan import plan_study
from graft.study.studies.status import run_status
from graft.study.studies.study_file import Study

#: The folder, in the study's ``out``, of its scripts, logs and job ids.
SLURM_DIR = "slurm"
#: The record of every submission's job ids, in :data:`SLURM_DIR`.
JOBS_FILE = "jobs.json"
#: SLURM job states of a job that has not ended.
LIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")
#: What a job asks for over the plan's memory: Python, torch and the tables (MiB).
MEM_OVERHEAD_MIB = 2048
#: A donor job's time limit: the plan's rough finetune time x this, plus :data:`TIME_EXTRA_MIN`.
TIME_MARGIN = 2.0
TIME_EXTRA_MIN = 10

#: Submits an sbatch script, returns its job id (:func:`sbatch`; tests pass their own).
Submit = Callable[[Path], str]
#: ``scontrol show job -o JOB``'s output, or None where SLURM does not know the job.
Show = Callable[[str], "str | None"]


def sbatch(script: Path) -> str:
    """Submit ``script`` with ``sbatch --parsable``; return the job id.

    Raises:
        InputError: no ``sbatch`` here, or sbatch refused the script (its first line).
    """
    if shutil.which("sbatch") is None:
        raise InputError(
            "sbatch is not on PATH here: submit from a SLURM login node, or run the study "
            "on this machine (graft-exp study run)"
        )
    done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or "no message").splitlines()[0]
        raise InputError(f"sbatch refused {script}: {said}")
    return done.stdout.strip().split(";")[0]


def scontrol_show(job: str) -> str | None:
    """``scontrol show job -o JOB`` (None: SLURM no longer knows it)."""
    done = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 and done.stdout.strip() else None


@dataclass
class Submission:
    """What :func:`submit_study` submitted.

    Args:
        number: the submission's number in ``jobs.json`` (1 for the first).
        donors: donor job id -> the donor's folder.
        array: the array job's id (None: nothing left to run).
        tasks: array index -> run name (the index of the run in the study's run order).
        scripts: the sbatch scripts written.
    """

    number: int
    donors: dict[str, str] = field(default_factory=dict)
    array: str | None = None
    tasks: dict[int, str] = field(default_factory=dict)
    scripts: list[Path] = field(default_factory=list)

    def lines(self) -> list[str]:
        if self.array is None:
            return ["every run is done: nothing submitted (graft-exp study collect FILE)"]
        out = [f"donor job {job}: {folder}" for job, folder in self.donors.items()]
        after = f", after {', '.join(self.donors)}" if self.donors else ""
        out.append(f"array job {self.array}: {len(self.tasks)} runs ({_ranges(self.tasks)}){after}")
        return out


def jobs_path(study: Study) -> Path:
    return study.out / SLURM_DIR / JOBS_FILE


def read_jobs(study: Study) -> list[dict[str, Any]]:
    """Every submission recorded in ``<out>/slurm/jobs.json`` (none: empty)."""
    try:
        record = json.loads(jobs_path(study).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return list(record.get("submissions", [])) if isinstance(record, dict) else []


def submit_study(
    study: Study,
    rerun_failed: bool = False,
    submit: Submit = sbatch,
    show: Show | None = scontrol_show,
) -> Submission:
    """Submit ``study`` to SLURM (see the module docstring); ``rerun_failed``: only the runs
    not done. ``show`` (None: do not ask SLURM) finds jobs of the study still queued or
    running first: then nothing is submitted.

    Raises:
        InputError: the study's jobs still run, or sbatch refused a script (those submitted
            before it are recorded).
    """
    submissions = read_jobs(study)
    if show is not None:
        live = [j for j in _states(submissions, show) if j[1] in LIVE]
        if live:
            raise InputError(
                f"{len(live)} jobs of {study.path} are still queued or running "
                f"({', '.join(j[0] for j in live[:5])}); wait for them or scancel them first"
            )
    plan = plan_study(study)
    failures = read_failures(study)
    indices = [
        i
        for i, p in enumerate(plan.runs)
        if not rerun_failed or run_status(p.run, failures).state != "done"
    ]
    done = Submission(len(submissions) + 1)
    if not indices:
        return done
    folder = study.out / SLURM_DIR
    with storage_errors("the study's SLURM scripts", folder):
        (folder / "logs").mkdir(parents=True, exist_ok=True)
    needed = {d for i in indices for d in plan.runs[i].donors}
    record: dict[str, Any] = {"submitted": utc_timestamp(), "rerun_failed": rerun_failed}
    record["donors"] = []
    submissions.append(record)
    for k, (where, donor) in enumerate(plan.donors.items()):
        if where not in needed or donor.plan.finished:
            continue
        minutes = math.ceil(donor.plan.seconds * TIME_MARGIN / 60) + TIME_EXTRA_MIN
        script = folder / f"{done.number}-donor{k}.sbatch"
        options = _options(study, donor.plan.needed, minutes)
        _write(script, _script(study, f"donor{k}", options, f"donor {k}", f"donor{k}-%j.out"))
        job = submit(script)
        done.donors[job], done.scripts = str(where), [*done.scripts, script]
        record["donors"].append(
            {"job": job, "index": k, "folder": str(where), "script": str(script)}
        )
        _record(study, submissions)
    done.tasks = {i: plan.runs[i].run.name for i in indices}
    options = _options(study, max(plan.runs[i].needed for i in indices), None)
    options.insert(0, f"--array={_ranges(done.tasks)}")
    if done.donors:
        options.append(f"--dependency=afterok:{':'.join(done.donors)}")
    script = folder / f"{done.number}-runs.sbatch"
    task = 'run "$SLURM_ARRAY_TASK_ID"'
    _write(script, _script(study, "runs", options, task, "run%a-%A.out"))
    done.array, done.scripts = submit(script), [*done.scripts, script]
    record["runs"] = {"job": done.array, "tasks": done.tasks, "script": str(script)}
    _record(study, submissions)
    return done


def _options(study: Study, needed: int, minutes: int | None) -> list[str]:
    """sbatch options of a job needing ``needed`` bytes (and ``minutes``), ``[slurm]`` over."""
    mine = study.slurm
    mem = mine.get("mem", math.ceil(needed * 1.25 / 2**20) + MEM_OVERHEAD_MIB)
    out = [f"--mem={mem}M" if isinstance(mem, int) else f"--mem={mem}"]
    time = mine.get("time", minutes)
    if time is not None:
        out.append(f"--time={time}")
    for key, option in (("cpus", "cpus-per-task"), ("partition", "partition")):
        if key in mine:
            out.append(f"--{option}={mine[key]}")
    if "account" in mine:
        out.append(f"--account={mine['account']}")
    return [*out, *mine.get("extra", [])]


def _script(study: Study, name: str, options: list[str], task: str, log: str) -> str:
    logs = study.out / SLURM_DIR / "logs"
    head = [f"--job-name=graft-{study.path.stem}-{name}", f"--output={logs / log}", *options]
    python = study.slurm.get("python", sys.executable)
    return "\n".join(
        [
            "#!/bin/bash",
            *(f"#SBATCH {line}" for line in head),
            f"# written by graft-exp study submit for {study.path.resolve()}",
            "set -eu",
            'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
            f"cd {shlex.quote(str(study.path.resolve().parent))}",
            f"exec {shlex.quote(python)} -m graft.study.studies.task "
            f"{shlex.quote(str(study.path.resolve()))} {task}",
            "",
        ]
    )


def _write(script: Path, text: str) -> None:
    with storage_errors("an sbatch script", script):
        script.write_text(text, encoding="utf-8")


def _record(study: Study, submissions: list[dict[str, Any]]) -> None:
    path = jobs_path(study)
    with storage_errors("the study's job ids", path):
        write_json_atomic(path, {"study": str(study.path.resolve()), "submissions": submissions})


def _ranges(tasks: dict[int, str] | list[int]) -> str:
    """``0-3,5``: the indices as sbatch's ``--array`` takes them."""
    parts: list[str] = []
    for i in sorted(tasks):
        if parts and parts[-1].split("-")[-1] == str(i - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{i}"
        else:
            parts.append(str(i))
    return ",".join(parts)


def _indices(text: str) -> list[int]:
    """The array indices ``0-2,5%2`` names."""
    out: list[int] = []
    for part in text.split("%")[0].split(","):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


def _states(submissions: list[dict[str, Any]], show: Show) -> list[tuple[str, str, str]]:
    """(job, SLURM state, exit code) of every job and array task SLURM still knows."""
    out = []
    jobs = [d["job"] for s in submissions for d in s.get("donors", [])]
    jobs += [s["runs"]["job"] for s in submissions if "runs" in s]
    for job in jobs:
        for line in (show(str(job)) or "").splitlines():
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            state, code = fields.get("JobState", "?"), fields.get("ExitCode", "?")
            if "ArrayTaskId" in fields:
                for i in _indices(fields["ArrayTaskId"]):
                    out.append((f"{fields['ArrayJobId']}_{i}", state, code))
            elif "JobId" in fields:
                out.append((fields["JobId"], state, code))
    return out


def slurm_status_lines(study: Study, show: Show | None = scontrol_show) -> list[str]:
    """SLURM's state of each job of ``study``'s submissions (jobs.json), one a line; none
    without jobs.json; one line where ``scontrol`` is not here (``show`` None)."""
    submissions = read_jobs(study)
    if not submissions:
        return []
    if show is None or (show is scontrol_show and shutil.which("scontrol") is None):
        return [
            f"SLURM: {len(submissions)} submissions in {jobs_path(study)}, but scontrol is not "
            "here to ask their state; the runs' states above are read from their folders"
        ]
    known = {job: (state, code) for job, state, code in _states(submissions, show)}
    out = [f"SLURM jobs ({jobs_path(study)}):"]
    for n, sub in enumerate(submissions, 1):
        named = [(f"donor {d['index']}", str(d["job"])) for d in sub.get("donors", [])]
        if "runs" in sub:
            array = sub["runs"]
            named += [(f"run {name}", f"{array['job']}_{i}") for i, name in array["tasks"].items()]
        for what, job in named:
            state, code = known.get(job, ("no longer known to SLURM", ""))
            out.append(f"  {n}: {what}: job {job}: {state}" + (f" (exit {code})" if code else ""))
    return out
