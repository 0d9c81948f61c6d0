"""``graft-exp accept``: the explicit choice to read a folder's unmarked tables as they are.

graft refuses a table without its marks (:data:`graft.storage.tables.UNMARKED`): it may be
another tool's rewrite of a run's table, or a table of a graft before tables recorded their
marks. :func:`accept_run_tables` marks every such table of a run folder for its content as
it is now, and records in the run's ``config.json`` (``accepted``: when, by which command,
which files) that the user chose to; from then on the tables are checked like any other.

Marking and recording are one step: the record is stored first, as ``pending``, listing
every file about to be marked, then the files are marked, then the record is stored done.
A kill mid-way leaves no marked table the record does not list; the next ``accept`` finds
the pending record, marks what is left and completes it.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote

from graft.errors import RunFolderError
from graft.results.folder import MARKER_FILE, RunFolder
from graft.results.provenance import command_line
from graft.results.run_config import options_digest
from graft.results.run_tables import PARTS_DIR, SET_ASIDE_DIR, refuse_special_files
from graft.storage.files import utc_timestamp
from graft.storage.tables import is_marked, mark_table


def unmarked_tables(folder: str | os.PathLike[str]) -> list[Path]:
    """The parquet tables of the run folder ``folder`` that carry no graft marks (set-aside
    parts excepted)."""
    path = Path(folder)
    files = sorted(path.glob("*.parquet"))
    files += sorted(
        p for p in (path / PARTS_DIR).glob("*/*.parquet") if SET_ASIDE_DIR not in p.parts
    )
    return [f for f in files if not f.name.startswith(".") and not is_marked(f)]


def accept_run_tables(folder: str | os.PathLike[str]) -> list[Path]:
    """Mark every unmarked table of the run folder ``folder`` as it is and record the
    choice in its ``config.json`` (first as pending, done once all are marked); returns the
    files the record lists (none: nothing recorded). An accept stopped mid-way is
    completed: its pending record gains what is left.

    Raises:
        RunFolderError: ``folder`` is no run folder graft made (no ``.graft-run`` marker or
            no ``config.json``).
    """
    run = RunFolder(folder)
    refuse_special_files(run.path)
    config = run.read_config()
    if config is None or not run.is_marked():
        raise RunFolderError(
            f"{run.path} is no run folder of graft's (no {MARKER_FILE} and config.json); give "
            "a folder an experiment wrote (--out)"
        )
    if not run.marker_path.is_file():  # an older graft's run folder, known by its config
        run.store_config(config)  # gets its marker (with the config's copy)
    run_key = str(config.get("run_key") or "")
    entries = config.setdefault("accepted", [])
    pending = next((e for e in entries if isinstance(e, dict) and e.get("pending")), None)
    files = unmarked_tables(run.path)
    if not files and pending is None:
        return []
    if pending is None:
        pending = {"time": utc_timestamp(), "command": command_line(), "files": []}
        entries.append(pending)
    names = [str(f.relative_to(run.path)) for f in files]
    pending["files"] = list(dict.fromkeys([*pending["files"], *names]))
    pending["pending"] = True
    run.store_config(config)  # listed before any is marked (the marker's copy too)
    options = options_digest(config)
    for file in files:
        if file.parent.parent.name == PARTS_DIR:
            mark_table(file, file.parent.name, run_key, unquote(file.stem), options)
        else:
            mark_table(file, file.stem, run_key, options=options)
    del pending["pending"]
    run.store_config(config)  # graft-exp repair restores this one
    return [run.path / f for f in pending["files"]]
