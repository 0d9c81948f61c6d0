"""Options several experiment commands share: ``--positions`` (E1, necessity, E7),
``--spec`` (custom, tokens, lens), ``--layers`` and ``--fe`` (the commands that graft
component sets at LT), ``--reuse/--no-reuse`` (patching, E7)."""

from __future__ import annotations

from collections.abc import Callable

import click

from graft.errors import SpecError
from graft.study import POSITIONS
from graft_experiments.click_types import item_list


def _positions(ctx, param, value):
    from graft.core import parse_spec  # torch: only when the option is given

    items = item_list(ctx, param, value)
    if not items:
        raise click.BadParameter("name at least one position set, e.g. FE,LT,FE+LT")
    for item in items:
        try:
            parse_spec(f"{item}:all:all")
        except SpecError as err:
            raise click.BadParameter(str(err)) from None
    return tuple(dict.fromkeys(items))  # a repeated set is run once, never pooled twice


def positions_option(default: tuple[str, ...] = POSITIONS, what: str = "") -> Callable:
    """``--positions``: comma-separated position sets, each checked as a graft spec's."""
    return click.option(
        "--positions",
        callback=_positions,
        default=",".join(default),
        show_default=True,
        help=f"Comma-separated position sets{what} (any position expression of a graft spec); "
        "sets naming a field a template lacks (M, R) are skipped for that template.",
    )


def spec_option(help: str, default: tuple[str, ...] = (), required: bool = False) -> Callable:
    """``--spec`` (repeatable, parameter ``specs``): grafts as ``NAME=SPEC`` or ``SPEC``."""
    return click.option(
        "--spec",
        "specs",
        multiple=True,
        required=required,
        default=default,
        show_default=bool(default),
        help=f"Graft as NAME=SPEC or SPEC (repeatable){help} A spec without head= gets "
        "--head-policy, one without protocol= is resolved under --protocol.",
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


def reuse_option() -> Callable:
    """``--reuse/--no-reuse`` of the commands whose rows start at different layers."""
    return click.option(
        "--reuse/--no-reuse",
        default=True,
        show_default=True,
        help="Run each row (a patching cell) from its first changed layer and column on, the "
        "layers and columns before them once per prompt (equal to rounding; --dry-run states "
        "the memory it holds; "
        "a remote run runs rows whole); --no-reuse runs every row's whole forward.",
    )
