"""``run.log`` in a run folder: everything a run said, in full, while the console keeps to
progress bars and one-line stages.

While a run runs (:class:`RunLog`), the records of graft's loggers, of the libraries it
drives (transformers, huggingface_hub, nnsight, matplotlib) and Python's warnings (captured
through :func:`logging.captureWarnings`) also go to the run's log, with their time, level
and logger; lines meant for the log alone (the Trainer's metrics dicts, the summary table in
full) go to the :data:`FILE_ONLY` logger, which reaches no console. Until the run folder is
started (:meth:`RunLog.start`, when its ``config.json`` is written) the lines are held in
memory, so a run that stops at its checks writes nothing; a resumed run appends. Each warning
is logged once per run (:class:`OnceFilter`): the same message from the same logger again is
dropped, on the console as in the file. While a command runs, :func:`console_logging` puts
graft's messages on stderr, one line each, and (:func:`console_session`) a console says
each warning once over all the command's runs, and under ``quiet`` none of the libraries'
(transformers, matplotlib, ...: ``run.log`` keeps them), graft's own still.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TextIO

#: The log's file name in a run folder.
LOG_NAME = "run.log"
#: The logger of lines for the log file alone (it reaches no console handler).
FILE_ONLY = "graft.log"
#: The loggers whose records a run's log holds (their children included).
CAPTURED = (
    "graft",
    FILE_ONLY,
    "py.warnings",
    "transformers",
    "huggingface_hub",
    "nnsight",
    "matplotlib",
)

_file_only = logging.getLogger(FILE_ONLY)
_file_only.propagate = False  # never to graft's console handler, nor a notebook's root one
_file_only.setLevel(logging.INFO)


def file_only() -> logging.Logger:
    """The logger of lines for the run's log alone (:data:`FILE_ONLY`)."""
    return _file_only


def echo_and_log(
    echo: Callable[[str], None] | None, logger: logging.Logger
) -> Callable[[str], None]:
    """``echo`` (a caller's console) that also writes each line into the run's log;
    ``logger.info`` (which reaches the log by itself) when none is given."""
    if echo is None:
        return logger.info

    def say(line: str) -> None:
        file_only().info("%s", line)
        echo(line)

    return say


