"""``graft-exp accept``: the explicit choice to use a folder graft refuses as it is."""

from __future__ import annotations

from pathlib import Path

import click

from graft_experiments import common


@click.command(cls=common.GraftCommand)
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@common.quiet_option()
def accept(folder: Path, quiet: bool) -> None:
    """Use FOLDER as it is, where graft would refuse it. A run folder: mark its tables that
    carry no graft marks (another tool's rewrite, or a graft before tables recorded marks)
    for their content as it is now, and record the choice in its config.json (`accepted`:
    listed before any is marked; an accept stopped mid-way is finished by running it again).
    A donor folder without checksums.json (a model you brought, or one of a graft before
    checksums): write its checksums and accepted.json, so it loads, and is checked from now
    on. What was accepted is said on stderr (also with --quiet)."""
    from graft.results import accept_run_tables
    from graft.storage import refuse_special_under
    from graft.study import MODEL_FOLDER, RUN_FOLDER, accept_donor, folder_kind

    # what the folder is is told by its files: a FIFO among them is refused first
    refuse_special_under(folder, skip=(".set-aside",))
    kind = folder_kind(folder)
    if kind == RUN_FOLDER:
        click.echo(f"{folder} is a run folder: accepting its unmarked tables", err=True)
        marked = accept_run_tables(folder)
        for file in marked:
            click.echo(f"warning: accepted {file} as it is (no graft marks)", err=True)
        if not quiet:
            click.echo(f"{folder}: {len(marked)} unmarked table(s) accepted (config.json)")
    elif kind == MODEL_FOLDER:
        click.echo(f"{folder} is a model folder: accepting its weights", err=True)
        checksums = accept_donor(folder)
        click.echo(f"warning: accepted the model folder {folder} as it is", err=True)
        if not quiet:
            click.echo(f"{folder}: checksums written ({checksums.name}); recorded in accepted.json")
    else:
        what = f"a {kind}" if kind else "neither a run folder nor a model folder"
        raise click.UsageError(
            f"{folder} is {what}: accept takes a run folder (.graft-run, or an older graft's "
            "config.json) or a model folder (config.json with its model_type)"
        )


if __name__ == "__main__":
    common.standalone(accept)
