"""``graft-exp publish``: copy a finished run's tables into a results/ folder, with their
provenance."""

from __future__ import annotations

import click

from graft_experiments import common


@click.command(
    cls=common.GraftCommand,
    short_help="Copy a run's tables into results/NAME with their provenance.",
)
@click.argument("run_folder", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--to",
    "to",
    required=True,
    type=click.Path(file_okay=False),
    help="The results folder, e.g. results/smollm2-cpu-seeds012 (created when missing).",
)
@click.option(
    "--as",
    "name",
    default=None,
    help="Publish under this name (file prefix and provenance entry) instead of the run's "
    "experiment, e.g. tokens_paper.",
)
@click.option(
    "--allow-incomplete",
    is_flag=True,
    help="Publish a run whose config.json lacks provenance fields (an older graft), "
    "recording them as missing.",
)
def publish(run_folder, to, name, allow_incomplete):
    """Copy the tables of the finished run in RUN_FOLDER into the results folder --to:
    summary.csv and contrasts.csv as <experiment>_summary.csv and <experiment>_contrasts.csv
    (the layout benchmarks.paper_table and benchmarks.results_tables read), the run's other
    CSV tables beside them, and the run's provenance into provenance.json there: command,
    git commit and dirtiness, package versions, device and machine (CPU, threads, GPU),
    creation and resume dates, seeds, n, model, protocol, and the finetuned donors' own
    records. Several experiments (position, component, necessity of one set of runs) may be
    published into one folder; publishing under a name again replaces that entry."""
    from graft.results import publish_run

    for line in publish_run(run_folder, to, name, allow_incomplete=allow_incomplete).lines():
        click.echo(line)


if __name__ == "__main__":
    common.standalone(publish)
