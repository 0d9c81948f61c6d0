"""``graft-exp plot``: redraw a run's figures from its saved results."""

from __future__ import annotations

import click

from experiments.common import GraftCommand
from graft.results.report import draw_figures


@click.command(cls=GraftCommand)
@click.argument("run_folder", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--metric",
    default="acc@5",
    show_default=True,
    help="acc@1, acc@5, acc@10, acc@50, mean_rank, median_rank or mean_prob.",
)
def plot(run_folder, metric):
    """Redraw the figures of RUN_FOLDER without recomputing: PNG and PDF under
    RUN_FOLDER/figures, named after the metric (e.g. position_qa_mean_rank.png), so the
    figures of several metrics live side by side."""
    try:
        paths = draw_figures(run_folder, metric)
    except (FileNotFoundError, ValueError) as err:
        raise click.UsageError(str(err)) from None
    for png in paths:
        click.echo(f"figure: {png}")
