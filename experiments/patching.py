"""``graft-exp patching``: weight grafting beside activation patching as the field runs it,
layer by layer (or in windows), per position unit and kind of site, in both directions."""

from __future__ import annotations

import click

from graft.study import METHODS, PATCH_MODES, SITE_KINDS, UNITS, WHOLE_DEPTH
from graft_experiments import common
from graft_experiments.shared import reuse_option


@common.experiment_command(
    "Weight grafting vs activation patching, layer by layer (causal-tracing maps)."
)
@common.list_option(
    "--positions",
    UNITS,
    "Position units (rows of the maps), comma-separated position expressions; "
    "FE[:-1] is the first entity but its last token, FE[-1] its last token.",
    name="units",
)
@common.list_option(
    "--kinds",
    SITE_KINDS,
    "Sites: residual (a layer's output), attn (the attention block's output), mlp "
    "(the MLP block's output).",
)
@common.list_option(
    "--modes",
    PATCH_MODES,
    "restore (PRE runs, SFT's values go in: denoising) and/or break (SFT runs, PRE's "
    "go in: noising).",
)
@click.option(
    "--window",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Layers per cell: 1 patches each layer alone; K patches the K layers centred on it.",
)
@common.list_option(
    "--methods",
    METHODS,
    "weights (the donor's weights of the site's modules compute on the run's own "
    "activations) and/or patching (the donor's own-run output of the site is written in).",
)
@common.list_option(
    "--whole-depth",
    WHOLE_DEPTH,
    "E1's position sets also run in every layer at once by both methods ('' for none); "
    "cells identical by construction and patches that copy the donor's whole stream are "
    "labelled, not tested.",
)
@reuse_option()
@common.variant_option()
@common.shared_options
def patching(variant, cfg_options, remote, **design):
    """Sweep the layers: at each position unit, each layer (or window) and each kind of site,
    give the running model the other model's values, by grafting weights and by patching
    activations, in both directions; then write in <out> the effect of every cell (0 = the
    running model, 1 = the other one, in mean target log-prob, with a paired bootstrap
    interval), weights against patching cell by cell (exact McNemar and paired bootstrap,
    Holm over the cells that test something), per-cell findings, and layer x position maps
    like causal-tracing figures (see docs/reference/patching.md). The donor is finetuned first if the
    workspace lacks it."""
    from graft.study import patching_design

    specs = common.make_config("patching", cfg_options, remote)
    common.run_or_plan(patching_design(specs, variant=variant, **design))


if __name__ == "__main__":
    common.standalone(patching)
