"""``graft-exp lens``: the logit lens under grafts, per layer at LT and at FE's last token."""

from __future__ import annotations

import click

from graft.study import DEFAULT_TOP_K
from graft_experiments import common
from graft_experiments.shared import spec_option


@common.experiment_command("Logit lens per layer at LT and FE's last token, per graft.")
@spec_option(", after PRE, SFT, FE, LT and FE+LT.")
@click.option(
    "--top-k",
    type=click.IntRange(1),
    default=DEFAULT_TOP_K,
    show_default=True,
    help="Top tokens stored per prompt, graft, layer and position (ids, texts, "
    "probabilities in lens.parquet); another value recomputes the stored lens batches.",
)
@common.variant_option()
@common.shared_options
def lens(specs, top_k, variant, cfg_options, remote):
    """The logit lens under grafts: the residual stream at the last token (LT) and at the
    first entity's last token (FE-last), at the embeddings (layer emb) and after every layer,
    decoded through the graft's final norm and unembedding, for PRE, SFT, FE, LT, FE+LT (all
    layers and components from the donor) and each --spec.

    One run: the lens of each stored batch is stored beside its examples (parts/lens) and
    resumed as they are. Writes the run's usual tables (the final logits; bar charts
    figures/final_layer_<template>_acc5.png), lens.parquet (target rank and probability and
    the top-k tokens per prompt, graft, layer and position), lens_summary.csv (means, medians
    and 95% bootstrap CIs over prompts; same_as: the graft whose line this one is by
    causality), lens_top_tokens.csv (the top-1 token per layer and position for 3 prompts per
    template) and figures/lens_median_rank.png and lens_mean_logprob.png. One replicate,
    local only. Under --protocol paper the donor is the both-direction model unless
    --variant is given."""
    from graft.study import lens_design

    run_specs = common.make_config("lens", cfg_options, remote)
    if common.run_or_plan(lens_design(run_specs, specs, top_k, variant)) is None:  # --dry-run
        click.echo(
            "lens: one trace per stored batch, beside its examples: the embeddings and every "
            "layer read at LT and FE-last"
        )


if __name__ == "__main__":
    common.standalone(lens)