class OnceFilter(logging.Filter):
    """Lets each warning (or worse) through once: a record whose logger and message were
    seen before is dropped (a Python warning's message without the place it was raised at).
    Lower levels all pass."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, _without_place(record))
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


class _Session:
    """One command's consoles (:func:`console_session`).

    Args:
        quiet: the libraries' warnings reach no console (graft's own do).
        once: each console's :class:`OnceFilter`, kept over the command's runs.
        fallback: the console of loggers no handler heard, kept over the command's runs.
    """

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.once: weakref.WeakKeyDictionary[logging.Handler, OnceFilter] = (
            weakref.WeakKeyDictionary()
        )
        self.fallback = _StderrHandler()

    def once_for(self, handler: logging.Handler) -> OnceFilter:
        return self.once.setdefault(handler, OnceFilter())


_SESSION: ContextVar[_Session | None] = ContextVar("graft_console_session", default=None)


@contextmanager
def console_session(quiet: bool = False) -> Iterator[None]:
    """While a command runs: every run's consoles (:meth:`RunLog.capture`) say each warning
    once over the whole command, however many runs it makes (a ``graft-exp`` process: once
    per process), and with ``quiet`` say none of the libraries' warnings (transformers'
    "(65 > 64)", matplotlib's "findfont: ..."): only graft's own (its loggers', and Python
    warnings raised in graft's code). ``run.log`` still gets every one."""
    session = _Session(quiet)
    token = _SESSION.set(session)
    # outside a run too (a design's figures, a plot): the loggers no handler hears, and
    # Python's warnings, reach the session's console, once, graft's only under quiet
    libraries = [logging.getLogger(n) for n in CAPTURED if n not in ("graft", FILE_ONLY)]
    unheard = [lg for lg in libraries if not lg.hasHandlers()]
    session.fallback.addFilter(session.once_for(session.fallback))
    if quiet:
        session.fallback.addFilter(_OwnOnly())
    for lg in unheard:
        lg.addHandler(session.fallback)
    capturing = _capturing()
    logging.captureWarnings(True)
    try:
        yield
    finally:
        if not capturing:
            logging.captureWarnings(False)
        for lg in unheard:
            lg.removeHandler(session.fallback)
        _SESSION.reset(token)


#: graft's package folder: a Python warning raised in a file under it is graft's own.
_GRAFT_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def is_graft_record(record: logging.LogRecord) -> bool:
    """Whether ``record`` is graft's own: a graft logger's, or a Python warning raised in
    graft's code or saying ``graft`` first; else a library's (transformers, matplotlib...)."""
    if record.name == "graft" or record.name.startswith("graft."):
        return True
    if record.name != "py.warnings":
        return False
    place, _, rest = record.getMessage().partition(": ")
    path = place.rsplit(":", 1)[0]
    said = rest.partition(": ")[2]
    inside = path and os.path.realpath(path).startswith(_GRAFT_DIR + os.sep)
    return bool(inside) or said.startswith("graft")


class _OwnOnly(logging.Filter):
    """``quiet``: a console hears graft's own records only (:func:`is_graft_record`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return is_graft_record(record)


class _HeldFileHandler(logging.Handler):
    """Formats every record; holds the lines until :meth:`open`, then appends them, and each
    later one, to the file (flushed per line: a killed run keeps its log)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.held: list[str] = []
        self.file: TextIO | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # a record that cannot be formatted must not stop the run
            self.handleError(record)
            return
        if self.file is None:
            self.held.append(line)
        else:
            self.file.write(line + "\n")
            self.file.flush()

    def open(self, path: Path) -> None:
        if self.file is not None:
            return
        self.file = path.open("a", encoding="utf-8")
        for line in self.held:
            self.file.write(line + "\n")
        self.file.flush()
        self.held.clear()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        super().close()


class RunLog:
    """The log of one run: attached while :meth:`capture` runs, written into the run folder
    from :meth:`start` on.

    Args:
        path: the log file (``<run folder>/run.log``).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.handler = _HeldFileHandler()
        self.handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
        self.once = OnceFilter()
        self.handler.addFilter(self.once)

    def start(self) -> None:
        """The run folder is started: write the lines held so far, and every later one."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handler.open(self.path)

    @contextmanager
    def capture(self) -> Iterator[RunLog]:
        """Attach the log to :data:`CAPTURED`, capture Python's warnings, and make the console
        say each warning once; all undone after.

        graft's own loggers are lowered to info level where they were above it (the file gets
        the plan and the stages under ``--quiet`` too; a console handler keeps its own level).
        A captured logger that no handler reached before (a notebook's, or Python's warnings)
        gets a console handler at warning level, as Python's last resort would have been."""
        loggers = {name: logging.getLogger(name) for name in CAPTURED}
        levels = {name: lg.level for name, lg in loggers.items()}
        unheard = [lg for lg in loggers.values() if not lg.hasHandlers()]
        # the handlers that heard these loggers before (a command's console, a notebook's):
        # they say each warning once, and nothing below the level they heard before
        consoles = list(dict.fromkeys(h for lg in loggers.values() for h in _reached(lg)))
        session = _SESSION.get()
        fallback = session.fallback if session else _StderrHandler()
        lowered = {}
        for name in ("graft", FILE_ONLY, "py.warnings"):
            if loggers[name].getEffectiveLevel() > logging.INFO:
                lowered[name] = loggers[name].getEffectiveLevel()
                loggers[name].setLevel(logging.INFO)
        consoles_and_fallback = [*consoles, fallback]
        # each console its own once (one shared filter would let only the first hear a
        # warning); the file logs all
        # (in a command: its one once per console, over all its runs; quiet: graft's only)
        filters: dict[logging.Handler, list[logging.Filter]] = {
            h: [session.once_for(h) if session else OnceFilter(), _AsBefore(lowered)]
            for h in consoles_and_fallback
        }
        if session and session.quiet:
            for added in filters.values():
                added.append(_OwnOnly())
        capturing = _capturing()
        for lg in loggers.values():
            lg.addHandler(self.handler)
        for lg in unheard:
            lg.addHandler(fallback)
        for h, added in filters.items():
            added[:] = [f for f in added if f not in h.filters]  # a command's once, kept on
            for f in added:
                h.addFilter(f)
        logging.captureWarnings(True)
        file_only().info("run started %s", time.strftime("%Y-%m-%d %H:%M:%S %z"))
        try:
            yield self
        finally:
            if not capturing:
                logging.captureWarnings(False)
            for h, added in filters.items():
                for f in added:
                    h.removeFilter(f)
            for lg in unheard:
                lg.removeHandler(fallback)
            for name, lg in loggers.items():
                lg.removeHandler(self.handler)
                lg.setLevel(levels[name])
            self.handler.close()


def _reached(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers a record of ``logger`` reaches (its own and, while it propagates, its
    parents')."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found += current.handlers
        current = current.parent if current.propagate else None
    return found


class _AsBefore(logging.Filter):
    """Drops a record of a logger whose level :meth:`RunLog.capture` lowered, when it is
    below the level that logger had: consoles hear what they heard before."""

    def __init__(self, lowered: dict[str, int]) -> None:
        super().__init__()
        self.lowered = lowered

    def filter(self, record: logging.LogRecord) -> bool:
        # the level the record's logger had: its own, or its nearest ancestor's (a lowered
        # one's as it was before)
        logger: logging.Logger | None = logging.getLogger(record.name)
        while logger is not None:
            if logger.name in self.lowered:
                return record.levelno >= self.lowered[logger.name]
            if logger.level:
                return record.levelno >= logger.level
            logger = logger.parent
        return True


class _StderrHandler(logging.Handler):
    """Records of ``level`` or above to whatever ``sys.stderr`` is now (click's test runner
    swaps it), one line each (a captured Python warning as ``Category: message``, without
    its source line)."""

    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__(level)

    def emit(self, record: logging.LogRecord) -> None:
        import sys

        sys.stderr.write(_without_place(record) + "\n")


def _without_place(record: logging.LogRecord) -> str:
    """A record's message; a captured Python warning's as ``Category: message``, without
    the file, line and source line it was raised at (one warning from two places is one)."""
    message = record.getMessage()
    if record.name == "py.warnings" and message:  # "path:line: Category: message\n  source"
        return message.splitlines()[0].split(": ", 1)[-1]
    return message


@contextmanager
def console_logging(quiet: bool = False) -> Iterator[None]:
    """While a command runs, graft's messages go to stderr, one line each; ``quiet`` keeps
    warnings only there (a run's ``run.log`` still gets everything) and also hides
    transformers' own progress bars, the hub client's retry lines and the libraries'
    warnings (:func:`console_session`: each said once). The loggers are restored afterwards
    (commands may run inside a notebook or a test)."""
    logger = logging.getLogger("graft")
    # the handler, not the logger, keeps to warnings: a run's log gets the info lines too
    handler = _StderrHandler(logging.WARNING if quiet else logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    # the hub client's "Retrying in 8s" lines: hidden by quiet (a stalled download still
    # fails with its error)
    hub_logger = logging.getLogger("huggingface_hub")
    hub_level = hub_logger.level
    # transformers gives its logger a console handler when first imported; imported later,
    # mid-run, that handler would say each of its warnings again beside the session's
    import transformers.utils.logging as transformers_logging

    transformers_logging.get_logger("transformers")
    if quiet:
        transformers_logging.disable_progress_bar()  # weight loading, checkpoints
        hub_logger.setLevel(logging.ERROR)
    try:
        with console_session(quiet):  # the libraries' warnings once, none under quiet
            yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        hub_logger.setLevel(hub_level)


def _capturing() -> bool:
    """Whether Python's warnings go to logging already (someone called captureWarnings)."""
    import warnings

    return getattr(warnings.showwarning, "__name__", "") == "_showwarning"
