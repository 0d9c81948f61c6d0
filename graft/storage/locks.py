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
  process dies, so a lock left by a killed job never blocks, and it never admits two holders
  (the lock file is never removed, so every process locks the same inode). It holds on a
  local disk, on NFS v4 (locks are part of the protocol) and on Lustre mounted with
  ``-o flock``; on NFS v3 it needs a working lock daemon (``lockd``/NLM), and on Lustre
  mounted without ``flock`` (or with ``localflock``) it does not hold across nodes.
- ``lease``: a lock file created atomically (``O_CREAT | O_EXCL``, atomic on NFS v3 and later
  and on Lustre) holding a token of its own, that its holder touches every quarter of a lease
  (``GRAFT_LOCK_LEASE`` seconds, default 60) from a background thread; a waiter that finds it
  untouched for a whole lease takes its holder for dead and removes it, then tries again.
  Removing a lock file is itself exclusive (:class:`LeaseLock`): of several waiters on a
  stale lease one removes it, and no process removes a lease it did not read. A holder paused
  past its lease (a suspended job, a stopped process) may find its lock taken over: before
  every commit (:func:`graft.storage.files.check_commit`) it checks that its token is still
  the lock file's and otherwise stops with one :class:`~graft.errors.LockLostError` line,
  writing nothing more. It needs nothing of the file system's locking, only clocks that
  agree within a fraction of the lease.

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
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from graft.errors import LockTimeoutError, StorageError
from graft.storage.leases import LeaseLock, holder_record, record_text

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
    digest = hashlib.sha256(os.fsencode(key)).hexdigest()[:16]  # any bytes a name holds
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


def holder_text(lock: Path) -> str:
    """Who holds the ``os`` lock ``lock``, as its ``.holder`` record says."""
    return record_text(lock.with_name(lock.name + ".holder"))


def _write_holder(lock: Path, what: str) -> None:
    with contextlib.suppress(OSError):  # the record only informs waiters
        lock.with_name(lock.name + ".holder").write_text(
            json.dumps(holder_record(what)), encoding="utf-8"
        )


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
