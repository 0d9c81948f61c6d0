"""``graft-exp data``: generate one of the paper's movie-fact datasets, or a dataset of your
own facts (``--facts``), articles (``--articles``) or facts of any relation (``--relation``)
(thin over graft.study.data.datasets)."""

from __future__ import annotations

from pathlib import Path

import click

from graft.errors import DatasetError
from graft.study import DatasetConfig, ExperimentConfig
from graft_experiments import command, common
from graft_experiments.options import DATASET_FLAGS


@click.command("data", cls=command.LoggingCommand)
@common.with_options([common.field_option(DatasetConfig, name) for name in DATASET_FLAGS])
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Output folder [default: <workspace>/datasets/<kind>[-pairs]-<direction>[-split]-n<N>-"
    "seed<S>, where experiments given the same --dataset, --n-facts, --data-seed and --shuffle "
    "read it; "
    "with --articles: <workspace>/datasets/articles-<file>-<sha256[:8]>-n<N|all>; "
    "with --relation: <workspace>/datasets/relation-<name>-<sha256[:8]>-n<N|all>].",
)
@common.field_option(ExperimentConfig, "workspace")
@click.option("--overwrite", is_flag=True, help="Replace an existing, different dataset at --out.")
def data(out: Path | None, workspace: str | None, overwrite: bool, **fields) -> None:
    """Generate a dataset: facts (or your articles), training text, test prompts, manifest."""
    from graft.study import Workspace, dataset_line, generate_dataset

    config = DatasetConfig.inferred(**fields)
    try:
        out = out or Workspace.at(workspace or None).dataset_folder(config)
        path = generate_dataset(config, out, overwrite=overwrite)
    except DatasetError as e:
        if e.param == "out":
            raise click.UsageError(command.in_user_words(e)) from None
        raise click.BadParameter(command.in_user_words(e), param_hint=command.flag_of(e)) from None
    click.echo(dataset_line(path))


if __name__ == "__main__":
    common.standalone(data)
