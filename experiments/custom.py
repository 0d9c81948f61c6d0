"""``graft-exp custom``: any graft specs, any donors, on a dataset's test prompts."""

from __future__ import annotations

import click

from graft_experiments import common
from graft_experiments.shared import spec_option


@common.experiment_command("Any graft specs and donors on a dataset's test prompts.")
@spec_option(", e.g. 'LT:q4:o,ffn' or 'mine=FE:all:attn@task; LT:h2:mlp'.", required=True)
@click.option(
    "--donor",
    "donor_args",
    multiple=True,
    help="Donor as NAME=VARIANT (finetuned as needed: one, both, task, relation, pretrained) "
    "or NAME=PATH (repeatable). [default: sft=one; sft=both under --protocol paper]",
)
@click.option(
    "--base",
    "base_arg",
    default="pretrained",
    show_default=True,
    help="Base: a variant (pretrained, one, both, ...) or a model folder.",
)
@click.option(
    "--directions",
    default="forward",
    show_default=True,
    type=click.Choice(["forward", "reverse", "forward,reverse"]),
    help="Test prompt directions.",
)
@click.option(
    "--references/--no-references",
    default=True,
    show_default=True,
    help="Add PRE (base alone) and SFT (donor 'sft' with its head).",
)
@common.shared_options
def custom(specs, donor_args, base_arg, directions, references, cfg_options, remote):
    """Run any graft specs (see docs/reference/specs.md) on the dataset's test prompts.

    Under --protocol paper: the paper's layer groups, head policy and 'all' without pos_embed
    in every spec that does not set its own, and sft=both as the default donor. The test
    prompts come from the both-direction dataset when a variant model is trained on both."""
    from graft.study import custom_design, model_sources

    setup = common.make_config(
        "custom", cfg_options, remote, directions=tuple(directions.split(","))
    )
    donors = model_sources(donor_args) if donor_args else None
    base = model_sources([f"base={base_arg}"], param="base")["base"]
    common.run_or_plan(custom_design(setup, specs, donors, base, references))


if __name__ == "__main__":
    common.standalone(custom)
