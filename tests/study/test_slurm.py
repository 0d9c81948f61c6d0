"""A study submitted to SLURM (graft.study.studies.slurm, .task): the sbatch scripts (a job
per donor to finetune, the runs as one array after them), the ``[slurm]`` table's checks and
the job states, with a fake sbatch; then, slow, a tiny study on a REAL single-node SLURM
(scripts/slurm/start.sh installs and starts it; skipped, with its one-line reason, only
where apt-get cannot install slurm-wlm and munge): 2 tiny models x 2 seeds x 3 experiments,
a job per donor (4), one array of the 12 runs depending on them all, one task failing for real (a file where its run folder goes), ``--rerun-failed`` resubmitting
it alone, and the collected table equal by content to the same file run here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

import graft.study.studies.slurm as slurm
import graft.study.studies.task as task
from graft.errors import InputError
from graft.study import (
    collect_study,
    read_study,
    run_study,
    study_status,
    submit_study,
)
from graft.study.studies import study_runs
from tests.study.study_files import TINY_OPTIONS, TINY_STUDY, tree, write_study

ROOT = Path(__file__).resolve().parents[2]
ONE = (
    'models = ["tiny-llama"]\nfinetune_seeds = [0]\nexperiments = ["position", "necessity"]\n'
    'workspace = "ws"\nout = "runs"\n' + TINY_OPTIONS
)
MIB = 2**20


def _fake_plan(study, finished=(False, True)):
    """A plan of 3 runs over 2 donors (the first needed by runs 0 and 1, the second by 2)."""
    folders = [study.workspace / "d0", study.workspace / "d1"]
    donors = {
        f: SimpleNamespace(plan=SimpleNamespace(finished=done, seconds=600.0, needed=3000 * MIB))
        for f, done in zip(folders, finished, strict=True)
    }
    runs = [
        SimpleNamespace(run=SimpleNamespace(name=f"m/seed0/e{i}"), donors=[folders[i // 2]])
        for i in range(3)
    ]
    for i, run in enumerate(runs):
        run.needed = (i + 1) * 1000 * MIB
    return SimpleNamespace(donors=donors, runs=runs)


class FakeSbatch:
    """Records each script and answers job ids 101, 102, ..."""

    def __init__(self):
        self.scripts: list[str] = []

    def __call__(self, script: Path) -> str:
        self.scripts.append(script.read_text())
        return str(100 + len(self.scripts))


def _options(text: str) -> list[str]:
    return re.findall(r"^#SBATCH (.*)$", text, flags=re.M)


@pytest.fixture
def faked(tmp_path, monkeypatch):
    study = read_study(write_study(tmp_path, ONE))
    monkeypatch.setattr(slurm, "plan_study", lambda s: _fake_plan(s, (False, False)))
    return study


def test_a_job_per_donor_then_one_array_after_them(faked):
    sbatch = FakeSbatch()
    done = submit_study(faked, submit=sbatch, show=None)
    assert done.donors == {"101": str(faked.workspace / "d0"), "102": str(faked.workspace / "d1")}
    assert done.array == "103" and done.tasks == {0: "m/seed0/e0", 1: "m/seed0/e1", 2: "m/seed0/e2"}
    logs = faked.out / "slurm" / "logs"
    donor, _, runs = (_options(s) for s in sbatch.scripts)
    # the donor's plan: 3000 MiB x 1.25 + 2048; 600 s x 2 + 10 min
    assert donor == [
        "--job-name=graft-study-donor0",
        f"--output={logs}/donor0-%j.out",
        "--mem=5798M",
        "--time=30",
    ]
    assert runs == [
        "--job-name=graft-study-runs",
        f"--output={logs}/run%a-%A.out",
        "--array=0-2",
        "--mem=5798M",  # the most any of its runs needs
        "--dependency=afterok:101:102",
    ]
    file = faked.path.resolve()
    assert sbatch.scripts[0].endswith(f"-m graft.study.studies.task {file} donor 0\n")
    assert sbatch.scripts[2].endswith(
        f'-m graft.study.studies.task {file} run "$SLURM_ARRAY_TASK_ID"\n'
    )
    assert 'OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"' in sbatch.scripts[2]
    assert sorted(p.name for p in (faked.out / "slurm").iterdir()) == [
        "1-donor0.sbatch",
        "1-donor1.sbatch",
        "1-runs.sbatch",
        "jobs.json",
        "logs",
    ]
    record = json.loads((faked.out / "slurm" / "jobs.json").read_text())
    (sub,) = record["submissions"]
    assert [d["job"] for d in sub["donors"]] == ["101", "102"] and sub["runs"]["job"] == "103"
    assert done.lines()[-1] == "array job 103: 3 runs (0-2), after 101, 102"


def test_the_slurm_table_wins_over_the_plan(tmp_path, monkeypatch):
    table = (
        '\n[slurm]\npartition = "gpu"\naccount = "lab"\ncpus = 4\nmem = "8G"\ntime = "1:00:00"\n'
        'extra = ["--gres=gpu:1", "--qos=high"]\npython = "/opt/venv/bin/python"\n'
    )
    study = read_study(write_study(tmp_path, ONE + table))
    monkeypatch.setattr(slurm, "plan_study", lambda s: _fake_plan(s))
    sbatch = FakeSbatch()
    done = submit_study(study, submit=sbatch, show=None)
    assert list(done.donors) == ["101"]  # the second donor is finetuned already
    assert _options(sbatch.scripts[1])[2:] == [
        "--array=0-2",
        "--mem=8G",
        "--time=1:00:00",
        "--cpus-per-task=4",
        "--partition=gpu",
        "--account=lab",
        "--gres=gpu:1",
        "--qos=high",
        "--dependency=afterok:101",
    ]
    assert "exec /opt/venv/bin/python -m graft.study.studies.task" in sbatch.scripts[1]


def test_rerun_failed_submits_only_the_runs_not_done(faked, monkeypatch):
    state = {"m/seed0/e0": "done", "m/seed0/e1": "failed", "m/seed0/e2": "done"}
    monkeypatch.setattr(slurm, "run_status", lambda run, _f: SimpleNamespace(state=state[run.name]))
    monkeypatch.setattr(slurm, "plan_study", lambda s: _fake_plan(s, (True, False)))
    sbatch = FakeSbatch()
    done = submit_study(faked, rerun_failed=True, submit=sbatch, show=None)
    assert not done.donors and done.tasks == {1: "m/seed0/e1"}  # its donor is finetuned
    assert "--array=1" in _options(sbatch.scripts[0])
    assert not any(o.startswith("--dependency") for o in _options(sbatch.scripts[0]))
    state["m/seed0/e1"] = "done"
    nothing = submit_study(faked, rerun_failed=True, submit=sbatch, show=None)
    assert nothing.array is None and len(sbatch.scripts) == 1
    assert nothing.lines()[0].startswith("every run is done: nothing submitted")


SHOW = {
    "101": "JobId=101 JobName=d JobState=COMPLETED Reason=None ExitCode=0:0\n",
    "103": (
        "JobId=104 ArrayJobId=103 ArrayTaskId=0 JobState=FAILED ExitCode=1:0\n"
        "JobId=103 ArrayJobId=103 ArrayTaskId=1-2%2 JobState=PENDING ExitCode=0:0\n"
    ),
}


def test_status_says_slurms_state_of_each_job_and_a_live_study_is_not_submitted(faked):
    assert slurm.slurm_status_lines(faked, show=SHOW.get) == []  # nothing submitted
    submit_study(faked, submit=FakeSbatch(), show=None)
    lines = slurm.slurm_status_lines(faked, show=SHOW.get)
    assert lines[1:] == [
        "  1: donor 0: job 101: COMPLETED (exit 0:0)",
        "  1: donor 1: job 102: no longer known to SLURM",
        "  1: run m/seed0/e0: job 103_0: FAILED (exit 1:0)",
        "  1: run m/seed0/e1: job 103_1: PENDING (exit 0:0)",
        "  1: run m/seed0/e2: job 103_2: PENDING (exit 0:0)",
    ]
    (line,) = slurm.slurm_status_lines(faked, show=None)
    assert "scontrol is not here" in line
    with pytest.raises(
        InputError, match=r"2 jobs of .* are still queued or running \(103_1, 103_2\)"
    ):
        submit_study(faked, rerun_failed=True, submit=FakeSbatch(), show=SHOW.get)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("queue = 'x'", "[slurm] has no key 'queue'; the keys are partition, account"),
        ("cpus = 0", "[slurm] cpus = 0: give, say, 4"),
        ("cpus = true", "[slurm] cpus = True"),
        ("mem = 'lots'", "[slurm] mem = 'lots': give, say, \"16G\""),
        ("time = 'soon'", "[slurm] time = 'soon'"),
        ("extra = ['gres=gpu:1']", "[slurm] extra = ['gres=gpu:1']"),
        ("partition = 3", "[slurm] partition = 3"),
        ("python = ''", "[slurm] python = ''"),
    ],
)
def test_a_bad_slurm_table_is_one_line_naming_the_key(tmp_path, table, message):
    with pytest.raises(InputError) as caught:
        read_study(write_study(tmp_path, ONE + "\n[slurm]\n" + table + "\n"))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_task_runs_its_run_with_the_library_and_says_a_bad_index(tmp_path, monkeypatch, capsys):
    path = write_study(tmp_path, ONE)
    ran = []
    monkeypatch.setattr(task, "run_one", lambda study, run, echo: (ran.append(run.name), None))
    assert task.main([str(path), "run", "1"]) == 0 and ran == ["tiny-llama/seed0/necessity"]
    monkeypatch.setattr(task, "run_one", lambda study, run, echo: (None, "RuntimeError: no"))
    assert task.main([str(path), "run", "0"]) == 1
    assert task.main([str(path), "run", "2"]) == 2
    assert task.main([str(path), "banana", "0"]) == 2
    assert task.main([str(path)]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert errors[0] == f"Error: {path} has 2 runs; no index 2 (the file changed?)"
    assert errors[1].startswith("Error: a task is one of donor, run") and "usage" in errors[2]
    assert tree(tmp_path) == ["study.toml"]


# --- a real SLURM ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def real_slurm(request):
    """scripts/slurm/start.sh: a single-node SLURM on this machine (installed if missing)."""
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "slurm" / "start.sh")], capture_output=True, text=True
    )
    said = done.stdout.strip().splitlines()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"scripts/slurm/start.sh ({time.monotonic() - started:.0f} s):")
        for line in said:
            reporter.write_line(f"  {line}")
    if done.returncode == 3:  # apt-get could not install the packages (or not root)
        why = f"no SLURM here: {said[-1] if said else done.stderr.strip()[:200]}"
        if os.environ.get("GRAFT_REQUIRE_SLURM") == "1":  # CI (scripts/test.sh): never skip
            pytest.fail(why)
        pytest.skip(why)
    assert done.returncode == 0, done.stdout + done.stderr


def _wait(jobs: list[str], seconds: float = 600.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i", "-j", ",".join(jobs)], capture_output=True, text=True
        )
        if out.returncode == 0 and not out.stdout.strip():
            return
        time.sleep(2)
    subprocess.run(["scancel", *jobs])
    pytest.fail(f"jobs {jobs} still queued or running after {seconds:g} s")


def _table(study) -> pl.DataFrame:
    table = collect_study(study).table.drop("run_folder")
    return table.sort(table.columns)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_tiny_study_on_a_real_slurm_equals_the_same_study_run_here(tmp_path, real_slurm):
    """The study of the local tests (2 tiny models x 2 finetune seeds x 3 experiments): a job
    per donor (4), one array of the 12 runs after all of them, one task failing for real and
    resubmitted alone, and the collected table equal by content to the file run here."""
    study = read_study(write_study(tmp_path / "cluster", TINY_STUDY))
    # a real failure for one array task: a file where its run folder goes
    blocker = study.out / "tiny-gpt2" / "seed1" / "necessity"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("in the way")
    done = submit_study(study)
    names = [run.name for run in study_runs(study)]
    assert len(done.donors) == 4 and done.tasks == dict(enumerate(names)) and len(names) == 12
    blocked = names.index("tiny-gpt2/seed1/necessity")
    shown = slurm.scontrol_show(done.array or "") or ""
    assert "ArrayTaskId=0-11" in shown, shown
    assert all(f"afterok:{donor}" in shown for donor in done.donors), shown
    # the same file run here, into folders of its own, while SLURM works
    local = read_study(write_study(tmp_path / "local", TINY_STUDY))
    assert run_study(local).ok
    _wait([*done.donors, done.array or ""])
    states = {s.run.name: s.state for s in study_status(study)}
    assert states == {name: "failed" if name == names[blocked] else "done" for name in names}
    lines = slurm.slurm_status_lines(study)
    assert sum(": COMPLETED (exit 0:0)" in line and "donor" in line for line in lines) == 4
    assert f"  1: run {names[blocked]}: job {done.array}_{blocked}: FAILED (exit 1:0)" in lines
    blocker.unlink()
    again = submit_study(study, rerun_failed=True)
    assert not again.donors and again.tasks == {blocked: names[blocked]}
    _wait([again.array or ""])
    assert {s.state for s in study_status(study)} == {"done"}
    assert f"  2: run {names[blocked]}: job {again.array}_{blocked}: COMPLETED (exit 0:0)" in (
        slurm.slurm_status_lines(study)
    )
    logs = {p.name for p in (study.out / "slurm" / "logs").iterdir()}
    first, second = done.array, again.array
    assert logs == {
        *(f"donor{i}-{donor}.out" for i, donor in enumerate(done.donors)),
        *(f"run{i}-{first}.out" for i in range(12)),
        f"run{blocked}-{second}.out",
    }
    cluster, here = _table(study), _table(local)
    assert cluster.height > 0 and cluster.columns == here.columns
    assert cluster.equals(here), (cluster, here)  # values, not only shapes
    assert shutil.which("squeue")
