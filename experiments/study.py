"""``graft-exp study plan|run|status|collect|submit FILE``: models x finetune seeds x experiments x
options from one TOML file (docs/how-to/study.md; submit: docs/how-to/cluster-study.md)."""

from __future__ import annotations

import click

from graft_experiments import common
from graft_experiments.command import OneLineError

FILE = click.argument("file", type=click.Path(exists=True, dir_okay=False))


@click.group(short_help="A study from one TOML file: plan, run, status, collect, submit.")
def study():
    """A study: every model x finetune seed x experiment of one TOML file is one run, in
    <out>/<model>/seed<S>/<experiment> (see docs/how-to/study.md). A bad file is refused
    with one line (exit 2) before anything is written."""


@study.command(cls=common.GraftCommand, short_help="Every run's plan and the donors they share.")
@FILE
def plan(file):
    """Print the plan of every run of FILE, the donors they share (each finetuned once), a
    rough finetune time and the memory each run needs; nothing is loaded or written."""
    from graft.study import plan_study, read_study

    for line in plan_study(read_study(file)).lines():
        click.echo(line)


@study.command(cls=common.GraftCommand, short_help="Run the donors, then every run (resumable).")
@FILE
@common.quiet_option()
def run(file, quiet):
    """Finetune the donors FILE's runs need (each once), then run every run; a run already
    (partly) done resumes. A failed run does not stop the others: each is listed at the
    end, and the command then exits 1."""
    from graft.study import read_study, run_study

    done = run_study(read_study(file), echo=click.echo)
    if not done.ok:
        raise OneLineError(done.failure_line(), 1)


@study.command(cls=common.GraftCommand, short_help="Per run: done, partial, failed, not started.")
@FILE
def status(file):
    """Print where each run of FILE stands, read from its run folder: done, partial (some
    batches stored), failed (its last attempt) or not started; after a submit, SLURM's
    state of each of its jobs too. Nothing is written."""
    from graft.study import read_study, slurm_status_lines, status_lines, study_status

    study_ = read_study(file)
    for line in status_lines(study_status(study_)) + slurm_status_lines(study_):
        click.echo(line)


@study.command(cls=common.GraftCommand, short_help="One table, provenance and figures.")
@FILE
def collect(file):
    """Collect every finished run of FILE into <out>/collected: summary.csv and
    summary.parquet (every run's summary rows with model, finetune_seed and experiment
    added), provenance.json (each run folder and what computed it) and figures/ (per
    experiment, acc@5 per graft with one marker per finetune seed, a panel per model)."""
    from graft.study import collect_study, read_study

    for line in collect_study(read_study(file)).lines():
        click.echo(line)


@study.command(cls=common.GraftCommand, short_help="Submit it to SLURM: donor jobs, a run array.")
@FILE
@click.option(
    "--rerun-failed",
    is_flag=True,
    help="Submit only the runs not done (failed or never finished), and the donors they lack.",
)
def submit(file, rerun_failed):
    """Submit FILE to SLURM with sbatch: one job per donor to finetune (each once), then
    every run as one job array that starts when the donors succeeded (afterok). Memory and
    a donor's time come from the plan; a [slurm] table in FILE (partition, account, cpus,
    mem, time, extra, python) overrides them. Scripts, logs and job ids go in <out>/slurm
    (see docs/how-to/cluster-study.md); follow with graft-exp study status FILE."""
    from graft.study import read_study, submit_study

    for line in submit_study(read_study(file), rerun_failed=rerun_failed).lines():
        click.echo(line)


if __name__ == "__main__":
    common.standalone(study)
