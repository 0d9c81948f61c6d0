"""``graft-exp lens``: the logit lens under grafts, per layer at LT and at FE's last token."""

from __future__ import annotations

import click

from graft.errors import GraftError, SpecError
from graft.study import (
    DEFAULT_TOP_K,
    LENS_SUMMARY,
    LENS_TABLE,
    LENS_TOP_TOKENS,
    LensAnalysis,
    LensRun,
    ModelSource,
    check_lens_config,
    draw_lens_figures,
    protocol_notes,
    reference,
    spec_graft,
)
from graft_experiments.common import (
    GraftCommand,
    cli_error,
    echo_figures,
    echo_protocol_notes,
    make_config,
    protocol_default,
    run_or_plan,
    shared_options,
    standalone,
    variant_option,
)
from graft_experiments.shared import protocol_run_options

#: The grafts of every lens run after PRE and SFT; each --spec adds one.
LENS_SPECS = ("FE=FE:all:all", "LT=LT:all:all", "FE+LT=FE+LT:all:all")


@click.command(
    cls=GraftCommand, short_help="Logit lens per layer at LT and FE's last token, per graft."
)
@click.option(
    "--spec",
    "specs",
    multiple=True,
    help="Another graft as NAME=SPEC or SPEC (repeatable), after PRE, SFT, FE, LT and FE+LT. "
    "A spec without head= gets --head-policy, one without protocol= is resolved under "
    "--protocol.",
)
@click.option(
    "--top-k",
    type=click.IntRange(1),
    default=DEFAULT_TOP_K,
    show_default=True,
    help="Top tokens stored per prompt, graft, layer and position (ids, texts, "
    "probabilities in lens.parquet); another value recomputes the stored lens batches.",
)
@variant_option()
@shared_options
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
    setup = make_config("lens", cfg_options, remote)
    variant = protocol_default("variant", variant, setup.protocol.donor_variant)
    if remote is not None:
        raise click.UsageError("the lens runs on this machine only; drop --remote")
    try:
        check_lens_config(setup)
    except GraftError as err:
        raise cli_error(err) from None
    try:
        grafts = [reference("PRE", None), reference("SFT", "sft")] + [
            spec_graft(s, setup.analysis.head_policy, setup.protocol) for s in (*LENS_SPECS, *specs)
        ]
    except SpecError as err:
        raise click.BadParameter(str(err), param_hint="--spec") from None
    notes = echo_protocol_notes(protocol_notes(grafts, setup.protocol))
    # the SFT donor's run (as graft_experiments.shared.run_from_sft), the lens its analysis
    run = run_or_plan(
        setup,
        grafts,
        donors={"sft": ModelSource(variant)},
        echo=click.echo,
        extra_config=notes,
        analyses=(LensAnalysis(top_k=top_k),),
        **protocol_run_options(setup.protocol, variant),
    )
    if run is None:  # --dry-run
        click.echo(
            "lens: one trace per stored batch, beside its examples: the embeddings and every "
            "layer read at LT and FE-last"
        )
        return
    result: LensRun = run.analyses[LENS_TABLE]
    click.echo(f"lens: {len(result.computed)} batches computed")
    click.echo(f"lens summary: {run.folder.path / f'{LENS_SUMMARY}.csv'}")
    click.echo(f"lens top tokens: {run.folder.path / f'{LENS_TOP_TOKENS}.csv'}")
    echo_figures(run.folder.path)
    for png in draw_lens_figures(run.folder.path):
        click.echo(f"figure: {png}")


if __name__ == "__main__":
    standalone(lens)
