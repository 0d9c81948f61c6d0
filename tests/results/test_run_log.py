"""A run's ``run.log`` (:mod:`graft.results.run_log`): held until the run folder is started,
then appended; every captured logger and Python's warnings in it, each warning once (in the
file and on the console); lines for the file alone never on a console; everything restored."""

from __future__ import annotations

import io
import logging
import warnings

import pytest

from graft.results.run_log import LOG_NAME, RunLog, file_only


@pytest.fixture
def console(monkeypatch):
    """graft's console as the command line has it: a handler on the ``graft`` logger."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("graft")
    monkeypatch.setattr(logger, "level", logging.WARNING)
    logger.addHandler(handler)
    yield stream
    logger.removeHandler(handler)


def test_nothing_is_written_before_the_folder_is_started(tmp_path, console):
    log = RunLog(tmp_path / "run" / LOG_NAME)
    with log.capture():
        logging.getLogger("graft.study").warning("a check failed")
    assert not (tmp_path / "run").exists()
    assert console.getvalue() == "a check failed\n"  # the console said it all the same


def test_held_lines_come_first_and_a_resume_appends(tmp_path, console):
    path = tmp_path / LOG_NAME
    for attempt in ("first", "second"):
        log = RunLog(path)
        with log.capture():
            logging.getLogger("graft.study.x").info("before %s", attempt)  # info: file only
            log.start()
            file_only().info("after %s", attempt)
    lines = path.read_text(encoding="utf-8").splitlines()
    said = [line.split(": ", 1)[1] for line in lines if "run started" not in line]
    assert said == ["before first", "after first", "before second", "after second"]
    assert " INFO graft.study.x: before first" in lines[1]
    assert console.getvalue() == ""  # neither info nor the file's own lines on the console


def test_each_warning_once_in_the_file_and_on_the_console(tmp_path, console, capsys, monkeypatch):
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as outside pytest: none at the root
    log = RunLog(tmp_path / LOG_NAME)
    with log.capture():
        log.start()
        for _ in range(3):
            logging.getLogger("graft.models").warning("has no checksums")
            warnings.warn("a library's deprecation", FutureWarning, stacklevel=1)
            warnings.warn("a library's deprecation", FutureWarning, stacklevel=2)  # elsewhere
        logging.getLogger("graft.models").warning("another")
    text = (tmp_path / LOG_NAME).read_text(encoding="utf-8")
    assert text.count("has no checksums") == 1 and "another" in text
    assert text.count("FutureWarning: a library's deprecation") == 1
    assert " WARNING py.warnings: " in text
    assert console.getvalue() == "has no checksums\nanother\n"
    # Python's warnings, which no handler heard, reach the console once, in one line
    assert capsys.readouterr().err == "FutureWarning: a library's deprecation\n"


def test_everything_is_restored(tmp_path):
    graft_logger = logging.getLogger("graft")
    before = (graft_logger.level, list(graft_logger.handlers), warnings.showwarning)
    with RunLog(tmp_path / LOG_NAME).capture() as log:
        log.start()
        assert warnings.showwarning is not before[2]
    assert (graft_logger.level, list(graft_logger.handlers), warnings.showwarning) == before
    assert log.handler not in file_only().handlers and not file_only().propagate
