"""``graft-exp hybrid`` (E4): a task model and a relation model grafted into PRE together."""

from __future__ import annotations

import click

from graft_experiments import common


@common.experiment_command("Hybrid grafting, E4: task model at FE and LT, relation model at LT.")
@click.option(
    "--lt-layers",
    default=None,
    help="Layers of the LT hybrid [default: h2, the last half; under --protocol paper "
    "from_middle, layers L // 2 on, as the authors' hybrid split them].",
)
@common.shared_options
def hybrid(lt_layers, cfg_options, remote):
    """E4 (Fig. 5): at LT, ATTN from the task model (finetuned on fact set A) and O+FFN from
    the relation model (set B) in the last half of layers; at FE nothing / all / ATTN / FFN /
    O+FFN / ATTN+O from the task model in every layer. Tested on set B's prompts.

    Under --protocol paper the relation model gives O, up and down at LT (the gate stays
    the task model's), both donors are trained on both directions (both-A, both-B) and
    the LT hybrid starts at layer L // 2, as the authors' hybrid code split the layers."""
    from graft.study import hybrid_design

    specs = common.make_config("hybrid", cfg_options, remote, split=True)
    common.run_or_plan(hybrid_design(specs, lt_layers))


if __name__ == "__main__":
    common.standalone(hybrid)
