"""``graft-exp repair``: a run folder's replaced or damaged config.json restored."""

from __future__ import annotations

from pathlib import Path

import click

from graft_experiments import common


@click.command(cls=common.GraftCommand)
@click.argument("run_folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
def repair(run_folder: Path) -> None:
    """Restore RUN_FOLDER's config.json when it was replaced (by another run's) or damaged,
    from the copy the folder keeps, when that copy is the one its tables were computed with.
    Nothing is recomputed; a folder that keeps no fitting copy is one line naming the ways
    out (--overwrite, a new --out)."""
    from graft.results import repair_run_folder

    click.echo(repair_run_folder(run_folder))


if __name__ == "__main__":
    common.standalone(repair)
