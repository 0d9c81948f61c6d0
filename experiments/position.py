"""``graft-exp position`` (E1, E2): SFT grafted into PRE at each position set."""

from __future__ import annotations

import click

from experiments.common import (
    GraftCommand,
    echo_figures,
    make_config,
    protocol_default,
    run_and_report,
    shared_options,
    standalone,
    variant_option,
)
from graft.core.spec import SpecError, parse_spec
from graft.study.grafts import POSITIONS, position_grafts
from graft.study.runner import ExperimentConfig, ExperimentRun, Graft, ModelSource, run_experiment
from graft.study.workspace import parse_variant


def _positions(ctx, param, value):
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    if not items:
        raise click.BadParameter("name at least one position set, e.g. FE,LT,FE+LT")
    for item in items:
        try:
            parse_spec(f"{item}:all:all")
        except SpecError as err:
            raise click.BadParameter(str(err)) from None
    return tuple(dict.fromkeys(items))  # a repeated set is run once, never pooled twice


POSITIONS_OPTION = click.option(
    "--positions",
    callback=_positions,
    default=",".join(POSITIONS),
    show_default=True,
    help="Comma-separated position sets (any position expression of a graft spec); sets "
    "naming a field a template lacks (M, R) are skipped for that template.",
)


@click.command(
    cls=GraftCommand,
    short_help="Position grafting, E1/E2: SFT into PRE at FE, LT, FE+LT, complements.",
)
@POSITIONS_OPTION
@variant_option()
@shared_options
def position(positions, variant, cfg_options, remote):
    """E1/E2 (Fig. 2, 3a): graft every component of every layer from SFT into PRE at
    FE, LT, FE+LT, (FE+LT)^C, FE^C, LT^C (and M, R variants), with PRE and SFT as references.

    The donor is finetuned first if the workspace lacks it (graft-exp finetune does it alone).
    Under --protocol paper the donor is the both-direction model unless --variant is given.
    """
    cfg = make_config("position", cfg_options, remote)
    variant = protocol_default("variant", variant, "both", cfg.protocol)
    grafts = position_grafts(positions, cfg.head_policy, protocol=cfg.protocol)
    run = run_from_sft(cfg, grafts, variant)
    echo_figures(run.folder.path)


def run_from_sft(
    cfg: ExperimentConfig, grafts: list[Graft], variant: str, notes: dict | None = None
) -> ExperimentRun:
    """Run ``grafts`` on the pretrained base with the finetuned ``variant`` as donor ``sft``
    (the paper protocol's options added), report it, and return it; ``notes`` go into the
    stored config."""
    return run_and_report(
        lambda: run_experiment(
            cfg,
            grafts,
            donors={"sft": ModelSource(variant)},
            echo=click.echo,
            extra_config=notes,
            **protocol_run_options(cfg.protocol, variant),
        )
    )


def protocol_run_options(protocol: str, variant: str) -> dict:
    """``run_experiment`` options of the paper protocol: its test prompts from the donor's own
    dataset (no second dataset generated) and a run folder of its own (``-paper``)."""
    if protocol != "paper":
        return {}
    return {"data_direction": parse_variant(variant)[0], "out_tag": "paper"}


if __name__ == "__main__":
    standalone(position)
