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
