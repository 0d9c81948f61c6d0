"""``graft-exp tokens`` (E6): the top-10 next tokens with probabilities for sampled examples."""

from __future__ import annotations

import click
import polars as pl

from graft.errors import GraftError, SpecError
from graft.results import top_tokens_table
from graft.storage import write_csv
from graft.study import paper_token_graft, protocol_notes, reference, spec_graft
from graft_experiments.common import (
    GraftCommand,
    cli_error,
    echo_protocol_notes,
    given,
    make_config,
    protocol_default,
    shared_options,
    standalone,
    variant_option,
)
from graft_experiments.shared import run_from_sft

DEFAULT_SPECS = ("FE=FE:all:all", "LT=LT:all:all", "FE+LT=FE+LT:all:all")
#: The table this command adds to the run folder (``.parquet`` and ``.csv``).
TOP_TOKENS = "top_tokens"


@click.command(cls=GraftCommand, short_help="Top-10 next tokens with probabilities per graft, E6.")
@click.option(
    "--spec",
    "specs",
    multiple=True,
    default=DEFAULT_SPECS,
    show_default=True,
    help="Graft as NAME=SPEC or SPEC (repeatable); PRE and SFT are always added. A spec "
    "without head= gets --head-policy, one without protocol= is resolved under --protocol.",
)
@click.option(
    "--grafts",
    "graft_set",
    type=click.Choice(["spec", "paper"]),
    default="spec",
    show_default=True,
    help="spec: the --spec grafts; paper: the one graft the paper's top-10 tables show for "
    "the model's family (Llama FE^C, Gemma LT, GPT-2 (FE+LT)^C; Pythia takes GPT-2's, "
    "Gemma 2/3 Gemma's, Qwen Llama's), in every layer and component.",
)
@click.option(
    "--per-graft",
    type=click.IntRange(1),
    default=5,
    show_default=True,
    help="Examples sampled per graft and template.",
)
@variant_option()
@shared_options
def tokens(specs, graft_set, per_graft, variant, cfg_options, remote):
    """E6 (C.7): top-10 next tokens with probabilities for a few sampled examples of each graft.

    Under --protocol paper: the paper's layer groups, head policy and 'all' without pos_embed
    in every spec that does not set its own, and the both-direction donor unless --variant
    is given."""
    setup = make_config("tokens", cfg_options, remote)
    variant = protocol_default("variant", variant, setup.protocol.donor_variant)
    if graft_set == "paper" and given("specs"):
        raise click.UsageError("--grafts paper chooses the graft itself; leave out --spec")
    try:
        chosen = [spec_graft(s, setup.analysis.head_policy, setup.protocol) for s in specs]
    except SpecError as err:
        raise click.BadParameter(str(err), param_hint="--spec") from None
    if graft_set == "paper":
        try:
            paper_graft, line = paper_token_graft(
                setup.donors.model, setup.analysis.head_policy, setup.protocol
            )
        except GraftError as err:
            raise cli_error(err) from None
        click.echo(f"--grafts paper: {line}")
        chosen = [paper_graft]
    grafts = [reference("PRE", None), reference("SFT", "sft"), *chosen]
    notes = echo_protocol_notes(protocol_notes(grafts, setup.protocol))
    if graft_set == "paper":
        notes["paper_graft"] = line
    # its own default run folder: a run of other grafts there would refuse it
    run = run_from_sft(
        setup, grafts, variant, notes, "paper-grafts" if graft_set == "paper" else ""
    )
    if run is None:  # --dry-run
        return
    # one group per replicate: several finetune or data seeds must not be pooled
    groups = [c for c in ("data_seed", "finetune_seed") if c in run.examples.columns]
    by = [*groups, "template", "graft"]
    table = top_tokens_table(run.examples, by=by, per_group=per_graft, seed=setup.analysis.seed)
    run.folder.write_table(TOP_TOKENS, table)  # with its metadata, atomically
    lists = [c for c, t in table.schema.items() if isinstance(t, pl.List)]
    write_csv(table.drop(lists), run.folder.path / f"{TOP_TOKENS}.csv")
    # the first sampled example of each group (sampled indices need not include 0)
    first_example = pl.col("example") == pl.col("example").min().over(by)
    first = table.filter(first_example).select([*by, "rank", "token", "prob", "is_target"])
    with pl.Config(tbl_rows=60, fmt_str_lengths=30, tbl_hide_dataframe_shape=True):
        click.echo(str(first.head(60)))
    click.echo(f"top tokens: {run.folder.path / f'{TOP_TOKENS}.csv'}")


if __name__ == "__main__":
    standalone(tokens)
