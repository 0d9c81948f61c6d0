"""Files that are either whole or absent: atomic writes, JSON-ready copies, flat tables.

Every file is written to a temp file (``.<name>.<pid>.<random>.tmp``) in the same folder and
moved into place with ``os.replace``, so an interruption never leaves a half-written file under
a real name.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime as _dt
import errno
import hashlib
import json
import os
import re
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graft.errors import DamagedFileError, StorageError

if TYPE_CHECKING:  # the NDIF server's venv imports this module and has no polars
    import polars as pl

#: errno values that mean "this storage cannot take the write" (not a bug of graft).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


#: How an errno reads inside the exceptions of libraries written in Rust (polars,
#: safetensors), which wrap the ``io::Error`` instead of raising an ``OSError``.
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


#: Checks that run before every commit (:func:`check_commit`); graft.storage.locks adds one.
_BEFORE_COMMIT: list[Callable[[], None]] = []


#: Whether the work under way is one that its rerun resumes (:func:`resumable`: a run, a
#: finetune); a failed write says so only then (a plot, a compare, a publish, an accept is
#: simply rerun).
_RESUMABLE: contextvars.ContextVar[bool] = contextvars.ContextVar("graft_resumable", default=False)


@contextlib.contextmanager
def resumable() -> Iterator[None]:
    """Inside: the work is one that its rerun resumes (a run's batches, a finetune's
    checkpoints), so a failed write's line ends "then rerun: it resumes where this run
    stopped" (:func:`rerun_hint`); outside, "then rerun" alone."""
    token = _RESUMABLE.set(True)
    try:
        yield
    finally:
        _RESUMABLE.reset(token)


def rerun_hint() -> str:
    """How a line that stopped the work ends: "then rerun", and that the rerun resumes
    when the work is :func:`resumable`."""
    return "then rerun: it resumes where this run stopped" if _RESUMABLE.get() else "then rerun"


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


