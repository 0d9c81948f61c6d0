"""The flag tables of the commands that run no experiment's runs: ``graft-exp data``
(:class:`~graft.study.specs.config.DatasetConfig`) and ``graft-exp attribution``
(:class:`~graft.study.specs.attribution.AttributionRequest`), keyed by field name as
:data:`graft_experiments.options.FLAGS` (which holds them) is."""

from __future__ import annotations

from pathlib import Path

import click

from graft.core import ATTRIBUTION_METRICS, COUNT, ESTIMATORS, SEED
from graft.study import DEFAULT_N_FACTS, DIRECTIONS, KINDS, SHUFFLES
from graft_experiments.click_types import Flag, VerifyCount, number_type

#: flags the experiments share with ``graft-exp data`` (and ``graft-exp finetune``)
N_FACTS = Flag(
    "--n-facts",
    f"Facts per set of a generated dataset [default: {DEFAULT_N_FACTS}; data --facts: every "
    "usable row].",
    number_type(COUNT),
)
DATA_SEED = Flag(
    "--data-seed", "Seed of a generated dataset (Faker and every shuffle).", number_type(SEED)
)
SHUFFLE = Flag(
    "--shuffle",
    "How real_movies_shuffled shuffles the real casts: relations (the paper's text: each "
    "title gets two actors who never starred together) or pairs (the authors' dataset code: "
    "each real co-star pair kept together and moved to another real movie).",
    click.Choice(SHUFFLES),
)
DATASET_FLAGS: dict[str, Flag] = {
    "kind": Flag(
        "--dataset",
        "Data kind to generate [default: fake_movies_real_actors, custom with --facts, "
        "articles with --articles, relation with --relation].",
        click.Choice(KINDS),
        default=None,
    ),
    "n_facts": N_FACTS,
    "seed": DATA_SEED,
    "direction": Flag(
        "--direction",
        "one: first_actor always first; both: also the swapped renderings.",
        click.Choice(DIRECTIONS),
    ),
    "split": Flag("--split/--no-split", "Two disjoint sets A and B.", extra={"show_default": True}),
    "facts_path": Flag(
        "--facts",
        "Your own facts (CSV/JSONL: movie_title, first_actor, second_actor [+ metadata]).",
        click.Path(dir_okay=False, path_type=Path),
    ),
    "corpus_path": Flag(
        "--corpus",
        "Extra text corpus (one document per line, or JSONL with 'text').",
        click.Path(dir_okay=False, path_type=Path),
    ),
    "shuffle": SHUFFLE,
    "articles_path": Flag(
        "--articles",
        "Your own articles (JSONL: article, rephrases, questions with prompt, answer, "
        "first_entity; see docs/how-to/your-facts.md): the real-text dataset.",
        click.Path(dir_okay=False, path_type=Path),
    ),
    "relation_path": Flag(
        "--relation",
        "Facts of any relation (TOML: facts = CSV/JSONL of subject, object; train templates; "
        "[test] templates ending with {object}; see docs/how-to/your-facts.md; the movie "
        "datasets' own: graft/resources/relations/movies*.toml).",
        click.Path(dir_okay=False, path_type=Path),
    ),
}

ATTRIBUTION_FLAGS: dict[str, Flag] = {
    "base": Flag("--base-model", "Base model: name or folder."),
    "donor": Flag(
        "--donor-model", "Donor (finetuned) model: name or folder.", extra={"required": True}
    ),
    "texts": Flag("--text", "A prompt (repeat for more).", extra={"multiple": True}),
    "targets": Flag(
        "--target",
        "The target after each prompt, e.g. ' Tracey Childs' (its first token is scored): "
        "one per --text, or one for all.",
        extra={"multiple": True},
    ),
    "dataset": Flag(
        "--dataset",
        "Instead of --text/--target/--entity: a dataset folder (graft-exp data, "
        "WS/datasets/NAME), whose stored test prompts of --template (forward direction) are "
        "taken with their targets and first entities.",
        click.Path(file_okay=False),
    ),
    "template": Flag(
        "--template",
        "With --dataset: the test template whose prompts are taken, or several "
        "comma-separated (headline,qa,movie).",
    ),
    "n_prompts": Flag(
        "--n-prompts",
        "With --dataset: the first N prompts of each template, in file order [default: all].",
        number_type(COUNT),
    ),
    "entity": Flag(
        "--entity",
        "The first entity in each prompt (a substring), the FE unit: one per --text.",
        extra={"multiple": True},
    ),
    "kinds": Flag(
        "--kind",
        "Module kinds as specs name them (repeat) [default: q k v qkv o attn mlp].",
        default=(),
        extra={"multiple": True},
    ),
    "metric": Flag(
        "--measure",
        "What is estimated: the target's first-token log-prob, or its raw logit.",
        click.Choice(ATTRIBUTION_METRICS),
    ),
    "estimator": Flag(
        "--estimator",
        "local: the attention block's change computed exactly for q, k, v, o, qkv and attn "
        "cells, linear downstream; linear: first order in each module's output change, groups "
        "summing their leaves (docs/reference/attribution.md).",
        click.Choice(ESTIMATORS),
    ),
    "verify": Flag(
        "--verify",
        "Graft the top K cells of each prompt for real ('all': every cell), print estimate "
        "and real effect, and add Pearson, sign agreement and top-5 overlap per unit and kind "
        "to summary.csv.",
        VerifyCount(),
        extra={"show_default": True},
    ),
    "multi_cell": Flag(
        "--multi-cell",
        "Also graft multi-cell sets for real against the sum of their cells' estimates: each "
        "whole layer (ALL:l:attn,mlp), and FE, LT, FE+LT in every layer (multicell.csv).",
        extra={"is_flag": True},
    ),
}
