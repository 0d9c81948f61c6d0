"""Fixtures for the tests against the real NDIF server (``ndif`` 0.1.x, see scripts/ndif/).

These tests start the whole server stack (Redis, Ray, the ndif API, in a network namespace
of their own), which needs root, ``redis-server`` and the server's Python 3.12 venv, and
takes about a minute. So the plain test run leaves this folder out; ``scripts/ndif/ci.sh``
builds the venv and runs it with ``GRAFT_NDIF_SERVER_TESTS=1``:

    GRAFT_NDIF_SERVER_TESTS=1 .venv/bin/python -m pytest -q tests/remote/real

When they run, a server that cannot start FAILS them (it is never a skip).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

ENABLE = "GRAFT_NDIF_SERVER_TESTS"
if not os.environ.get(ENABLE):
    collect_ignore_glob = ["test_*.py"]

REPORT: dict = {}  # what the session measured; written to the state folder and printed


@pytest.fixture(scope="session")
def ndif_server(tmp_path_factory):
    """The running server stack: an object with ``url``, ``models`` (``ship``/``hosted`` keys)
    and ``versions``. Started once per session, torn down (every process, by PID) after it."""
    from benchmarks.remote_scale import load_harness

    harness_mod = load_harness()
    state = Path(os.environ.get("GRAFT_NDIF_STATE") or tmp_path_factory.mktemp("ndif"))
    harness = harness_mod.Harness(state)
    started = time.monotonic()
    try:
        harness.start()
    except Exception as exc:  # noqa: BLE001 - any failure to start fails the tests
        harness.stop()
        pytest.fail(f"the NDIF server stack did not start: {exc}", pytrace=False)
    REPORT["start_s"] = round(time.monotonic() - started, 1)
    REPORT["start_steps_s"] = dict(harness.timings)
    REPORT["versions"] = harness.versions
    tests_started = time.monotonic()
    try:
        yield harness
    finally:
        REPORT["tests_s"] = round(time.monotonic() - tests_started, 1)
        stopped = time.monotonic()
        harness.stop()
        REPORT["teardown_s"] = round(time.monotonic() - stopped, 1)
        (state / "report.json").write_text(json.dumps(REPORT, indent=2))


@contextlib.contextmanager
def sandbox_path():
    """Send requests as untrusted, so the server runs them in its sandbox runner process.

    With auth off (no key database) the ndif API honours a ``trusted`` field in the
    request envelope and defaults it to true; nnsight's client never sends one. This adds
    ``"trusted": false`` to the envelope for the duration.
    """
    from nnsight.schema.request import RequestModel

    original = RequestModel.metadata

    def metadata(self) -> str:
        return json.dumps(json.loads(original(self)) | {"trusted": False})

    RequestModel.metadata = metadata
    try:
        yield
    finally:
        RequestModel.metadata = original


@pytest.fixture(params=["trusted", "sandbox"])
def server_path(request):
    """Runs the test once on the server's in-process (trusted) path and once in its sandbox."""
    if request.param == "sandbox":
        with sandbox_path():
            yield request.param
    else:
        yield request.param


def pytest_terminal_summary(terminalreporter):
    if REPORT:
        terminalreporter.write_line(f"real NDIF server: {json.dumps(REPORT, sort_keys=True)}")