def utc_timestamp() -> str:
    """Now in UTC to the second (ISO 8601), as every record graft writes dates itself."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


#: errno values of a full disk or quota: the fix is to free space.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: errno values of a place this user may not write (or read): the fix is another place.
DENIED_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
#: The errno a Python error of a library that leaves ``errno`` unset stands for.
_ERRNO_OF_TYPE: tuple[tuple[type[OSError], int], ...] = (
    (PermissionError, errno.EACCES),
    (FileNotFoundError, errno.ENOENT),
    (IsADirectoryError, errno.EISDIR),
    (NotADirectoryError, errno.ENOTDIR),
    (FileExistsError, errno.EEXIST),
)


def storage_errno(err: BaseException) -> int | None:
    """The errno of a storage error, however its library raised it; None when ``err`` is
    none. An ``OSError``'s ``errno`` field where it is set; else the ``(os error N)`` that
    libraries written in Rust (polars, safetensors) put in their text, whether they raise
    an ``OSError`` without an errno (polars' ``PermissionError``) or their own exception;
    else what an ``OSError`` subclass stands for (``PermissionError``: ``EACCES``). The one
    place where graft reads an errno from an error's text."""
    if isinstance(err, OSError) and isinstance(err.errno, int):
        return err.errno
    match = _RUST_OS_ERROR.search(str(err))
    if match:
        return int(match.group(1))
    if isinstance(err, OSError):
        for kind, code in _ERRNO_OF_TYPE:
            if isinstance(err, kind):
                return code
    return None


def _error_path(err: BaseException) -> str | None:
    """The path an error names: an ``OSError``'s ``filename``, else what follows the
    ``(os error N):`` of a Rust library's text (polars: ``... (os error 13): /a/b``)."""
    filename = getattr(err, "filename", None)
    if filename:
        return os.fsdecode(filename)
    text = str(err)
    match = _RUST_OS_ERROR.search(text)
    rest = text[match.end() :].lstrip(":").strip() if match else ""
    return rest.splitlines()[0] if rest else None


def printable(path: str | os.PathLike[str] | None) -> str:
    """``path`` as a line can print it: bytes that are no UTF-8 (held as surrogates) as
    ``\\xff`` escapes."""
    if path is None:
        return ""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def storage_error(
    err: BaseException, what: str, path: str | os.PathLike[str] | None = None, *, action="write"
) -> StorageError | None:
    """``err`` as one :class:`StorageError` line when it is a storage error of any errno
    (:func:`storage_errno`), else None. ``what`` says what was being written (or read:
    ``action="read"``); the message names the path (the error's own, else ``path``), the
    reason and the fix: free space (full disk, quota), a place this user may write
    (permission, read-only), else a look at that path; then rerun (which resumes, inside
    :func:`resumable` work)."""
    code = storage_errno(err)
    if code is None:
        return None
    where = printable(_error_path(err) or path)
    reason = getattr(err, "strerror", None) or os.strerror(code)
    if action == "read":
        if code in DENIED_ERRNOS:
            fix = "ask its owner for read access, or copy it somewhere you can read"
        else:
            fix = "check that path (a disk error, a file removed or renamed?)"
        return StorageError(f"cannot read {what} ({reason}: {where}); {fix}")
    if code in FULL_ERRNOS | DENIED_ERRNOS:
        fix = "free space or choose a writable place"
    else:
        fix = "check that path (a folder removed or renamed, a disk error?)"
    return StorageError(f"cannot write {what} ({reason}: {where}); {fix}, {rerun_hint()}")


@contextlib.contextmanager
def storage_errors(
    what: str,
    path: str | os.PathLike[str] | None = None,
    wrapped: tuple[type[BaseException], ...] = (),
) -> Iterator[None]:
    """Inside: an ``OSError`` of any errno (a full disk, a quota, a read-only or forbidden
    place, a removed folder, a disk error) becomes one :class:`StorageError` line naming
    the path (the error's own, else ``path``) and the fix (:func:`storage_error`).

    ``what`` says what was being written (``"the result parts"``). ``wrapped``: exception
    types of libraries written in Rust (polars, safetensors) that carry the errno in their
    text (``... (os error 28)``) instead of raising an ``OSError``; those whose text names
    no errno pass through unchanged, unless the disk itself refuses a write now (polars'
    parquet writer on a full disk says only "Invalid thrift: transport error").
    """
    try:
        yield
    except wrapped as err:
        if storage_errno(err) is None:
            code = _storage_errno_at(path)
            if code not in STORAGE_ERRNOS:
                raise
            err = OSError(code, os.strerror(code), None if path is None else str(path))
        found = storage_error(err, what, path)
        if found is None:
            raise
        raise found from None
    except OSError as err:
        found = storage_error(err, what, path)
        if found is None:
            raise
        raise found from None


@contextlib.contextmanager
def reading(what: str, path: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Inside: a read that this user may not make (permission) becomes one
    :class:`StorageError` line (:func:`storage_error`, ``action="read"``), whether the
    ``OSError`` carries its errno or only its text (polars); other errors pass through (a
    damaged file is the reader's to judge)."""
    try:
        yield
    except Exception as err:
        found = storage_error(err, what, path, action="read")
        if found is None or storage_errno(err) not in DENIED_ERRNOS:
            raise
        raise found from None


def uncaught_storage_error(err: BaseException) -> StorageError | None:
    """The command line's last resort: ``err``, which no reader or writer of graft turned
    into its own line, as one :class:`StorageError` line when it is a storage error of any
    errno (:func:`storage_errno`: an ``OSError``, or a library's error whose text names an
    ``os error``), else None (a bug: its traceback stays). A closed output pipe is none."""
    if isinstance(err, BrokenPipeError) or storage_errno(err) is None:
        return None
    code = storage_errno(err)
    where = printable(_error_path(err)) or "a path graft was using"
    reason = getattr(err, "strerror", None) or os.strerror(code or 0)
    return StorageError(
        f"a file could not be read or written ({reason}: {where}); check that path (its "
        "permissions, free space, whether it still exists), then rerun"
    )


#: Bytes :func:`_storage_errno_at` tries to write to tell a full disk.
PROBE_BYTES = 1 << 20


def _storage_errno_at(path: str | os.PathLike[str] | None) -> int | None:
    """After a failed write of ``path``: the storage errno (full disk, quota, read-only)
    that writing :data:`PROBE_BYTES` beside it raises now, or None when that succeeds."""
    folder = Path(path).parent if path is not None else None
    if folder is None or not folder.is_dir():
        return None
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".graft-probe-", suffix=".tmp")
    except OSError as err:
        return err.errno
    try:
        data, written = bytes(PROBE_BYTES), 0
        while written < PROBE_BYTES:  # a full disk may take part of a write, then refuse
            written += os.write(handle, data[written:])
        os.fsync(handle)
    except OSError as err:
        return err.errno
    finally:
        os.close(handle)
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return None


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
