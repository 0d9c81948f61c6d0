"""The hub's probe (:mod:`graft.models.hub`): asked once per process, quick when nothing
answers, online with a local server as ``HF_ENDPOINT``; offline from the hub cache in one
line, where the installed libraries read it; a cached hub model loads at once without a hub."""

from __future__ import annotations

import http.server
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import huggingface_hub.constants
import pytest

from graft.errors import ModelNotFoundError
from graft.models import hub


@pytest.fixture(autouse=True)
def fresh_hub(monkeypatch):
    """A process that has not probed and is online; whatever a test switches is undone."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "_answers", {})
    monkeypatch.setattr(hub, "_offline_reason", [])


def _closed_port() -> str:
    """An endpoint on this machine where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def local_hub():
    """An HTTP server on 127.0.0.1 that answers every HEAD (404) and counts the requests."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 (the handler's name)
            asked.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()
    server.server_close()


def test_a_local_server_as_the_endpoint_is_online_and_asked_once(monkeypatch, local_hub):
    url, asked = local_hub
    monkeypatch.setenv("HF_ENDPOINT", url)
    assert hub.hub_reachable() and hub.hub_reachable()
    assert asked == ["/"]  # one probe per process, an error status counts as an answer
    hub.prepare_hub("owner/model")  # online: nothing switched
    assert not huggingface_hub.constants.HF_HUB_OFFLINE and hub.offline_note() is None


def test_nothing_listening_is_offline_at_once(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", _closed_port())
    start = time.perf_counter()
    assert not hub.hub_reachable()
    assert time.perf_counter() - start < 1.0


def test_an_endpoint_that_never_answers_is_offline_within_the_timeout(monkeypatch):
    """A listener that never answers (a dropped packet looks the same): the probe gives up
    after its timeout, not after the download library's minutes."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        start = time.perf_counter()
        assert not hub.hub_reachable(timeout=0.3)
        assert 0.25 < time.perf_counter() - start < 1.5


def test_offline_mode_asks_nothing(monkeypatch, local_hub):
    url, asked = local_hub
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not hub.hub_reachable()
    hub.prepare_hub("owner/model")  # the user's choice: no probe, no line
    assert asked == [] and hub.offline_note() is None


def test_a_cached_model_without_a_hub_goes_offline_in_one_line(monkeypatch, caplog, local_hub):
    """Offline where this installation's libraries read it: transformers says offline and
    huggingface_hub answers from the cache without a request (the endpoint is a local server
    counting them, taken for silent); one warning for any number of loads."""
    from huggingface_hub.errors import LocalEntryNotFoundError
    from transformers.utils import hub as transformers_hub

    endpoint, asked = local_hub
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(hub, "_answers", {endpoint: False})
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(hub, "in_hub_cache", lambda _hub_id: True)
    with caplog.at_level(logging.WARNING, logger="graft.models.hub"):
        hub.prepare_hub("owner/model")
        hub.prepare_hub("owner/other")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and endpoint in lines[0] and "HF_HUB_OFFLINE=1" in lines[0]
    assert os.environ["HF_HUB_OFFLINE"] == "1" and transformers_hub.is_offline_mode()
    assert hub.offline_note() == lines[0]
    with pytest.raises(LocalEntryNotFoundError):
        huggingface_hub.hf_hub_download("owner/not-cached", "config.json")
    assert asked == []


def test_an_uncached_model_without_a_hub_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", _closed_port())
    monkeypatch.setattr(hub, "in_hub_cache", lambda _hub_id: False)
    with pytest.raises(ModelNotFoundError, match=r"did not answer.*not in the hub cache.*GRAFT"):
        hub.prepare_hub("owner/model")
    assert not huggingface_hub.constants.HF_HUB_OFFLINE


_LOAD = """
import logging, sys, time
logging.basicConfig(format="%(message)s")
import graft
start = time.perf_counter()
loaded = graft.load_model("graft-test/tiny")
print(loaded.source, round(time.perf_counter() - start, 1))
"""


@pytest.mark.slow
def test_a_cached_hub_model_loads_at_once_without_a_hub(tmp_path):
    """The case of the issue: a model in the hub cache, no network, no HF_HUB_OFFLINE. The
    model loads in seconds with one line, not minutes of "Retrying in 8s"."""
    from graft.models import tiny_model, tiny_tokenizer

    repo = tmp_path / "hf" / "hub" / "models--graft-test--tiny"
    snapshot = repo / "snapshots" / ("a" * 40)
    tiny_model("llama", seed=0).save_pretrained(snapshot)
    tiny_tokenizer().save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_HUB_CACHE")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT=_closed_port())
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", _LOAD], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    source, seconds = done.stdout.split()
    assert source == "hub" and float(seconds) < 60  # the retries alone take minutes
    assert done.stderr.count("did not answer") == 1 and "Retrying" not in done.stderr
