"""``graft-exp necessity``: PRE weights grafted back into SFT at each position set."""

from __future__ import annotations

from graft_experiments import common
from graft_experiments.shared import positions_option


@common.experiment_command("Necessity: PRE weights grafted back into SFT at each position set.")
@positions_option()
@common.variant_option(what="the SFT model")
@common.shared_options
def necessity(positions, variant, cfg_options, remote):
    """Necessity: run SFT with the PRE weights grafted back at each position set. A drop in
    accuracy shows the finetuned weights there are needed (the paper tested sufficiency only).
    Under --protocol paper SFT is the both-direction model unless --variant is given.
    """
    from graft.study import necessity_design

    specs = common.make_config("necessity", cfg_options, remote)
    common.run_or_plan(necessity_design(specs, positions, variant))


if __name__ == "__main__":
    common.standalone(necessity)
