"""Cross-process locks: what several jobs on one workspace build once, and run folders one
process writes at a time.

A SLURM job array starts many ``graft-exp`` commands at once on one workspace. A dataset, a
finetuned donor and a run folder are each built by one process while the others wait (a
message says for what) and then use what it made. The locks are ``filelock`` locks (``fcntl``
on POSIX): the operating system releases them when their process dies, so a lock left by a
killed job never blocks. Lock files live in one folder of their own (a workspace's
``.locks/``), named by the locked path's name and a hash of where it is, so that nothing is
written beside a user's folders; they stay on disk (removing one would race with
a process about to take it) and hold nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

logger = logging.getLogger(__name__)

#: Seconds between two tries of a process that waits for a lock.
POLL_SECONDS = 0.5


def lock_path(path: str | os.PathLike[str], lock_dir: str | os.PathLike[str]) -> Path:
    """The lock file of ``path`` in ``lock_dir``: ``<name>-<hash>.lock``, hashing ``path``
    relative to the folder holding ``lock_dir`` (a workspace mounted at other paths on other
    nodes keeps its lock names) or, outside it, its absolute path."""
    absolute, home = Path(path).absolute(), Path(lock_dir).absolute().parent
    key = absolute.relative_to(home) if absolute.is_relative_to(home) else absolute
    digest = hashlib.sha256(str(key).encode()).hexdigest()[:16]
    return Path(lock_dir) / f"{absolute.name[:80]}-{digest}.lock"


@contextlib.contextmanager
def exclusive(
    path: str | os.PathLike[str], what: str, lock_dir: str | os.PathLike[str] | None
) -> Iterator[bool]:
    """Hold the lock of ``path`` inside; ``what`` says what the holder does ("finetuning the
    donor ..."), for the message of a process that has to wait. Yields whether this process
    waited for another one (which may have built what it came for: check again).

    ``lock_dir`` (created when missing) holds the lock file: every process that may build
    ``path`` must name the same folder; ``None``: no lock (a caller outside a workspace)."""
    if lock_dir is None:
        yield False
        return
    target = lock_path(path, lock_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(target)
    waited = False
    try:
        lock.acquire(timeout=0)
    except Timeout:
        waited = True
        logger.warning("another process is %s (lock %s); waiting for it to finish", what, target)
        lock.acquire(poll_interval=POLL_SECONDS)
    try:
        yield waited
    finally:
        lock.release()
