"""``graft-exp layers`` (E7): where in depth does each position matter? A localisation map."""

from __future__ import annotations

import click

from graft_experiments import common
from graft_experiments.shared import positions_option, reuse_option


def _items(separator: str):
    def parse(ctx, param, value):
        items = [v.strip() for v in value.split(separator) if v.strip()]
        if not items:
            raise click.BadParameter("name at least one item")
        return items

    return parse


@common.experiment_command("Layer localisation map, E7: positions x layer windows heatmaps.")
@positions_option(("FE", "LT", "FE+LT"), " (rows of the map)")
@click.option(
    "--windows",
    default=None,
    help="Layer windows (columns): halves, quarters, eighths, single, or a width K (consecutive "
    "windows of K layers). Under --protocol paper halves and quarters follow the paper's "
    "layer rule and eighths are refused. [default: eighths; quarters under --protocol paper]",
)
@click.option(
    "--components",
    default="block",
    show_default=True,
    callback=_items(";"),
    help="Component sets, separated by ';' (one map each), e.g. 'block;attn;o,ffn'.",
)
@reuse_option()
@common.variant_option()
@common.shared_options
def layers(positions, windows, components, reuse, variant, cfg_options, remote):
    """E7: graft SFT into PRE at each position set x layer window (x component set) and draw
    accuracy heatmaps: the layer localisation the paper had no room for.

    Under --protocol paper: the paper's layer groups (quarters by default; no eighths), head
    policy and 'all' without pos_embed, and the both-direction donor unless --variant is
    given. Single layers and width-K windows are the same layers under either rule."""
    from graft.study import layers_design

    specs = common.make_config("layers", cfg_options, remote)
    design = layers_design(
        specs,
        positions=positions,
        windows=windows,
        components=components,
        variant=variant,
        reuse=reuse,
    )
    common.run_or_plan(design)


if __name__ == "__main__":
    common.standalone(layers)
