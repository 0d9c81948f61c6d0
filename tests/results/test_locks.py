"""Cross-process locks: a second holder waits (and is told why), a killed holder never blocks."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import pytest
from filelock import FileLock, Timeout

from graft.storage.locks import exclusive, lock_path


def test_lock_files_live_in_their_folder_named_by_where_the_path_is(tmp_path):
    locks = tmp_path / "ws" / ".locks"
    one = lock_path(tmp_path / "ws" / "finetuned" / "a" / "donor", locks)
    assert one.parent == locks and one.name.startswith("donor-") and one.suffix == ".lock"
    assert lock_path(tmp_path / "ws" / "finetuned" / "b" / "donor", locks) != one
    # a workspace mounted elsewhere (another node) keeps its lock names
    moved = lock_path(tmp_path / "mnt" / "finetuned" / "a" / "donor", tmp_path / "mnt" / ".locks")
    assert moved.name == one.name


def test_a_second_holder_waits_with_a_message_then_goes_on(tmp_path, caplog):
    target, locks = tmp_path / "folder" / "donor", tmp_path / ".locks"
    locks.mkdir()
    held = FileLock(lock_path(target, locks))
    held.acquire()
    outcome = {}

    def second():
        with exclusive(target, "finetuning the donor", locks) as waited:
            outcome["waited"] = waited
            outcome["at"] = time.monotonic()

    with caplog.at_level(logging.WARNING, logger="graft.storage.locks"):
        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.6)
        assert "waited" not in outcome  # still waiting while the first holds the lock
        released = time.monotonic()
        held.release()
        thread.join(timeout=10)
    assert outcome["waited"] is True and outcome["at"] >= released
    assert "another process is finetuning the donor" in caplog.text
    assert str(lock_path(target, locks)) in caplog.text
    assert not target.parent.exists()  # nothing is written beside the locked path


def test_a_free_lock_is_taken_at_once_and_says_nothing(tmp_path, caplog):
    with (
        caplog.at_level(logging.WARNING),
        exclusive(tmp_path / "x", "building x", tmp_path / ".locks") as waited,
    ):
        assert waited is False
    assert caplog.text == ""


def test_a_lock_left_by_a_killed_process_does_not_block(tmp_path):
    target, locks = tmp_path / "donor", tmp_path / ".locks"
    locks.mkdir()
    code = (
        "import sys, time; from filelock import FileLock; "
        "lock = FileLock(sys.argv[1]); lock.acquire(); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(lock_path(target, locks))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Timeout):  # held while its process lives
            FileLock(lock_path(target, locks)).acquire(timeout=0.2)
    finally:
        holder.kill()  # SIGKILL: the process never releases its lock itself
        holder.wait()
    assert lock_path(target, locks).exists()  # the file stays on disk ...
    started = time.monotonic()
    with exclusive(target, "finetuning", locks) as waited:  # ... but blocks no one
        assert waited is False
    assert time.monotonic() - started < 2


# ------------------------------------------------- holders, bounds, symlinks, read-only stores

HOLD = """
import sys, time
from graft.storage.locks import exclusive
with exclusive(sys.argv[1], "finetuning the donor", sys.argv[2]):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def hold(target, locks, seconds=60, env=None):
    """A process that takes the lock of ``target`` and holds it ``seconds``."""
    import os

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(target), str(locks), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_wait_names_the_holder_and_gives_up_after_its_bound(tmp_path, caplog, monkeypatch):
    from graft.errors import LockTimeoutError

    target, locks = tmp_path / "donor", tmp_path / ".locks"
    holder = hold(target, locks)
    monkeypatch.setenv("GRAFT_LOCK_TIMEOUT", "1")
    try:
        with (
            caplog.at_level(logging.WARNING),
            pytest.raises(LockTimeoutError) as info,
            exclusive(target, "finetuning", locks),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()
    message = str(info.value)
    assert f"pid {holder.pid} since 20" in message and "after 1 s" in message
    assert "GRAFT_LOCK_TIMEOUT" in message and "\n" not in message
    assert f"pid {holder.pid}" in caplog.text and "at most 1 s" in caplog.text


def test_a_folder_through_a_symlink_has_the_same_lock(tmp_path):
    real = tmp_path / "runs" / "r1"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "runs")
    locks = tmp_path / ".locks"
    assert lock_path(tmp_path / "link" / "r1", locks) == lock_path(real, locks)


