"""Python subprocesses that start warm: a fork server that imported graft and its commands once.

A cold ``python -c ...`` of ``graft-exp`` spends seconds importing torch, transformers, scipy,
statsmodels and matplotlib before a tiny model's few seconds of work; the crash and
corruption harnesses start hundreds of them. ``run_python`` starts each one as a child of
multiprocessing's fork server instead (stdlib ``forkserver``, its preload
``tests/warm_preload.py`` importing every module of graft and what commands import late). The
child is still a process
of its own: its own pid, working directory, environment, ``sys.argv``, file descriptors and
exit status, a real SIGKILL kills it, and its stdout and stderr go to one file as with
``stderr=STDOUT``. What it shares with a cold start is what importing did, nothing more: the
server runs no torch operation, so no thread pool or device state is forked.

A variable that upstream libraries read at import time (torch's thread count, the hub's
offline mode, matplotlib's backend, ...) cannot change in a forked child: a call whose
environment differs from the server's in anything but graft's own ``GRAFT_*`` variables
(read when used) and pytest's ``PYTEST_*`` bookkeeping (``PYTEST_CURRENT_TEST`` changes with
every test) runs cold, as ``subprocess.run`` would (``warm=False`` forces that too).
``STARTS`` counts both kinds, so a test can check that its runs started warm.
"""

from __future__ import annotations

import atexit
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path

#: What the fork server imports once (every module of graft, and what commands import late).
PRELOAD = ["tests.warm_preload"]
#: The environment the fork server started with (its imports saw it); set on first use.
_SERVER_ENV: dict[str, str] | None = None
#: Variables a warm child may set differently from the server.
FREE_PREFIXES = ("GRAFT_", "PYTEST_")
#: How many runs started warm and cold in this process.
STARTS: Counter[str] = Counter()


def _context() -> multiprocessing.context.ForkServerContext:
    """The fork server, started with one torch thread (what the harnesses run with)."""
    global _SERVER_ENV
    context = multiprocessing.get_context("forkserver")
    if _SERVER_ENV is None:
        context.set_forkserver_preload(PRELOAD)
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            from multiprocessing import forkserver

            forkserver.ensure_running()
            _SERVER_ENV = dict(os.environ)
        finally:
            if saved is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = saved
    return context


def differing(env: dict[str, str]) -> list[str]:
    """The variables of ``env`` that keep a child from starting warm: those that differ from
    the server's, FREE_PREFIXES aside."""
    assert _SERVER_ENV is not None
    keys = set(env) | set(_SERVER_ENV)
    return sorted(
        key
        for key in keys
        if not key.startswith(FREE_PREFIXES) and env.get(key) != _SERVER_ENV.get(key)
    )


def _child(code: str, argv: list[str], env: dict[str, str], cwd: str, output: str) -> None:
    """Inside the forked child: become ``python -c code args`` and exit as it would."""
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # as Python sets up stdout: block-buffered into a file, unbuffered with PYTHONUNBUFFERED
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    raw = open(1, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
    sys.stdout = io.TextIOWrapper(raw, encoding="utf-8", write_through=unbuffered)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)  # noqa: SIM115
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = argv
    signal.signal(signal.SIGINT, signal.default_int_handler)
    status = 0
    try:
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            status = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        try:
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)


def run_python(
    code: str,
    args: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    kill_after: float | None = None,
    timeout: float = 600,
    warm: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``python -c code *args`` with ``env`` in ``cwd``; SIGKILL after ``kill_after`` seconds
    (if still running). Returns the exit status (``-9`` when killed) and stdout+stderr."""
    if warm:
        context = _context()
        warm = not differing(env)
    STARTS["warm" if warm else "cold"] += 1
    if not warm:
        return _run_cold(code, args, env=env, cwd=cwd, kill_after=kill_after, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="graft-warm-") as folder:
        output = os.path.join(folder, "output")
        child = context.Process(
            target=_child, args=(code, ["-c", *args], env, str(cwd), output), daemon=False
        )
        child.start()
        if kill_after is not None:
            child.join(kill_after)
            if child.exitcode is None:
                child.kill()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired([sys.executable, "-c", "...", *args], timeout)
        # a child killed before it opened its output wrote nothing
        made = Path(output)
        text = made.read_text(encoding="utf-8", errors="replace") if made.exists() else ""
        return subprocess.CompletedProcess(
            [sys.executable, "-c", code, *args], child.exitcode, text
        )


def _run_cold(
    code: str,
    args: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    kill_after: float | None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    job = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if kill_after is not None:
        try:
            job.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            job.send_signal(signal.SIGKILL)
    output, _ = job.communicate(timeout=timeout)
    return subprocess.CompletedProcess(job.args, job.returncode, output)
