"""The two tiers of the suite (docs/how-to/contribute.md): ``slow_except`` for parametrised tests,
and the record that ``tests/test_fast_tier.py`` checks: the fast tier (``pytest -m "not
slow"``) runs code of every module of graft.

The record is kept only in a run that includes that check (the whole suite, as CI runs it,
or ``pytest -m "not slow or fast_tier_check"``), because tracing slows the traced tests by
about 70%. Then, while a test that is not marked ``slow`` runs (its setup, call and
teardown, and so any fixture it is the first to need), a global trace function notes each
module of graft one of whose named functions or methods starts, in this thread or in a
thread started meanwhile. Code run at import (module and class bodies) does not count, nor
do lambdas and comprehensions (their enclosing function counts), nor child processes, nor
slow tests: what a slow test was the first to set up counts as not run, so the check can
only err towards failing. A module with no function to run (a package's ``__init__`` that
only re-exports, a module of protocols or data classes only) counts once it is imported.
Once every module has been seen no trace function is set any more; none is set while
another tracer (a debugger, coverage) is active.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
CHECK_FILE = "test_fast_tier.py"
CO_OPTIMIZED = 0x1  # set on functions, methods, lambdas and comprehensions; not on bodies


def slow_except(cases, *fast):
    """``cases`` of ``pytest.mark.parametrize`` (or a fixture's ``params``) with every case but
    those in ``fast`` marked slow; the test ids stay the same.

    ``slow_except(TINY_FAMILIES, "llama")`` keeps one family in the fast tier.
    """
    cases = list(cases)
    unknown = [case for case in fast if case not in cases]
    if unknown:
        raise ValueError(f"not among the cases: {unknown}")
    return [
        case
        if case in fast
        else pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=pytest.mark.slow)
        for case in cases
    ]


def _is_stub(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether a function's body is only a docstring and ``...``, ``pass`` or ``raise
    NotImplementedError`` (a protocol's or an overload's declaration): nothing to run."""
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring (or a lone `...`, which is a stub too)
    return all(
        isinstance(statement, ast.Pass)
        or (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant))
        or (
            isinstance(statement, ast.Raise)
            and "NotImplementedError" in ast.unparse(statement.exc or ast.Constant(None))
        )
        for statement in body
    )


def runs_code(source: str) -> bool:
    """Whether a module defines a function (or method) that is not a stub."""
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not _is_stub(node)
        for node in ast.walk(ast.parse(source))
    )


def graft_modules() -> list[tuple[str, str, bool]]:
    """``(module name, file, whether it defines a function that is not a stub)`` for every
    ``.py`` file of graft, the file named as the import system names it (the installed
    package, not a copy)."""
    package = Path(importlib.util.find_spec("graft").origin).parent
    modules = []
    for path in sorted(package.rglob("*.py")):
        parts = ("graft", *path.relative_to(package).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        try:
            has_code = runs_code(path.read_text(encoding="utf-8"))
        except SyntaxError:  # its import fails the tests that need it
            has_code = True
        modules.append((name, str(path), has_code))
    return modules


@dataclass
class Record:
    """What the fast tests of this session ran.

    Args:
        active: whether the record is kept (the check runs in this session, on every fast
            test).
        pending: ``file path -> module name`` of the modules with functions not seen yet.
        seen: ``module name -> node id`` of the first fast test that ran one of its functions.
        without_functions: the modules that define no function (checked by import).
        partial: why this session is not the whole fast tier ("" when it is).
        tracing_refused: node ids of fast tests during which another tracer was active.
        current: the node id of the fast test running now.
    """

    active: bool = False
    pending: dict[str, str] = field(default_factory=dict)
    seen: dict[str, str] = field(default_factory=dict)
    without_functions: list[str] = field(default_factory=list)
    partial: str = ""
    tracing_refused: list[str] = field(default_factory=list)
    current: str = ""


RECORD = Record()


def _trace(frame, event, arg):
    code = frame.f_code
    module = RECORD.pending.get(code.co_filename)
    if module is not None and code.co_flags & CO_OPTIMIZED and not code.co_name.startswith("<"):
        RECORD.pending.pop(code.co_filename, None)
        RECORD.seen.setdefault(module, RECORD.current)
    return None  # no line events: only the start of each call is looked at


def pytest_configure(config):
    args = [Path(config.invocation_params.dir, a.split("::")[0]).resolve() for a in config.args]
    if any(a not in (ROOT, TESTS) for a in args):
        RECORD.partial = f"only part of tests/ was asked for ({' '.join(config.args)})"
    elif config.option.keyword:
        RECORD.partial = f"tests were selected by keyword (-k {config.option.keyword})"
    elif config.getoption("lf", False):
        RECORD.partial = "only the tests that failed last time were asked for (--lf)"


def pytest_deselected(items):
    fast = [item.nodeid for item in items if item.get_closest_marker("slow") is None]
    if fast and not RECORD.partial:
        RECORD.partial = f"{len(fast)} tests not marked slow were deselected (e.g. {fast[0]})"


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(items):
    """The check runs last, after every other test; the record is kept if it runs."""
    last = [item for item in items if item.path.name == CHECK_FILE]
    items[:] = [item for item in items if item not in last] + last
    RECORD.active = not RECORD.partial and any(
        item.get_closest_marker("fast_tier_check") for item in last
    )
    if RECORD.active:
        for name, path, has_functions in graft_modules():
            if has_functions:
                RECORD.pending[path] = name
            else:
                RECORD.without_functions.append(name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    fast = item.get_closest_marker("slow") is None
    if not (RECORD.active and fast and RECORD.pending):
        return (yield)
    if sys.gettrace() is not None:
        RECORD.tracing_refused.append(item.nodeid)
        return (yield)
    RECORD.current = item.nodeid
    sys.settrace(_trace)
    threading.settrace(_trace)
    try:
        return (yield)
    finally:
        sys.settrace(None)
        threading.settrace(None)


def pytest_terminal_summary(terminalreporter):
    if RECORD.active:
        terminalreporter.write_line(
            f"fast tier: {len(RECORD.seen)} modules of graft ran in tests not marked slow, "
            f"{len(RECORD.pending)} did not (tests/test_fast_tier.py); "
            f"{len(RECORD.without_functions)} define no function"
        )