def test_a_read_only_lock_folder_falls_back_where_the_job_can_write(tmp_path, caplog, monkeypatch):
    """A shared store of finished donors, read-only to this user (root writes anywhere, so
    the file system's refusal is simulated)."""
    import errno
    from pathlib import Path

    from graft.storage.locks import writable_lock_dir

    store = tmp_path / "store" / ".locks"
    original = Path.mkdir

    def read_only(self, *args, **kwargs):
        if self == store:
            raise PermissionError(errno.EROFS, "Read-only file system", str(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with caplog.at_level(logging.WARNING):
        got = writable_lock_dir(store, tmp_path / "fallback")
    assert got == tmp_path / "fallback" and "cannot be written" in caplog.text
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(NotADirectoryError):  # no silent fallback for other errors
        writable_lock_dir(tmp_path / "file" / "locks", tmp_path / "fallback")


def test_bad_lock_settings_are_one_line(monkeypatch):
    from graft.errors import StorageError
    from graft.storage.locks import lock_settings

    monkeypatch.setenv("GRAFT_LOCK_MODE", "nfs")
    with pytest.raises(StorageError, match="use os .the default. or lease"):
        lock_settings()
    monkeypatch.setenv("GRAFT_LOCK_MODE", "lease")
    monkeypatch.setenv("GRAFT_LOCK_TIMEOUT", "soon")
    with pytest.raises(StorageError, match="GRAFT_LOCK_TIMEOUT='soon'"):
        lock_settings()


LEASE = {"GRAFT_LOCK_MODE": "lease", "GRAFT_LOCK_LEASE": "1"}


def test_lease_locks_hold_while_renewed_and_pass_on_when_the_holder_dies(tmp_path, monkeypatch):
    """The lock mode for file systems whose OS locks cannot be trusted across nodes: a lock
    file with a lease its holder renews. A live holder keeps it past several leases; one
    killed with SIGKILL (which never releases anything) loses it one lease later."""
    from graft.errors import LockTimeoutError

    for name, value in LEASE.items():
        monkeypatch.setenv(name, value)
    target, locks = tmp_path / "donor", tmp_path / ".locks"
    holder = hold(target, locks, env=LEASE)
    try:
        monkeypatch.setenv("GRAFT_LOCK_TIMEOUT", "3")  # three leases: a live holder renews
        with (
            pytest.raises(LockTimeoutError, match=f"pid {holder.pid}"),
            exclusive(target, "finetuning", locks),
        ):
            pass
    finally:
        holder.kill()
        holder.wait()
    monkeypatch.setenv("GRAFT_LOCK_TIMEOUT", "10")
    started = time.monotonic()
    with exclusive(target, "finetuning", locks) as waited:  # its lease runs out: taken
        assert waited is True
    assert time.monotonic() - started < 5
    assert not list(locks.glob("*.lease"))  # released: the file is gone


def test_lease_locks_exclude_each_other(tmp_path, monkeypatch):
    for name, value in LEASE.items():
        monkeypatch.setenv(name, value)
    target, locks = tmp_path / "donor", tmp_path / ".locks"
    inside, overlaps = [0], []

    def worker():
        for _ in range(5):
            with exclusive(target, "building", locks):
                inside[0] += 1
                overlaps.append(inside[0])
                time.sleep(0.01)
                inside[0] -= 1

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert overlaps and max(overlaps) == 1
