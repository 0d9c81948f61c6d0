"""``graft-exp position`` (E1, E2) and ``graft-exp necessity``."""

from __future__ import annotations

import click

from experiments.common import (
    GraftCommand,
    make_config,
    run_and_report,
    shared_options,
    variant_option,
)
from graft.core.spec import SpecError, parse_spec
from graft.results.report import draw_figures
from graft.study.grafts import POSITIONS, necessity_grafts, position_grafts
from graft.study.runner import ModelSource, run_experiment


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
    """
    cfg = make_config("position", cfg_options, remote)
    grafts = position_grafts(positions, cfg.head_policy)
    run = run_and_report(
        lambda: run_experiment(cfg, grafts, donors={"sft": ModelSource(variant)}, echo=click.echo)
    )
    for png in draw_figures(run.folder.path):
        click.echo(f"figure: {png}")


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
    """
    cfg = make_config("necessity", cfg_options, remote)
    grafts = necessity_grafts(positions, cfg.head_policy)
    run = run_and_report(
        lambda: run_experiment(
            cfg,
            grafts,
            base=ModelSource(variant),
            donors={"pre": ModelSource("pretrained")},
            echo=click.echo,
        )
    )
    for png in draw_figures(run.folder.path):
        click.echo(f"figure: {png}")
