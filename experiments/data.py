"""``graft-exp data``: generate one of the paper's movie-fact datasets, or a dataset of your
own facts (``--facts``), articles (``--articles``) or facts of any relation (``--relation``)
(thin over graft.study.data.datasets)."""

from __future__ import annotations

from pathlib import Path

import click

from graft.errors import DatasetError
from graft.study import DatasetConfig, ExperimentConfig
from graft_experiments import command, common
from graft_experiments.options import DATASET_FLAGS, field_default


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
    from graft.study import Workspace, generate_dataset, load_manifest

    if fields["kind"] is None:
        kind = "relation" if fields["relation_path"] is not None else None
        kind = kind or ("articles" if fields["articles_path"] is not None else None)
        kind = kind or ("custom" if fields["facts_path"] is not None else None)
        fields["kind"] = kind or field_default(DatasetConfig, "kind")
    config = DatasetConfig(**fields)
    try:
        out = out or Workspace.at(workspace or None).dataset_folder(config)
        path = generate_dataset(config, out, overwrite=overwrite)
    except DatasetError as e:
        if e.param == "out":
            raise click.UsageError(command.in_user_words(e)) from None
        raise click.BadParameter(command.in_user_words(e), param_hint=command.flag_of(e)) from None
    sizes = load_manifest(path)["sizes"]
    what = "articles" if config.kind == "articles" else "facts"
    click.echo(
        f"{path}: {sizes['facts']} {what}, {sizes['train']} training texts, "
        f"{sizes['test_prompts']} test prompts"
    )


if __name__ == "__main__":
    common.standalone(data)
