"""``graft-exp repair``: a run folder's ``config.json`` restored when it was replaced (by
another run's) or damaged, from the copy the folder's ``.graft-run`` marker keeps, when that
copy is the one the folder's tables were computed with (their run key). Nothing is
recomputed and no table is touched: the way out of a state where ``plot`` says "rerun" and
the rerun refuses the folder as another configuration's."""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import polars as pl

from graft.errors import RunFolderError
from graft.results.folder import MARKER_FILE, RunFolder
from graft.results.run_config import CONFIG_FILE
from graft.results.run_tables import PARTS_DIR, SET_ASIDE_DIR, refuse_special_files
from graft.storage.failures import reading
from graft.storage.files import special_file
from graft.storage.tables import META_PREFIX


def tables_run_key(folder: str | os.PathLike[str]) -> str | None:
    """The run key most of the folder's marked tables record (None: no marked table)."""
    path = Path(folder)
    files = [*path.glob("*.parquet"), *(path / PARTS_DIR).glob("*/*.parquet")]
    keys: collections.Counter[str] = collections.Counter()
    for file in files:
        if SET_ASIDE_DIR in file.parts or file.name.startswith(".") or special_file(file):
            continue  # a FIFO would block the read
        try:
            key = pl.read_parquet_metadata(file).get(f"{META_PREFIX}run_key")
        except (pl.exceptions.PolarsError, OSError):
            continue
        if key:
            keys[key] += 1
    return keys.most_common(1)[0][0] if keys else None


def _read(path: Path) -> dict | None:
    try:
        with reading(f"the run folder's {path.name}", path):
            text = path.read_text(encoding="utf-8")
        value = json.loads(text)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def repair_run_folder(folder: str | os.PathLike[str]) -> str:
    """Restore ``config.json`` from the marker's copy when it differs from it and the copy's
    run key is the tables'; returns what was done, in words.

    Raises:
        RunFolderError: no run folder of graft's, or no copy that fits the tables (then
            only a rerun with --overwrite, or a new --out, gets out).
    """
    path = Path(folder)
    refuse_special_files(path)
    if not (path / MARKER_FILE).is_file():
        raise RunFolderError(f"{path} is no run folder of graft's (no {MARKER_FILE})")
    copy = (_read(path / MARKER_FILE) or {}).get("config")
    config = _read(path / CONFIG_FILE)
    want = tables_run_key(path)
    if config is not None and (want is None or config.get("run_key") == want):
        return f"{path}: config.json fits the tables; nothing to repair"
    state = "damaged" if config is None else "another run's"
    if not isinstance(copy, dict) or (want is not None and copy.get("run_key") != want):
        raise RunFolderError(
            f"{path}: config.json is {state} and the folder keeps no copy of its own (a folder "
            "of a graft before 2026-11-28); rerun the experiment with --overwrite, or into a "
            "new --out"
        )
    RunFolder(path).store_config(copy)
    return f"{path}: config.json was {state}; restored the folder's own copy (run key {want})"
