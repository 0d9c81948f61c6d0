"""Storage that refuses a write or a read, said in one line: the errno however a library
raised it (an ``OSError``, or the ``(os error N)`` in the text of a library written in Rust),
the path, the reason and the fix (free space, another place, a look at the path), and
whether the rerun resumes (:func:`resumable` work)."""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from graft.errors import StorageError

#: errno values that mean "this storage cannot take the write" (not a bug of graft).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


#: How an errno reads inside the exceptions of libraries written in Rust (polars,
#: safetensors), which wrap the ``io::Error`` instead of raising an ``OSError``.
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


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
