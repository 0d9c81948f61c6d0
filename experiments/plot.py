"""``graft-exp plot``: redraw a run's figures from its saved results."""

from __future__ import annotations

import click

from graft.errors import StorageError
from graft_experiments import common

#: How the error of a figure that cannot be written begins (graft.results.plots' save_figure).
FIGURE_WRITE = "cannot write the figure"

#: ``--metric``: a column of a run's summary (``plot`` and ``compare`` share it).
METRIC_OPTION = click.option(
    "--metric",
    default="acc@5",
    show_default=True,
    help="A metric of the run's summary: acc@1, acc@5, acc@10, acc@50, mean_rank, "
    "median_rank, mean_prob or mean_logprob (compare: an acc@k).",
)


@click.command(cls=common.GraftCommand)
@click.argument("run_folder", type=click.Path(exists=True, file_okay=False))
@METRIC_OPTION
@click.option(
    "--figures-dir",
    "fig_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Draw into this folder instead of RUN_FOLDER/figures (e.g. for a read-only run).",
)
def plot(run_folder, metric, fig_dir):
    """Redraw the figures of RUN_FOLDER without recomputing: PNG and PDF under
    RUN_FOLDER/figures, named after the metric (e.g. position_qa_mean_rank.png), so the
    figures of several metrics live side by side (--figures-dir: another folder). A lens run's lens
    figures (median rank and mean log-probability per layer) are redrawn too. The run's CSV
    mirrors are checked against its tables first (an edited one is rewritten, with a
    warning)."""
    from graft.study import draw_run_figures

    # a GraftError (an unknown metric, a damaged table, a full disk) is the command's one
    # line (graft_experiments.command.cli_error); a folder that is no finished run is a usage error
    try:
        paths = draw_run_figures(run_folder, metric, fig_dir)
    except FileNotFoundError as err:
        raise click.UsageError(str(err)) from None
    except StorageError as err:
        if fig_dir is not None or not str(err).startswith(FIGURE_WRITE):
            raise
        # a figure that cannot be written here (a full disk, a read-only run)
        raise StorageError(f"{err}; or draw the figures elsewhere: --figures-dir FOLDER") from None
    for png in paths:
        click.echo(f"figure: {png}")


if __name__ == "__main__":
    common.standalone(plot)
