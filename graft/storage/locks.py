"""Cross-process locks: what several jobs on one workspace build once, and run folders one
process writes at a time.

A SLURM job array starts many ``graft-exp`` commands at once on one workspace. A dataset, a
finetuned donor and a run folder are each built by one process while the others wait (a
message says for what, and who holds the lock: host, pid, since when) and then use what it
made. Lock files live in one folder of their own (a workspace's ``.locks/``), named by the
locked path's name and a hash of where it is (the path resolved, so a folder reached through
a symlink has one lock), so that nothing is written beside a user's folders; they stay on
disk and hold nothing (the holder's host, pid and start are in ``<lock>.holder``).

Two lock modes (``GRAFT_LOCK_MODE``):

- ``os`` (default): ``filelock``'s ``fcntl`` lock. The operating system releases it when its
  process dies, so a lock left by a killed job never blocks. It holds on a local disk, on
  NFS v4 (locks are part of the protocol) and on Lustre mounted with ``-o flock``; on NFS v3
  it needs a working lock daemon (``lockd``/NLM), and on Lustre mounted without ``flock`` (or
  with ``localflock``) it does not hold across nodes.
- ``lease``: a lock file created atomically (``O_CREAT | O_EXCL``, atomic on NFS v3 and later
  and on Lustre) that its holder touches every quarter of a lease (``GRAFT_LOCK_LEASE``
  seconds, default 60) from a background thread; a waiter that finds it untouched for a whole
  lease takes its holder for dead, removes it and tries again. It needs nothing of the file
  system's locking, only clocks that agree within a fraction of the lease.

A waiter gives up after ``GRAFT_LOCK_TIMEOUT`` seconds (default 86,400: a day, longer than
any finetune here) with one :class:`~graft.errors.LockTimeoutError` line naming the holder.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from graft.errors import LockTimeoutError, StorageError
from graft.storage.files import utc_timestamp

logger = logging.getLogger(__name__)

#: Seconds between two tries of a process that waits for a lock.
POLL_SECONDS = 0.5
#: The lock modes (``GRAFT_LOCK_MODE``).
LOCK_MODES = ("os", "lease")
#: Defaults of the environment variables that set a wait's bound and a lease's length.
DEFAULT_TIMEOUT_S = 86_400.0
DEFAULT_LEASE_S = 60.0
#: Errors that say a folder cannot hold lock files (read-only store, no permission).
UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise StorageError(f"{name}={text!r}: give a number of seconds > 0 (default {default:g})")
    return value


def lock_settings() -> tuple[str, float, float]:
    """``(mode, timeout seconds, lease seconds)`` from ``GRAFT_LOCK_MODE``,
    ``GRAFT_LOCK_TIMEOUT`` and ``GRAFT_LOCK_LEASE``."""
    mode = os.environ.get("GRAFT_LOCK_MODE", "os")
    if mode not in LOCK_MODES:
        raise StorageError(f"GRAFT_LOCK_MODE={mode!r}: use os (the default) or lease")
    return (
        mode,
        _seconds("GRAFT_LOCK_TIMEOUT", DEFAULT_TIMEOUT_S),
        _seconds("GRAFT_LOCK_LEASE", DEFAULT_LEASE_S),
    )


def lock_path(path: str | os.PathLike[str], lock_dir: str | os.PathLike[str]) -> Path:
    """The lock file of ``path`` in ``lock_dir``: ``<name>-<hash>.lock``, hashing ``path``
    (resolved: symlinks followed) relative to the folder holding ``lock_dir`` (a workspace
    mounted at other paths on other nodes keeps its lock names) or, outside it, its
    resolved path."""
    absolute, home = Path(path).resolve(), Path(lock_dir).resolve().parent
    key = absolute.relative_to(home) if absolute.is_relative_to(home) else absolute
    digest = hashlib.sha256(str(key).encode()).hexdigest()[:16]
    return Path(lock_dir) / f"{absolute.name[:80]}-{digest}.lock"


def writable_lock_dir(preferred: str | os.PathLike[str], fallback: str | os.PathLike[str]) -> Path:
    """``preferred`` when lock files can be made there, else ``fallback`` (said in a
    warning): a workspace of finished donors may be a read-only store shared by users."""
    preferred = Path(preferred)
    try:
        preferred.mkdir(parents=True, exist_ok=True)
        if os.access(preferred, os.W_OK):
            return preferred
    except OSError as err:
        if err.errno not in UNWRITABLE:
            raise
    logger.warning(
        "the lock folder %s cannot be written (a read-only store?): run folder locks go to %s",
        preferred,
        fallback,
    )
    return Path(fallback)


def _holder_record(what: str) -> dict[str, object]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": utc_timestamp(),
        "what": what,
    }


def _record_text(record_file: Path) -> str:
    """Who holds a lock as the record in ``record_file`` says (``host pid N since T``), or
    ``"holder unknown"``."""
    try:
        record = json.loads(record_file.read_text(encoding="utf-8"))
        return f"{record['host']} pid {record['pid']} since {record['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def holder_text(lock: Path) -> str:
    """Who holds the ``os`` lock ``lock``, as its ``.holder`` record says."""
    return _record_text(lock.with_name(lock.name + ".holder"))


def _write_holder(lock: Path, what: str) -> None:
    with contextlib.suppress(OSError):  # the record only informs waiters
        lock.with_name(lock.name + ".holder").write_text(
            json.dumps(_holder_record(what)), encoding="utf-8"
        )


class LeaseLock:
    """A lock file with a lease (``GRAFT_LOCK_MODE=lease``; see the module docstring).

    Args:
        path: the lock file.
        lease: seconds a holder's last touch stays valid.
    """

    def __init__(self, path: Path, lease: float) -> None:
        self.path, self.lease = path, lease
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def try_acquire(self, what: str) -> bool:
        """Take the lock if it is free (or its holder's lease ran out); never waits."""
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self._break_stale():
                    return False
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(_holder_record(what), handle)
            self._stop.clear()
            self._thread = threading.Thread(target=self._renew, daemon=True)
            self._thread.start()
            return True
        return False

    def _break_stale(self) -> bool:
        """Remove the lock file when its lease ran out; whether it was removed."""
        try:
            before = self.path.stat()
        except FileNotFoundError:
            return True
        if time.time() - before.st_mtime < self.lease:
            return False
        with contextlib.suppress(FileNotFoundError):
            now = self.path.stat()
            if (now.st_ino, now.st_mtime) != (before.st_ino, before.st_mtime):
                return False  # renewed or replaced meanwhile
            logger.warning("lock %s: its holder's lease ran out (dead?); taking it", self.path)
            self.path.unlink()
        return True

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 4):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def holder(self) -> str:
        """Who holds the lease: the lock file is its holder's record."""
        return _record_text(self.path)


