"""Files that are either whole or absent: atomic writes, JSON-ready copies, flat tables, and
the checks around them (commit hooks, special files, the umask, a writable folder).

Every file is written to a temp file (``.<name>.<pid>.<random>.tmp``) in the same folder and
moved into place with ``os.replace``, so an interruption never leaves a half-written file under
a real name. A write or read that the storage refuses is said in one line by
:mod:`graft.storage.failures`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import json
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graft.errors import DamagedFileError
from graft.storage.failures import printable

if TYPE_CHECKING:  # the NDIF server's venv imports this module and has no polars
    import polars as pl


#: Checks that run before every commit (:func:`check_commit`); graft.storage.locks adds one.
_BEFORE_COMMIT: list[Callable[[], None]] = []


def before_commit(check: Callable[[], None]) -> None:
    """Run ``check`` before every commit (:func:`check_commit`): it raises to stop it."""
    _BEFORE_COMMIT.append(check)


def check_commit() -> None:
    """Before a write into shared state becomes visible (a rename into place, a removal):
    raise if this process may no longer write there (a lease lock it lost:
    :class:`~graft.errors.LockLostError`)."""
    for check in _BEFORE_COMMIT:
        check()


def fsync(path: str | os.PathLike[str]) -> None:
    """Flush the file ``path`` to the disk; a folder too where the platform can (not every
    platform or filesystem can open or fsync a folder: skipped there)."""
    path = Path(path)
    with contextlib.suppress(OSError) if path.is_dir() else contextlib.nullcontext():
        fd = os.open(path, os.O_RDONLY)
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
        fsync(tmp)
        check_commit()
        os.replace(tmp, path)
        fsync(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temp folder beside ``path`` to fill; on success it becomes ``path``
    whole: its files and itself flushed to the disk, given the umask's modes
    (:func:`share_like_umask`), then renamed into place (an existing ``path`` moved aside
    first and removed after, so a reader never finds half of either). On an exception the
    temp folder is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        for file in tmp.rglob("*"):
            if file.is_file() and not file.is_symlink():
                fsync(file)
        share_like_umask(tmp)  # mkdtemp's 0700 folder: the umask's mode, as mkdir gives
        fsync(tmp)  # the files reach the disk before the rename makes them the folder
        check_commit()
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            path.rename(old)
            tmp.rename(path)
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()
        else:
            tmp.rename(path)
        fsync(path.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def utc_timestamp() -> str:
    """Now in UTC to the second (ISO 8601), as every record graft writes dates itself."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def probe_writable(folder: str | os.PathLike[str]) -> list[Path]:
    """Create ``folder`` (and its missing parents) and a temp file in it, then remove the
    file; return the folders this created, deepest first (the caller decides whether they
    stay). On failure those folders are removed again and the ``OSError`` is raised."""
    folder = Path(folder)
    created: list[Path] = []
    missing = folder
    while not missing.exists() and missing != missing.parent:
        created.append(missing)
        missing = missing.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".graft-probe-", suffix=".tmp")
        os.close(handle)
        os.unlink(probe)
    except OSError:
        remove_empty(created)
        raise
    return created


def remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is empty; leave the others."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def current_umask() -> int:
    """The process's umask: from ``/proc/self/status`` where Linux tells it (no window in
    which another thread sees a changed mask), else set and restored."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def share_like_umask(folder: str | os.PathLike[str]) -> None:
    """Give ``folder``, its sub-folders and its files the modes ``mkdir`` and ``open`` give
    (0o777 and 0o666 less the umask). Some writers create 0600 files whatever the umask
    (safetensors' weights file), and ``tempfile.mkdtemp`` 0700 folders, which other users
    of a shared workspace or cache then cannot read."""
    mask = current_umask()
    root = Path(folder)
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        if path.is_dir():
            path.chmod(0o777 & ~mask)
        elif path.is_file():
            path.chmod(0o666 & ~mask)


def special_file(path: str | os.PathLike[str]) -> str:
    """What ``path`` is when it is a special file that opening could block on or read
    forever from (``a FIFO``, ``a socket``, ``a device``), else "" (a regular file, a
    folder, or nothing there). Checked before graft opens what it did not write."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return ""


def refuse_special(path: str | os.PathLike[str]) -> None:
    """Raise :class:`~graft.errors.DamagedFileError` when ``path`` is a special file
    (:func:`special_file`): checked before graft opens it."""
    kind = special_file(path)
    if kind:
        raise DamagedFileError(
            f"{printable(path)} is {kind} where graft reads a regular file (opening it would "
            "wait or read forever); remove it (or put the file it stands for there), then rerun"
        )


def refuse_special_under(folder: str | os.PathLike[str], skip: tuple[str, ...] = ()) -> None:
    """:func:`refuse_special` for every file under ``folder`` (symlinks followed to their
    target, folders named in ``skip`` and their contents left out): a folder graft reads is
    checked whole before anything in it is opened."""
    root = Path(folder)
    if not root.is_dir():
        return
    for base, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        for name in files:
            refuse_special(Path(base) / name)


_HASHES: dict[tuple[str, int, int], str] = {}
_CHUNK = 1 << 22


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 (hex) of a file; computed once per process per (path, size, mtime)."""
    path = Path(path)
    refuse_special(path)
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
    import polars as pl

    nested = (pl.List, pl.Array, pl.Struct, pl.Object)
    replaced = []
    for name, dtype in df.schema.items():
        if isinstance(dtype, nested):
            values = [None if v is None else json.dumps(to_json(v)) for v in df[name].to_list()]
            replaced.append(pl.Series(name, values, dtype=pl.Utf8))
    return df.with_columns(replaced) if replaced else df
