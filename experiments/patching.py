"""``graft-exp patching``: weight grafting beside activation patching as the field runs it,
layer by layer (or in windows), per position unit and kind of site, in both directions."""

from __future__ import annotations

import click

from graft.study import METHODS, PATCH_MODES, SITE_KINDS, UNITS, WHOLE_DEPTH, patching_design
from graft_experiments.common import (
    GraftCommand,
    make_config,
    run_or_plan,
    shared_options,
    standalone,
    variant_option,
)


def _items(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


@click.command(
    cls=GraftCommand,
    short_help="Weight grafting vs activation patching, layer by layer (causal-tracing maps).",
)
@click.option(
    "--positions",
    default=",".join(UNITS),
    show_default=True,
    help="Position units (rows of the maps), comma-separated position expressions; "
    "FE[:-1] is the first entity but its last token, FE[-1] its last token.",
)
@click.option(
    "--kinds",
    default=",".join(SITE_KINDS),
    show_default=True,
    help="Sites: residual (a layer's output), attn (the attention block's output), mlp "
    "(the MLP block's output).",
)
@click.option(
    "--modes",
    default=",".join(PATCH_MODES),
    show_default=True,
    help="restore (PRE runs, SFT's values go in: denoising) and/or break (SFT runs, PRE's "
    "go in: noising).",
)
@click.option(
    "--window",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Layers per cell: 1 patches each layer alone; K patches the K layers centred on it.",
)
@click.option(
    "--methods",
    default=",".join(METHODS),
    show_default=True,
    help="weights (the donor's weights of the site's modules compute on the run's own "
    "activations) and/or patching (the donor's own-run output of the site is written in).",
)
@click.option(
    "--whole-depth",
    default=",".join(WHOLE_DEPTH),
    show_default=True,
    help="E1's position sets also run in every layer at once by both methods ('' for none); "
    "cells identical by construction and patches that copy the donor's whole stream are "
    "labelled, not tested.",
)
@variant_option()
@shared_options
def patching(positions, kinds, modes, window, methods, whole_depth, variant, cfg_options, remote):
    """Sweep the layers: at each position unit, each layer (or window) and each kind of site,
    give the running model the other model's values, by grafting weights and by patching
    activations, in both directions; then write in <out> the effect of every cell (0 = the
    running model, 1 = the other one, in mean target log-prob, with a paired bootstrap
    interval), weights against patching cell by cell (exact McNemar and paired bootstrap,
    Holm over the cells that test something), per-cell findings, and layer x position maps
    like causal-tracing figures (see docs/reference/patching.md). The donor is finetuned first if the
    workspace lacks it."""
    specs = make_config("patching", cfg_options, remote)
    design = patching_design(
        specs,
        units=_items(positions),
        kinds=_items(kinds),
        modes=_items(modes),
        window=window,
        methods=_items(methods),
        whole_depth=_items(whole_depth),
        variant=variant,
    )
    run_or_plan(design)


if __name__ == "__main__":
    standalone(patching)
