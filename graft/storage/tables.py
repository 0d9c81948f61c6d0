"""Tables that carry their provenance: parquet files whose metadata records what they are.

Every table graft writes (a run's parts and combined tables, summaries, contrasts) records
in its parquet metadata (``graft.*`` keys) its table name, its run's key (a hash of the
config fields a resume must share), its batch id (parts), its row count and a digest of its
content (:func:`frame_digest`). :func:`table_problem` and :func:`read_table` check a table
against that record when it is read back, so a damaged, edited or another run's table is
found instead of used. Writes are atomic (:func:`graft.storage.files.atomic_path`) and a
full disk is one :class:`~graft.errors.StorageError` line (:func:`writing`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from graft.errors import DamagedFileError, first_line
from graft.storage.failures import reading, storage_errors
from graft.storage.files import atomic_path, flat_table, special_file

#: Prefix of graft's keys in a table's parquet metadata.
META_PREFIX = "graft."
#: The fix a damaged table's message names.
REBUILD_FIX = "rerun the experiment with the same --out to rebuild it"
#: Why a table without ``graft.*`` metadata is not read as it is.
UNMARKED = (
    "carries no graft marks (rewritten by another tool, or written by a graft before tables "
    "recorded them)"
)
#: The fix that adopts a folder's unmarked tables as they are (an explicit choice).
ACCEPT_FIX = "or, to read it as it is, graft-exp accept {folder}"


def frame_digest(df: pl.DataFrame) -> str:
    """The sha256 (hex) of ``df``'s content: each column's name, dtype and values as JSON.

    Python's JSON of the values, not polars' own serialisation: the digest is the same in
    every process and survives polars upgrades that change its file or text formats.
    """
    digest = hashlib.sha256()
    for name, dtype in df.schema.items():
        digest.update(json.dumps([name, str(dtype)]).encode())
        digest.update(json.dumps(df[name].to_list(), default=str).encode())
    return digest.hexdigest()


def table_metadata(
    df: pl.DataFrame, table: str, run_key: str = "", batch: str = "", options: str = ""
) -> dict[str, str]:
    """The ``graft.*`` parquet metadata of ``df`` stored as ``table`` (batch ``batch``);
    ``options``: the digest of the run options it was computed with (derived tables: a
    summary computed with another ``--n-boot`` records another digest), ``""`` for parts."""
    return {
        f"{META_PREFIX}table": table,
        f"{META_PREFIX}run_key": run_key,
        f"{META_PREFIX}batch": batch,
        f"{META_PREFIX}options": options,
        f"{META_PREFIX}rows": str(df.height),
        f"{META_PREFIX}sha256": frame_digest(df),
    }


def writing(what: str, path: str | os.PathLike[str]) -> contextlib.AbstractContextManager[None]:
    """:func:`graft.storage.failures.storage_errors`, also for the storage errors that polars
    wraps in its own exceptions (``... No space left on device (os error 28)``)."""
    return storage_errors(what, path, wrapped=(pl.exceptions.PolarsError,))


def save_table(
    df: pl.DataFrame,
    path: str | os.PathLike[str],
    table: str,
    run_key: str = "",
    batch: str = "",
    options: str = "",
) -> Path:
    """Write ``df`` to ``path`` atomically, with its :func:`table_metadata`."""
    path = Path(path)
    metadata = table_metadata(df, table, run_key, batch, options)
    with writing(f"the table {table}", path), atomic_path(path) as tmp:
        df.write_parquet(tmp, metadata=metadata)
    return path


def write_csv(df: pl.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write ``df`` (nested columns as JSON, :func:`flat_table`) to ``path`` atomically."""
    path = Path(path)
    with writing("a table", path), atomic_path(path) as tmp:
        flat_table(df).write_csv(tmp)
    return path


