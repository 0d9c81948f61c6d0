"""Files that are either whole or absent: atomic writes, JSON-ready copies, flat tables.

Every file is written to a temp file (``.<name>.<pid>.<random>.tmp``) in the same folder and
moved into place with ``os.replace``, so an interruption never leaves a half-written file under
a real name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from graft.errors import StorageError

#: errno values that mean "this storage cannot take the write" (not a bug of graft).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not supported on every platform / filesystem
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success move it onto ``path`` atomically.

    On an exception the temp file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def storage_errors(what: str, path: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Inside: a disk-full, quota, read-only or permission error becomes one
    :class:`StorageError` line naming the path (the error's own, else ``path``).

    ``what`` says what was being written (``"the result parts"``). The message ends with the
    fix: free space (or choose a writable place) and rerun, which resumes.
    """
    try:
        yield
    except OSError as err:
        if err.errno not in STORAGE_ERRNOS:
            raise
        where = err.filename or path
        reason = err.strerror or os.strerror(err.errno or 0)
        raise StorageError(
            f"cannot write {what} ({reason}: {where}); free space or choose a writable "
            "place, then rerun: it resumes where this run stopped"
        ) from None


_HASHES: dict[tuple[str, int, int], str] = {}
_CHUNK = 1 << 22


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 (hex) of a file; computed once per process per (path, size, mtime)."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHES:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented JSON via :func:`atomic_path` (see :func:`to_json`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(to_json(obj), indent=2) + "\n", encoding="utf-8")
    return Path(path)


def to_json(obj: Any) -> Any:
    """A JSON-ready copy of ``obj``: dataclasses, paths, sets, tuples, numpy/torch scalars
    and objects with ``to_dict()`` are converted; anything else unknown becomes ``str``."""

    def default(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.asdict(value)
        if hasattr(value, "to_dict"):
            return value.to_dict()
        if isinstance(value, set | frozenset):
            return sorted(value, key=str)
        if hasattr(value, "item") and callable(value.item):
            return value.item()
        return str(value)

    return json.loads(json.dumps(obj, default=default))


def flat_table(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with list, array, struct and object columns serialised to JSON strings."""
    nested = (pl.List, pl.Array, pl.Struct, pl.Object)
    replaced = []
    for name, dtype in df.schema.items():
        if isinstance(dtype, nested):
            values = [None if v is None else json.dumps(to_json(v)) for v in df[name].to_list()]
            replaced.append(pl.Series(name, values, dtype=pl.Utf8))
    return df.with_columns(replaced) if replaced else df
