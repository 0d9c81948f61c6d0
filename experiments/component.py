"""``graft-exp component`` (E3): component sets at the last token."""

from __future__ import annotations

import click

from graft_experiments import common
from graft_experiments.shared import FE_OPTION, LAYERS_OPTION


@common.experiment_command(
    "Component grafting at LT, E3: ATTN, O, FFN sets, SFT and reversal pairs."
)
@LAYERS_OPTION
@common.list_option(
    "--pairs",
    ("sft", "reversal"),
    "Donor -> base pairs: sft (SFT -> PRE, forward prompts; SFT is the one-direction "
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
@common.shared_options
def component(layers, pairs, split_qkv, fe, cfg_options, remote):
    """E3 (Fig. 4, C.5): ATTN+O+FFN, ATTN+O, O+FFN, ATTN+FFN, O, FFN, O+FFN_up, O+FFN_down
    at the last token over a layer group, for each donor pair; PRE and SFT as references.

    Under --protocol paper: the paper's layer groups and head policy, 'all' (--fe) without
    pos_embed, the both-direction model as the sft pair's donor. Q, K and V (--split-qkv)
    stay exact slices: the paper's fused-QKV 'q' is not emulated (a note says so)."""
    from graft.study import component_design

    specs = common.make_config("component", cfg_options, remote)
    common.run_or_plan(component_design(specs, layers, pairs, split_qkv, fe))


if __name__ == "__main__":
    common.standalone(component)