def table_problem(path: Path, expect: Mapping[str, str]) -> tuple[pl.DataFrame | None, str | None]:
    """Read the table at ``path`` and check it: ``(frame, None)`` when it is sound, else
    ``(frame or None, why not)``. ``expect`` maps metadata keys (``table``, ``run_key``,
    ``batch``) to their values; a table without ``graft.*`` metadata is not sound
    (:data:`UNMARKED`): ``graft-exp accept`` marks such tables when a user chooses to read
    them as they are (:func:`mark_table`). A special file (a FIFO: opening it would wait
    for a writer) is not read at all."""
    special = special_file(path)
    if special:
        return None, f"is {special}, not a parquet file"
    try:
        with reading("a table", path):
            metadata = pl.read_parquet_metadata(path)
            frame = pl.read_parquet(path)
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException, OSError) as err:
        return None, f"is not a readable parquet file ({first_line(err, 200)})"
    ours = {k[len(META_PREFIX) :]: v for k, v in metadata.items() if k.startswith(META_PREFIX)}
    if not ours:
        return frame, UNMARKED
    for field_name, want in expect.items():
        have = ours.get(field_name)
        if have != want:
            return frame, f"records {field_name} {have!r} where {want!r} belongs"
    if ours.get("rows") != str(frame.height):
        return frame, f"holds {frame.height} rows, its record says {ours.get('rows')}"
    if ours.get("sha256") != frame_digest(frame):
        return frame, "does not match the digest of its content (edited or damaged)"
    return frame, None


def read_table(
    path: str | os.PathLike[str],
    table: str,
    run_key: str = "",
    fix: str = REBUILD_FIX,
    options: str = "",
) -> pl.DataFrame:
    """The table ``table`` stored at ``path``, checked (:func:`table_problem`); with
    ``run_key`` (its run's ``config.json`` records one), a table that records another run
    key is refused too (a table that records none, such as a combined summary of several
    runs, is not); with ``options`` (the digest of the options ``config.json`` records,
    :func:`graft.results.run_config.options_digest`), so is a table computed with other
    options (say another ``--n-boot``: a rerun killed before it recorded them, or a table
    copied from another run); a table that records no options digest is not.

    Raises:
        DamagedFileError: the file is unreadable, another table or run's, or its digest
            differs.
    """
    path = Path(path)
    frame, problem = table_problem(path, {"table": table})
    if problem is None and run_key:
        recorded = pl.read_parquet_metadata(path).get(f"{META_PREFIX}run_key")
        if recorded and recorded != run_key:
            problem = "is another run's table (its run key is not the one config.json records)"
            fix = f"{fix}, or, if config.json was replaced, graft-exp repair {path.parent}"
    if problem is None and options:
        recorded = pl.read_parquet_metadata(path).get(f"{META_PREFIX}options")
        if recorded and recorded != options:
            problem = (
                "was computed with other options than config.json records (another "
                "--n-boot, say: a rerun stopped before it finished, or a copied table)"
            )
    if problem is not None or frame is None:
        if problem == UNMARKED:
            fix = f"{fix}, {ACCEPT_FIX.format(folder=path.parent)}"
        raise DamagedFileError(f"{path} {problem}; {fix}")
    return frame


def is_marked(path: str | os.PathLike[str]) -> bool:
    """Whether the parquet file at ``path`` carries ``graft.*`` metadata (False when it does
    not parse, or is a special file such as a FIFO)."""
    if special_file(path):
        return False
    try:
        with reading("a table", path):  # a table this user may not read: one line
            metadata = pl.read_parquet_metadata(Path(path))
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException, OSError):
        return False
    return any(k.startswith(META_PREFIX) for k in metadata)


def mark_table(
    path: str | os.PathLike[str],
    table: str,
    run_key: str = "",
    batch: str = "",
    options: str = "",
) -> Path:
    """Rewrite the unmarked table at ``path`` with graft's marks for its content as it is
    now (``graft-exp accept``: the user's explicit choice to read it as it is)."""
    path = Path(path)
    with writing(f"the table {table}", path):
        frame = pl.read_parquet(path)
    return save_table(frame, path, table, run_key, batch, options)
