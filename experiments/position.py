"""``graft-exp position`` (E1, E2): SFT grafted into PRE at each position set."""

from __future__ import annotations

from graft_experiments import common
from graft_experiments.shared import positions_option


@common.experiment_command("Position grafting, E1/E2: SFT into PRE at FE, LT, FE+LT, complements.")
@positions_option()
@common.variant_option()
@common.shared_options
def position(positions, variant, cfg_options, remote):
    """E1/E2 (Fig. 2, 3a): graft every component of every layer from SFT into PRE at
    FE, LT, FE+LT, (FE+LT)^C, FE^C, LT^C (and M, R variants), with PRE and SFT as references.

    Also writes top1_kinds (.parquet, .csv): per template and graft, the share of rows whose
    top-1 token starts an actor's name, a movie title, is punctuation or a function word.

    The donor is finetuned first if the workspace lacks it (graft-exp finetune does it alone).
    Under --protocol paper the donor is the both-direction model unless --variant is given.
    """
    from graft.study import position_design

    specs = common.make_config("position", cfg_options, remote)
    common.run_or_plan(position_design(specs, positions, variant))


if __name__ == "__main__":
    common.standalone(position)
