"""A run's ``run.log`` (:mod:`graft.results.run_log`): held until the run folder is started,
then appended; every captured logger and Python's warnings in it, each warning once (in the
file and on the console); lines for the file alone never on a console; everything restored."""

from __future__ import annotations

import io
import logging
import warnings
from pathlib import Path

import pytest

import graft.results.run_log
from graft.results.run_log import LOG_NAME, RunLog, console_session, file_only, is_graft_record


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


#: transformers' warning on a prompt longer than a tiny model's positions (#52 item 5).
TOO_LONG = (
    "Token indices sequence length is longer than the specified maximum sequence length for "
    "this model (65 > 64). Running this sequence through the model will result in indexing "
    "errors"
)


@pytest.fixture
def library_console(monkeypatch):
    """transformers' own console: a handler on its root logger, which does not propagate."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    library = logging.getLogger("transformers")
    monkeypatch.setattr(library, "handlers", [handler])
    monkeypatch.setattr(library, "propagate", False)
    monkeypatch.setattr(library, "level", logging.WARNING)
    return stream


def _two_runs(tmp_path, graft_warning: bool = False) -> list[str]:
    """Two runs in one command, each warned by transformers (and by graft); their logs."""
    logs = []
    for i in range(2):
        log = RunLog(tmp_path / f"run{i}" / LOG_NAME)
        with log.capture():
            log.start()
            logging.getLogger("transformers.tokenization_utils_base").warning(TOO_LONG)
            if graft_warning:
                logging.getLogger("graft.models").warning("has no checksums")
        logs.append(log.path.read_text(encoding="utf-8"))
    return logs


def test_a_library_warning_once_per_command_not_once_per_run(tmp_path, library_console):
    """Twice under --quiet: each run's console said it once."""
    with console_session():
        logs = _two_runs(tmp_path)
    assert library_console.getvalue() == TOO_LONG + "\n"
    assert all(log.count("(65 > 64)") == 1 for log in logs)  # each run's log has it
    _two_runs(tmp_path)  # outside a command: once per run, as before
    assert library_console.getvalue().count("(65 > 64)") == 3


def test_quiet_says_no_library_warning_and_still_graft_own(
    tmp_path, library_console, console, capsys, monkeypatch
):
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as outside pytest
    with console_session(quiet=True):
        logs = _two_runs(tmp_path, graft_warning=True)
        log = RunLog(tmp_path / LOG_NAME)
        with log.capture():
            log.start()
            warnings.warn_explicit("a library's deprecation", FutureWarning, "/lib/x.py", 3)
            here = str(Path(graft.results.run_log.__file__))
            warnings.warn_explicit("a fallback of graft's", UserWarning, here, 7)
            logging.getLogger("matplotlib.font_manager").warning("findfont: no STIXGeneral")
    assert library_console.getvalue() == ""  # transformers' own console said nothing
    assert console.getvalue() == "has no checksums\n"  # graft's, once over both runs
    assert capsys.readouterr().err == "UserWarning: a fallback of graft's\n"
    assert all("(65 > 64)" in text and "has no checksums" in text for text in logs)
    text = log.path.read_text(encoding="utf-8")
    assert "a library's deprecation" in text and "findfont" in text  # the log keeps them


def test_is_graft_record_tells_graft_from_its_libraries():
    def record(name: str, message: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, "f", 1, message, None, None)

    here = graft.results.run_log.__file__
    assert is_graft_record(record("graft.study", "x"))
    assert not is_graft_record(record("transformers.x", "graft: x"))
    assert is_graft_record(record("py.warnings", f"{here}:3: UserWarning: x\n  src"))
    assert is_graft_record(record("py.warnings", "/u/nb.py:3: SlowPathWarning: graft: slow"))
    assert not is_graft_record(record("py.warnings", "/lib/t.py:3: FutureWarning: x"))


@pytest.mark.parametrize("quiet", [False, True])
def test_outside_a_run_too_a_library_warning_once_and_none_under_quiet(capsys, monkeypatch, quiet):
    """matplotlib's findfont lines came from a design's figures, after its run: 22 under
    --quiet."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as outside pytest
    with console_session(quiet=quiet):
        for _ in range(3):
            logging.getLogger("matplotlib.font_manager").warning("findfont: no STIXGeneral")
            warnings.warn_explicit("a library's deprecation", FutureWarning, "/lib/x.py", 3)
    said = "" if quiet else "findfont: no STIXGeneral\nFutureWarning: a library's deprecation\n"
    assert capsys.readouterr().err == said
    assert not logging.getLogger("matplotlib").handlers  # restored
