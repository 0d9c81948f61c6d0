"""``graft-exp data``: generate one of the paper's movie-fact datasets (thin over graft.data)."""

from __future__ import annotations

from pathlib import Path

import click

from graft.data import (
    DEFAULT_N_FACTS,
    DIRECTIONS,
    KINDS,
    DatasetConfig,
    DatasetError,
    default_dataset_name,
    generate_dataset,
    load_manifest,
)

_OPTION_OF = {
    "kind": "--kind",
    "n_facts": "--n-facts",
    "direction": "--direction",
    "facts_path": "--facts",
    "corpus_path": "--corpus",
}


@click.command("data")
@click.option(
    "--kind",
    type=click.Choice(KINDS),
    default=None,
    help="Dataset kind [default: fake_movies_real_actors, or custom with --facts].",
)
@click.option(
    "--n-facts",
    type=int,
    default=None,
    help=f"Facts per set [default: {DEFAULT_N_FACTS}; every usable row with --facts].",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seeds Faker and every shuffle."
)
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
    help="Output folder [default: runs/data/<kind>-<direction>[-split]-n<N>-seed<S>].",
)
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
    out = out if out is not None else Path("runs/data") / default_dataset_name(config)
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
