"""``graft-exp compare``: two grafts of a finished run, prompt by prompt."""

from __future__ import annotations

import click

from graft.study import ExperimentConfig
from graft_experiments import common
from graft_experiments.options import field_option
from graft_experiments.plot import METRIC_OPTION


@click.command(
    cls=common.GraftCommand,
    sections={"n_boot": "Options"},
    short_help="Paired tests of two grafts of a finished run, per template.",
)
@click.argument("run_folder", type=click.Path(exists=True, file_okay=False))
@click.argument("graft_a")
@click.argument("graft_b")
@METRIC_OPTION
@click.option(
    "--score",
    default="target_logprob",
    show_default=True,
    help="Per-prompt score compared (paired bootstrap interval, Wilcoxon signed-rank p): "
    "target_logprob, target_rank "
    "or target_prob (name_logprob in a run with --score-full-name).",
)
@field_option(ExperimentConfig, "n_boot")
def compare(run_folder, graft_a, graft_b, metric, score, n_boot):
    """Compare GRAFT_A with GRAFT_B (names as in the run's summary, e.g. FE+LT and SFT) on
    the prompts both scored in RUN_FOLDER, per template (and donor pair): both accuracies,
    their difference (A minus B) with Newcombe's paired 95% interval, the exact McNemar
    test (b: prompts only A hits, c: only B hits), and the score difference with a paired
    bootstrap 95% interval (bootstrap seed 0) and the Wilcoxon signed-rank p-value over the
    prompts (of their means over seeds in a replicated run). p-values are Holm-adjusted over
    the templates. --metric acc@k (or hit@k) picks the accuracy; in a run with
    --score-full-name, --metric name_exact --score name_logprob compare whole names."""
    from graft.results import compare_run, format_comparison

    table = compare_run(run_folder, graft_a, graft_b, metric, score, n_boot=n_boot)
    click.echo(format_comparison(table))


if __name__ == "__main__":
    common.standalone(compare)
