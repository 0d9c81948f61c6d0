"""Lease locks (``GRAFT_LOCK_MODE=lease``, :mod:`graft.storage.locks`): a lock file with a
token of its own that its holder renews, which a waiter removes once its lease ran out.

Removing a lock file is itself exclusive, so that no process removes a lease it did not
read (several waiters on a stale lease, a paused holder's late release), and a holder checks
before each commit that its token is still the lock file's (:func:`check_held`), so that one
paused past its lease stops with one :class:`~graft.errors.LockLostError` line instead of
writing beside the process that took the lock over.

Why not ``filelock``'s ``SoftFileLease`` (filelock >= 3.30; it has tokens and loss
detection too): it takes a stale lease over only through Linux's ``renameat2`` with
``RENAME_EXCHANGE`` (or macOS's ``renamex_np``), which NFS and Lustre, the file systems this
mode is for, refuse; there a dead holder's lease would never pass on. The claim files here
need only ``O_CREAT | O_EXCL`` and ``rename``, atomic on both.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path

from graft.errors import LockLostError
from graft.storage.failures import rerun_hint
from graft.storage.files import before_commit, utc_timestamp

logger = logging.getLogger("graft.storage.locks")  # one logger for both lock modes


def holder_record(what: str) -> dict[str, object]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": utc_timestamp(),
        "what": what,
    }


def record_text(record_file: Path) -> str:
    """Who holds a lock as the record in ``record_file`` says (``host pid N since T``), or
    ``"holder unknown"``."""
    try:
        record = json.loads(record_file.read_text(encoding="utf-8"))
        return f"{record['host']} pid {record['pid']} since {record['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


#: The lease locks this process holds, checked before every commit (:func:`check_held`).
_HELD: set[LeaseLock] = set()
_HELD_GUARD = threading.Lock()


def check_held() -> None:
    """Raise :class:`~graft.errors.LockLostError` when a lease lock this process holds was
    taken over by another process (this one was paused past its lease: a suspended job, a
    stopped process, a frozen node). :func:`graft.storage.files.atomic_path` calls it before
    each commit, so a holder that lost its lock writes nothing more into what it locked."""
    with _HELD_GUARD:
        held = list(_HELD)
    for lock in held:
        lock.check()


before_commit(check_held)


def _token(text: str) -> str | None:
    """The token in a lease file's text, or None (a torn write, an older graft's lease)."""
    try:
        token = json.loads(text).get("token")
    except (ValueError, AttributeError):
        return None
    return token if isinstance(token, str) and token.isalnum() else None


def _make_claim(claim: Path, stale_after: float | None) -> bool:
    """Create ``claim`` exclusively (the right to remove one lock file); whether this process
    did. A claim left for longer than ``stale_after`` seconds by a process killed while it
    removed a lock file is removed (by whoever renames it aside first), to be claimed anew
    at the next try."""
    me = f"{socket.gethostname()} {os.getpid()} {secrets.token_hex(8)}"
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    except FileExistsError:
        if stale_after is not None:
            _remove_stale_claim(claim, stale_after)
        return False
    try:
        os.write(fd, me.encode())
    finally:
        os.close(fd)
    return True


def _remove_stale_claim(claim: Path, stale_after: float) -> None:
    try:
        seen = claim.stat()
        if time.time() - seen.st_mtime < stale_after:
            return
        aside = claim.with_name(f"{claim.name}.stale-{secrets.token_hex(8)}")
        claim.rename(aside)  # of several processes, one renames it
    except OSError:
        return
    with contextlib.suppress(OSError):
        now = aside.stat()
        if (now.st_ino, now.st_mtime_ns) != (seen.st_ino, seen.st_mtime_ns):
            os.link(aside, claim)  # a fresh claim made meanwhile: put it back
    with contextlib.suppress(OSError):
        aside.unlink()


def _describe(text: str) -> str:
    try:
        record = json.loads(text)
        return f"{record['host']} pid {record['pid']}"
    except (ValueError, KeyError, TypeError):
        return "its holder"


class LeaseLock:
    """A lock file with a lease (``GRAFT_LOCK_MODE=lease``; see the module docstring).

    Each hold writes a fresh token into the lock file. Removing a lock file (a stale one, or
    the holder's own at release) is claimed first by creating ``<lock>.break-<token>``
    exclusively: of several processes only the one that made that file removes the lock
    file, and only after checking it is still the file whose token it read (its inode, kept
    open, and its mtime unchanged). So a waiter never removes a newer holder's lease, and a
    holder never removes its successor's.

    Args:
        path: the lock file.
        lease: seconds a holder's last touch stays valid.
    """

    def __init__(self, path: Path, lease: float) -> None:
        self.path, self.lease = path, lease
        self.token: str | None = None
        self._fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _claim(self, key: str) -> Path:
        """The file whose exclusive creation gives the right to remove the lock file of
        ``key`` (its token)."""
        return self.path.with_name(f"{self.path.name}.break-{key}")

    def try_acquire(self, what: str) -> bool:
        """Take the lock if it is free (or its holder's lease ran out); never waits."""
        token = secrets.token_hex(16)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
            except FileExistsError:
                if not self._break_stale():
                    return False
                continue
            try:
                os.write(fd, json.dumps({**holder_record(what), "token": token}).encode())
                os.fsync(fd)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    self.path.unlink()
                raise
            self.token, self._fd = token, fd
            with _HELD_GUARD:
                _HELD.add(self)
            self._stop.clear()
            self._thread = threading.Thread(target=self._renew, args=(fd,), daemon=True)
            self._thread.start()
            return True
        return False

    def holds(self) -> bool:
        """Whether this process still holds the lease: the lock file is the one it made, with
        its token, and no waiter has begun to remove it (which a waiter does only once the
        lease ran out, e.g. while this process was paused). A file system that fails to
        answer (another error than a missing file) is taken to say yes: the renewal goes on,
        and the commit this check guards meets the same error."""
        if self.token is None or self._fd is None:
            return False
        try:
            if _token(self.path.read_text(encoding="utf-8", errors="replace")) != self.token:
                return False
            return not self._claim(self.token).exists()
        except FileNotFoundError:
            return False
        except OSError:
            return True

    def check(self) -> None:
        """Raise :class:`~graft.errors.LockLostError` when this process lost the lease."""
        if self.token is not None and not self.holds():
            raise LockLostError(
                f"the lock {self.path} was taken over by another process ({self.holder()}) "
                f"while this one was paused past its lease (GRAFT_LOCK_LEASE={self.lease:g} s): "
                f"stopped before writing anything more; {rerun_hint()}"
            )

    def _break_stale(self) -> bool:
        """Remove the lock file when its lease ran out, if this process wins the right to;
        whether the lock file is gone (try to create it again)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return True
        try:  # the open file keeps its inode from being reused while it is compared
            seen = os.fstat(fd)
            if time.time() - seen.st_mtime < self.lease:
                return False
            text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            key = _token(text) or f"{seen.st_ino}-{seen.st_mtime_ns}"  # no token: a torn write
            if not _make_claim(self._claim(key), self.lease):
                return False  # another process is removing it
            try:
                now = os.stat(self.path)
                if (now.st_dev, now.st_ino, now.st_mtime_ns) != (
                    seen.st_dev,
                    seen.st_ino,
                    seen.st_mtime_ns,
                ):
                    return False  # renewed, or another holder's file since: not stale
                logger.warning(
                    "lock %s: the lease of %s ran out (dead or paused?); taking it",
                    self.path,
                    _describe(text),
                )
                self.path.unlink()
            except FileNotFoundError:
                pass
            finally:
                with contextlib.suppress(FileNotFoundError):
                    self._claim(key).unlink()
            return True
        finally:
            os.close(fd)

    def _renew(self, fd: int) -> None:
        while not self._stop.wait(self.lease / 4):
            if not self.holds():
                return  # lost: touching our own file would do no harm, but tells nothing
            with contextlib.suppress(OSError):  # its own file (a path could be a successor's)
                os.utime(fd if os.utime in os.supports_fd else self.path)

    def release(self) -> None:
        """Stop renewing and remove the lock file, unless it is no longer this hold's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with _HELD_GUARD:
            _HELD.discard(self)
        token, fd, self.token, self._fd = self.token, self._fd, None, None
        if token is None or fd is None:
            return
        try:
            claim = self._claim(token)
            if not _make_claim(claim, None):
                return  # a waiter is removing it: it ran out while this process was paused
            try:
                on_disk, mine = os.stat(self.path), os.fstat(fd)
                if (on_disk.st_dev, on_disk.st_ino) == (mine.st_dev, mine.st_ino):
                    self.path.unlink()
            except FileNotFoundError:
                pass
            finally:
                with contextlib.suppress(FileNotFoundError):
                    claim.unlink()
        finally:
            os.close(fd)

    def holder(self) -> str:
        """Who holds the lease: the lock file is its holder's record."""
        return record_text(self.path)
