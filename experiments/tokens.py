"""``graft-exp tokens`` (E6): the top-10 next tokens with probabilities for sampled examples."""

from __future__ import annotations

import click

from graft.study import TOKEN_SPECS
from graft_experiments import common
from graft_experiments.shared import spec_option


@common.experiment_command("Top-10 next tokens with probabilities per graft, E6.")
@spec_option("; PRE and SFT are always added.", default=TOKEN_SPECS)
@click.option(
    "--grafts",
    "graft_set",
    type=click.Choice(["spec", "paper"]),
    default="spec",
    show_default=True,
    help="spec: the --spec grafts; paper: the one graft the paper's top-10 tables show for "
    "the model's family (Llama FE^C, Gemma LT, GPT-2 (FE+LT)^C; Pythia takes GPT-2's, "
    "Gemma 2/3 Gemma's, Qwen Llama's), in every layer and component.",
)
@click.option(
    "--per-graft",
    type=click.IntRange(1),
    default=5,
    show_default=True,
    help="Examples sampled per graft and template.",
)
@common.variant_option()
@common.shared_options
def tokens(specs, graft_set, per_graft, variant, cfg_options, remote):
    """E6 (C.7): top-10 next tokens with probabilities for a few sampled examples of each graft.

    Under --protocol paper: the paper's layer groups, head policy and 'all' without pos_embed
    in every spec that does not set its own, and the both-direction donor unless --variant
    is common.given."""
    from graft.study import tokens_design

    paper_graft = graft_set == "paper"
    if paper_graft and common.given("specs"):
        raise click.UsageError("--grafts paper chooses the graft itself; leave out --spec")
    run_specs = common.make_config("tokens", cfg_options, remote)
    design = tokens_design(run_specs, specs, paper_graft, per_graft, variant)
    if paper_graft:
        click.echo(f"--grafts paper: {design.runs[''].extra_config['paper_graft']}")
    common.run_or_plan(design)


if __name__ == "__main__":
    common.standalone(tokens)
