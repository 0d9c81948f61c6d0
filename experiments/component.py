"""``graft-exp component`` (E3): component sets at the last token."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click
import polars as pl

from graft.core import parse_spec
from graft.errors import SpecError
from graft.results import RunFolder
from graft.study import (
    ModelSource,
    Protocol,
    check_layer_rule,
    component_grafts,
    default_out,
    print_summary,
    protocol_notes,
)
from graft_experiments.common import (
    GraftCommand,
    echo_figures,
    echo_protocol_notes,
    make_config,
    run_or_plan,
    shared_options,
    standalone,
)
from graft_experiments.shared import FE_OPTION, LAYERS_OPTION, protocol_run_options

#: The donor pairs: name -> (base source, donor source, test prompt directions).
PAIRS = ("sft", "reversal")


def pairs_of(protocol: Protocol) -> dict[str, tuple[ModelSource, ModelSource, tuple[str, ...]]]:
    """The pairs under ``protocol``: SFT is its default donor variant (the both-direction
    model under the paper's: the paper's sft2pre donor; its both2one pair is graft's reversal
    pair)."""
    return {
        "sft": (ModelSource("pretrained"), ModelSource(protocol.donor_variant), ("forward",)),
        "reversal": (ModelSource("one"), ModelSource("both"), ("reverse",)),
    }


@click.command(
    cls=GraftCommand,
    short_help="Component grafting at LT, E3: ATTN, O, FFN sets, SFT and reversal pairs.",
)
@LAYERS_OPTION
@click.option(
    "--pairs",
    default="sft,reversal",
    show_default=True,
    help="Donor -> base pairs: sft (SFT -> PRE, forward prompts; SFT is the one-direction "
    "model, the both-direction one under --protocol paper) and reversal (both-directions -> "
    "one-direction model, reversed prompts).",
)
@click.option(
    "--split-qkv",
    is_flag=True,
    help="Also graft Q, K, V and Q+K alone (exact slices on fused-QKV models; under "
    "--protocol paper, as the paper's code: 'q' the whole fused projection, 'k' and 'v' "
    "nothing).",
)
@FE_OPTION
@shared_options
def component(layers, pairs, split_qkv, fe, cfg_options, remote):
    """E3 (Fig. 4, C.5): ATTN+O+FFN, ATTN+O, O+FFN, ATTN+FFN, O, FFN, O+FFN_up, O+FFN_down
    at the last token over a layer group, for each donor pair; PRE and SFT as references.

    Under --protocol paper: the paper's layer groups and head policy, 'all' (--fe) without
    pos_embed, the both-direction model as the sft pair's donor. Q, K and V (--split-qkv)
    stay exact slices: the paper's fused-QKV 'q' is not emulated (a note says so)."""
    names = [p.strip() for p in pairs.split(",") if p.strip()]
    bad = [p for p in names if p not in PAIRS]
    if bad or not names:
        raise click.BadParameter(
            f"unknown pair(s) {bad}; use {', '.join(PAIRS)}", param_hint="--pairs"
        )
    if fe:
        try:
            parse_spec(f"FE:all:{fe}")
        except SpecError as err:
            raise click.BadParameter(str(err), param_hint="--fe") from None
    setup = make_config("component", cfg_options, remote)
    try:
        check_layer_rule(layers, setup.protocol)
        planned = component_grafts(
            layers, setup.analysis.head_policy, split_qkv, fe=fe, protocol=setup.protocol
        )
    except SpecError as err:
        raise click.BadParameter(str(err), param_hint="--layers") from None
    notes = echo_protocol_notes(protocol_notes(planned, setup.protocol))
    protocol_options = protocol_run_options(setup.protocol, "both")
    out = setup.execution.out
    root = Path(out) if out else default_out(setup, protocol_options.get("out_tag", ""))
    if len(names) > 1:  # the combined results go into root itself: it must be graft's
        RunFolder(root).check_owned()  # a GraftError: one line (GraftCommand)
    summaries = []
    pairs = pairs_of(setup.protocol)
    for name in names:
        base, donor, directions = pairs[name]
        pair_options = dict(cfg_options, out=str(root / name))
        pair_cfg = make_config("component", pair_options, remote, directions=directions)
        grafts = [replace(g, group=name) for g in planned]
        run = run_or_plan(
            pair_cfg,
            grafts,
            base=base,
            donors={"sft": donor},
            echo=click.echo,
            extra_config=notes,
            **protocol_options,
        )
        if run is None:  # --dry-run: the plan of each pair, nothing written
            continue
        summaries.append(run.summary)
        echo_figures(run.folder.path)
    if len(summaries) > 1:
        combined_dir = RunFolder(root)
        combined_dir.mark()
        combined = pl.concat(summaries, how="diagonal_relaxed")
        combined_dir.write_summary(combined)
        first = RunFolder(combined_dir.path / names[0]).read_config() or {}
        grafts = [
            g for n in names for g in RunFolder(combined_dir.path / n).read_config()["grafts"]
        ]
        combined_dir.write_json("config.json", dict(first, grafts=grafts, pairs=names))
        click.echo("all pairs:")
        print_summary(combined, echo=click.echo)
        echo_figures(combined_dir.path)


if __name__ == "__main__":
    standalone(component)
