"""Cross-process locks: what several jobs on one workspace build once, and run folders one
process writes at a time.

A SLURM job array starts many ``graft-exp`` commands at once on one workspace. A dataset, a
finetuned donor and a run folder are each built by one process while the others wait (a
message says for what) and then use what it made. The locks are ``filelock`` locks (``fcntl``
on POSIX): the operating system releases them when their process dies, so a lock left by a
killed job never blocks. The lock file of ``path`` is ``.<name>.lock`` beside it; it stays
on disk (removing it would race with a process about to take it) and holds nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

logger = logging.getLogger(__name__)

#: Seconds between two tries of a process that waits for a lock.
POLL_SECONDS = 0.5


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file of ``path``: ``.<name>.lock`` in its folder."""
    path = Path(path)
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def exclusive(path: str | os.PathLike, what: str) -> Iterator[bool]:
    """Hold the lock of ``path`` inside; ``what`` says what the holder does ("finetuning the
    donor ..."), for the message of a process that has to wait. Yields whether this process
    waited for another one (which may have built what it came for: check again).

    The folder of ``path`` is created when missing (the lock file lives there)."""
    target = lock_path(path)
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
