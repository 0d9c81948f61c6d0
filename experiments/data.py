"""``graft-exp data``: generate one of the paper's movie-fact datasets (thin over graft.study.data)."""

from __future__ import annotations

from pathlib import Path

import click

from experiments.common import data_seed_option, n_facts_option, workspace_option
from graft.study.data import (
    DIRECTIONS,
    KINDS,
    DatasetConfig,
    DatasetError,
    default_dataset_name,
    generate_dataset,
    load_manifest,
)
from graft.study.finetune import default_workspace

_OPTION_OF = {
    "kind": "--dataset",
    "n_facts": "--n-facts",
    "direction": "--direction",
    "facts_path": "--facts",
    "corpus_path": "--corpus",
}


@click.command("data")
@click.option(
    "--dataset",
    "kind",
    type=click.Choice(KINDS),
    default=None,
    help="Data kind to generate [default: fake_movies_real_actors, or custom with --facts].",
)
@n_facts_option()
@data_seed_option("seed")
@click.option(
    "--direction",
    type=click.Choice(DIRECTIONS),
    default="one",
    show_default=True,
    help="one: first_actor always first; both: also the swapped renderings.",
)
@click.option(
    "--split/--no-split", default=False, show_default=True, help="Two disjoint sets A and B."
)
@click.option(
    "--facts",
    "facts_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Your own facts (CSV/JSONL: movie_title, first_actor, second_actor [+ metadata]).",
)
@click.option(
    "--corpus",
    "corpus_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Extra text corpus (one document per line, or JSONL with 'text').",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Output folder [default: <workspace>/datasets/<kind>-<direction>[-split]-n<N>-"
    "seed<S>, where experiments given the same --dataset, --n-facts and --data-seed read it].",
)
@workspace_option()
@click.option("--overwrite", is_flag=True, help="Replace an existing, different dataset at --out.")
def data(
    kind: str | None,
    n_facts: int | None,
    seed: int,
    direction: str,
    split: bool,
    facts_path: Path | None,
    corpus_path: Path | None,
    out: Path | None,
    workspace: str | None,
    overwrite: bool,
) -> None:
    """Generate a movie-fact dataset: facts, training text, test prompts, manifest."""
    if kind is None:
        kind = "custom" if facts_path is not None else "fake_movies_real_actors"
    config = DatasetConfig(
        kind=kind,
        n_facts=n_facts,
        seed=seed,
        direction=direction,
        split=split,
        facts_path=facts_path,
        corpus_path=corpus_path,
    )
    if out is None:
        out = Path(workspace or default_workspace()) / "datasets" / default_dataset_name(config)
    try:
        path = generate_dataset(config, out, overwrite=overwrite)
    except DatasetError as e:
        if e.param == "out":
            raise click.UsageError(str(e)) from None
        raise click.BadParameter(str(e), param_hint=_OPTION_OF.get(e.param or "")) from None
    sizes = load_manifest(path)["sizes"]
    click.echo(
        f"{path}: {sizes['facts']} facts, {sizes['train']} training texts, "
        f"{sizes['test_prompts']} test prompts"
    )
