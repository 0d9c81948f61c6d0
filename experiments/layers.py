"""``graft-exp layers`` (E7): where in depth does each position matter? A localisation map."""

from __future__ import annotations

import click

from graft.core import GraftSpec
from graft.errors import ExperimentError, SpecError
from graft.models import load_model
from graft.results import LAYER_SEP
from graft.study import (
    ModelSource,
    NamedGraft,
    head_suffix,
    layer_windows,
    protocol_notes,
    reference,
    resolve_model_path,
    with_protocol,
)
from graft_experiments.common import (
    GraftCommand,
    echo_figures,
    echo_protocol_notes,
    make_config,
    protocol_default,
    shared_options,
    standalone,
    variant_option,
)
from graft_experiments.shared import run_from_sft


@click.command(
    cls=GraftCommand, short_help="Layer localisation map, E7: positions x layer windows heatmaps."
)
@click.option(
    "--positions",
    default="FE,LT,FE+LT",
    show_default=True,
    help="Comma-separated position sets (rows of the map).",
)
@click.option(
    "--windows",
    default="eighths",
    show_default=True,
    help="Layer windows (columns): halves, quarters, eighths, single, or a width K (consecutive "
    "windows of K layers). Under --protocol paper halves and quarters follow the paper's "
    "layer rule, eighths are refused and the default is quarters.",
)
@click.option(
    "--components",
    default="block",
    show_default=True,
    help="Component sets, separated by ';' (one map each), e.g. 'block;attn;o,ffn'.",
)
@variant_option()
@shared_options
def layers(positions, windows, components, variant, cfg_options, remote):
    """E7: graft SFT into PRE at each position set x layer window (x component set) and draw
    accuracy heatmaps: the layer localisation the paper had no room for.

    Under --protocol paper: the paper's layer groups (quarters by default; no eighths), head
    policy and 'all' without pos_embed, and the both-direction donor unless --variant is
    given. Single layers and width-K windows are the same layers under either rule."""
    setup = make_config("layers", cfg_options, remote)
    variant = protocol_default("variant", variant, setup.protocol.donor_variant)
    windows = protocol_default("windows", windows, setup.protocol.layer_windows)
    if windows in setup.protocol.refused_windows:
        raise click.BadParameter(
            f"{windows}: the paper's layer rule has halves and quarters only (its code's "
            "eighths were broken); use quarters, halves, single or a width K, or --protocol "
            "graft",
            param_hint="--windows",
        )
    # a repeated item is run once (never two grafts of one name pooled into one result)
    pos_list = list(dict.fromkeys(p.strip() for p in positions.split(",") if p.strip()))
    comp_list = list(dict.fromkeys(c.strip() for c in components.split(";") if c.strip()))
    if not pos_list or not comp_list:
        raise click.UsageError("--positions and --components must name at least one item")
    base_path = resolve_model_path(setup, ModelSource())
    loaded = load_model(
        base_path, dtype=setup.execution.dtype, device="cpu"
    )  # a GraftError: one line
    n_layers = loaded.model.config.num_hidden_layers
    try:
        windows_list = layer_windows(n_layers, windows)
    # ValueError: Python's int() of a digit string it refuses ("²", over 4,300 digits)
    except (ExperimentError, ValueError):
        raise click.BadParameter(
            "use halves, quarters, eighths, single or a positive integer width",
            param_hint="--windows",
        ) from None
    grafts = [reference("PRE", None), reference("SFT", "sft")]
    head = head_suffix(setup.analysis.head_policy)
    for comps in comp_list:
        for pos in pos_list:
            for win in windows_list:
                try:
                    spec = GraftSpec.parse(f"{pos}:{win}:{comps}{head}")
                except SpecError as err:
                    raise click.BadParameter(
                        str(err), param_hint="'--positions' / '--components'"
                    ) from None
                grafts.append(NamedGraft(f"{pos}{LAYER_SEP}{win}", spec, group=comps))
    grafts = with_protocol(grafts, setup.protocol)
    notes = echo_protocol_notes(protocol_notes(grafts, setup.protocol))
    run = run_from_sft(setup, grafts, variant, notes)
    if run is not None:  # None: --dry-run
        echo_figures(run.folder.path)


if __name__ == "__main__":
    standalone(layers)
