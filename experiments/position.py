"""``graft-exp position`` (E1, E2): SFT grafted into PRE at each position set."""

from __future__ import annotations

import click
import polars as pl

from graft.results import top1_kinds_wide
from graft.study import TOP1_KINDS, group_columns, position_grafts, write_top1_kinds
from graft_experiments.common import (
    GraftCommand,
    echo_figures,
    make_config,
    protocol_default,
    shared_options,
    standalone,
    variant_option,
)
from graft_experiments.shared import POSITIONS_OPTION, run_from_sft


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

    Also writes top1_kinds (.parquet, .csv): per template and graft, the share of rows whose
    top-1 token starts an actor's name, a movie title, is punctuation or a function word.

    The donor is finetuned first if the workspace lacks it (graft-exp finetune does it alone).
    Under --protocol paper the donor is the both-direction model unless --variant is given.
    """
    setup = make_config("position", cfg_options, remote)
    variant = protocol_default("variant", variant, setup.protocol.donor_variant)
    grafts = position_grafts(positions, setup.analysis.head_policy, protocol=setup.protocol)
    run = run_from_sft(setup, grafts, variant)
    if run is None:  # --dry-run
        return
    table = write_top1_kinds(run.folder, run.examples, run.config)
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_hide_dataframe_shape=True, fmt_str_lengths=20):
        click.echo("top-1 token kinds, share (count) of rows:")
        click.echo(str(top1_kinds_wide(table, group_columns(run.examples))))
    click.echo(f"top-1 kinds: {run.folder.path / f'{TOP1_KINDS}.csv'}")
    echo_figures(run.folder.path)


if __name__ == "__main__":
    standalone(position)
