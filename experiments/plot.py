"""``graft-exp plot``: redraw a run's figures from its saved results."""

from __future__ import annotations

from pathlib import Path

import click

from graft.results import draw_figures
from graft.study import LENS_SUMMARY, draw_lens_figures
from graft_experiments.common import GraftCommand, standalone

#: ``--metric``: a column of a run's summary (``plot`` and ``compare`` share it).
METRIC_OPTION = click.option(
    "--metric",
    default="acc@5",
    show_default=True,
    help="A metric of the run's summary: acc@1, acc@5, acc@10, acc@50, mean_rank, "
    "median_rank, mean_prob or mean_logprob (compare: an acc@k).",
)


@click.command(cls=GraftCommand)
@click.argument("run_folder", type=click.Path(exists=True, file_okay=False))
@METRIC_OPTION
def plot(run_folder, metric):
    """Redraw the figures of RUN_FOLDER without recomputing: PNG and PDF under
    RUN_FOLDER/figures, named after the metric (e.g. position_qa_mean_rank.png), so the
    figures of several metrics live side by side. A lens run's lens figures (median rank and
    mean log-probability per layer) are redrawn too."""
    # a GraftError (an unknown metric, a damaged table, a full disk) is the command's one
    # line (graft_experiments.common.cli_error); a folder that is no finished run is a usage error
    try:
        paths = draw_figures(run_folder, metric)
        if (Path(run_folder) / f"{LENS_SUMMARY}.parquet").is_file():
            paths += draw_lens_figures(run_folder)
    except FileNotFoundError as err:
        raise click.UsageError(str(err)) from None
    for png in paths:
        click.echo(f"figure: {png}")


if __name__ == "__main__":
    standalone(plot)