@contextlib.contextmanager
def exclusive(
    path: str | os.PathLike[str], what: str, lock_dir: str | os.PathLike[str] | None
) -> Iterator[bool]:
    """Hold the lock of ``path`` inside; ``what`` says what the holder does ("finetuning the
    donor ..."), for the message of a process that has to wait. Yields whether this process
    waited for another one (which may have built what it came for: check again).

    ``lock_dir`` (created when missing) holds the lock file: every process that may build
    ``path`` must name the same folder; ``None``: no lock (a caller outside a workspace).

    Raises:
        LockTimeoutError: another process held the lock longer than ``GRAFT_LOCK_TIMEOUT``.
    """
    if lock_dir is None:
        yield False
        return
    mode, timeout, lease = lock_settings()
    target = lock_path(path, lock_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    if mode == "lease":
        with _lease_held(LeaseLock(target.with_suffix(".lease"), lease), what, timeout) as waited:
            yield waited
        return
    lock = FileLock(target)
    waited = False
    try:
        lock.acquire(timeout=0)
    except Timeout:
        waited = True
        logger.warning(
            "another process is %s (lock %s, held by %s); waiting for it to finish (at most "
            "%g s: GRAFT_LOCK_TIMEOUT)",
            what,
            target,
            holder_text(target),
            timeout,
        )
        try:
            lock.acquire(timeout=timeout, poll_interval=POLL_SECONDS)
        except Timeout:
            raise _timed_out(target, holder_text(target), timeout) from None
    _write_holder(target, what)
    try:
        yield waited
    finally:
        lock.release()


@contextlib.contextmanager
def _lease_held(lock: LeaseLock, what: str, timeout: float) -> Iterator[bool]:
    waited = False
    deadline = time.monotonic() + timeout
    while not lock.try_acquire(what):
        if not waited:
            waited = True
            logger.warning(
                "another process is %s (lease lock %s, held by %s); waiting for it to finish "
                "(at most %g s: GRAFT_LOCK_TIMEOUT)",
                what,
                lock.path,
                lock.holder(),
                timeout,
            )
        if time.monotonic() > deadline:
            raise _timed_out(lock.path, lock.holder(), timeout)
        time.sleep(POLL_SECONDS)
    try:
        yield waited
    finally:
        lock.release()


def _timed_out(lock: Path, holder: str, timeout: float) -> LockTimeoutError:
    return LockTimeoutError(
        f"gave up waiting for the lock {lock} after {timeout:g} s (held by {holder}); if that "
        "job is dead on another node, stop it (its lock goes with it), then rerun; wait longer "
        "with GRAFT_LOCK_TIMEOUT=SECONDS"
    )
