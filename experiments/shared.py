"""What several experiment commands share: the ``--positions`` option (E1, necessity), running
named grafts with the finetuned SFT model as donor (position, layers, tokens), and the
``run_experiment`` options of the paper protocol (its test prompts from the donor's own
dataset, a run folder of its own)."""

from __future__ import annotations

import click

from graft.core import parse_spec
from graft.errors import SpecError
from graft.study import (
    POSITIONS,
    ExperimentRun,
    ModelSource,
    NamedGraft,
    Protocol,
    RunSpecs,
    parse_variant,
)
from graft_experiments.common import run_or_plan


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

#: ``--layers`` of the commands that graft component sets at LT over one layer range.
LAYERS_OPTION = click.option(
    "--layers",
    default="q4",
    show_default=True,
    help="Layer selector of the grafts (q4 = last quarter; under --protocol paper by the "
    "paper's layer rule, which has halves and quarters only).",
)

#: ``--fe`` of the commands that graft component sets at LT: FE grafted too, in every layer.
FE_OPTION = click.option(
    "--fe",
    default=None,
    metavar="COMPS",
    help="Also graft the first entity in every layer with these components (e.g. 'all'), "
    "so LT components are measured with FE's enrichment in place; adds an 'FE only' row. "
    "[default: FE not grafted, as the paper]",
)


def run_from_sft(
    setup: RunSpecs,
    grafts: list[NamedGraft],
    variant: str,
    notes: dict | None = None,
    out_tag: str = "",
) -> ExperimentRun | None:
    """Run ``grafts`` on the pretrained base with the finetuned ``variant`` as donor ``sft``
    (the paper protocol's options added), report it, and return it (None under
    ``--dry-run``, which prints the plan instead); ``notes`` go into the stored config,
    ``out_tag`` into the default run folder's name (after the protocol's)."""
    options = protocol_run_options(setup.protocol, variant)
    if out_tag:
        options["out_tag"] = "-".join(t for t in (options.get("out_tag", ""), out_tag) if t)
    return run_or_plan(
        setup,
        grafts,
        donors={"sft": ModelSource(variant)},
        echo=click.echo,
        extra_config=notes,
        **options,
    )


def protocol_run_options(protocol: Protocol, variant: str) -> dict:
    """``run_experiment`` options of ``protocol``: under the paper's, its test prompts from the
    donor's own dataset (no second dataset generated) and a run folder of its own
    (``-paper``)."""
    options: dict = {"out_tag": protocol.run_tag} if protocol.run_tag else {}
    if protocol.test_prompts_from_donor:
        options["data_direction"] = parse_variant(variant)[0]
    return options
