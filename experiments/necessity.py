"""``graft-exp necessity``: PRE weights grafted back into SFT at each position set."""

from __future__ import annotations

import click

from graft.study import ModelSource, necessity_grafts
from graft_experiments.common import (
    GraftCommand,
    echo_figures,
    make_config,
    protocol_default,
    run_or_plan,
    shared_options,
    standalone,
    variant_option,
)
from graft_experiments.shared import POSITIONS_OPTION, protocol_run_options


@click.command(
    cls=GraftCommand,
    short_help="Necessity: PRE weights grafted back into SFT at each position set.",
)
@POSITIONS_OPTION
@variant_option(what="the SFT model")
@shared_options
def necessity(positions, variant, cfg_options, remote):
    """Necessity: run SFT with the PRE weights grafted back at each position set. A drop in
    accuracy shows the finetuned weights there are needed (the paper tested sufficiency only).
    Under --protocol paper SFT is the both-direction model unless --variant is given.
    """
    setup = make_config("necessity", cfg_options, remote)
    variant = protocol_default("variant", variant, setup.protocol.donor_variant)
    grafts = necessity_grafts(positions, setup.analysis.head_policy, protocol=setup.protocol)
    run = run_or_plan(
        setup,
        grafts,
        base=ModelSource(variant),
        donors={"pre": ModelSource("pretrained")},
        echo=click.echo,
        **protocol_run_options(setup.protocol, variant),
    )
    if run is not None:  # None: --dry-run
        echo_figures(run.folder.path)


if __name__ == "__main__":
    standalone(necessity)
