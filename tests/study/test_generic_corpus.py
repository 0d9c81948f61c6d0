"""The gentle preset's generic corpus: hub, file or stand-in, fixed into the donor's identity.

No test touches the network: the hub is a stand-in ``datasets`` module or a patched
:func:`graft.study.data.generic_corpus.fetch_paper_corpus`.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import types

import pytest

from graft.errors import FinetuneError
from graft.study import DonorRequest, resolve_config
from graft.study.data import generic_corpus as gc
from graft.study.data.datasets import DatasetConfig, generate_dataset
from graft.study.data.files import load_generic_texts
from graft.study.specs import presets
from graft.study.training.workspace import Workspace

GENTLE = presets.resolve_config("gentle")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return generate_dataset(DatasetConfig(n_facts=4), tmp_path_factory.mktemp("data") / "facts")


@pytest.fixture(autouse=True)
def hub_answers(monkeypatch):
    """The hub's probe answers (the stand-in ``datasets`` module decides what is read)."""
    monkeypatch.setattr(gc, "hub_reachable", lambda: True)


def test_a_hub_that_does_not_answer_the_probe_is_not_asked(monkeypatch):
    """Without an answer to the one quick probe, nothing is asked of the download library
    (which would retry for minutes) and the failure names the endpoint."""
    tries: list[str] = []
    _fake_datasets(monkeypatch, lambda *a, **k: tries.append("asked"))
    monkeypatch.setattr(gc, "hub_reachable", lambda: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(gc, "offline_requested", lambda: False)
    with pytest.raises(gc.HubUnavailable, match=r"127\.0\.0\.1:9\) did not answer"):
        gc.fetch_paper_corpus(n=2)
    assert tries == []


@pytest.fixture
def no_hub(monkeypatch):
    """The hub cannot be reached; counts the tries."""
    tries: list[int] = []

    def fail(*args, **kwargs):
        tries.append(1)
        raise gc.HubUnavailable("no network in tests")

    monkeypatch.setattr(gc, "fetch_paper_corpus", fail)
    return tries


def test_hub_unavailable_falls_back_to_the_stand_in_with_a_warning(dataset, no_hub, caplog):
    with caplog.at_level(logging.WARNING, logger=gc.__name__):
        settled = gc.settle(GENTLE, dataset)
    assert no_hub == [1]
    assert "unavailable: no network in tests" in caplog.text
    assert "61 shipped stand-in passages" in caplog.text
    assert settled.generic_corpus_id is not None
    assert settled.generic_corpus_id.startswith("stand-in:sha256=")
    corpus = gc.choose(settled, dataset)
    assert corpus.stand_in and corpus.texts == load_generic_texts()
    assert corpus.record()["stand_in"] is True and "not the paper's" in corpus.record()["note"]
    # a different donor from the preset's own (unsettled) config
    assert settled.key() != GENTLE.key() and settled.key().startswith("gentle-")


def test_the_hub_corpus_is_kept_in_the_workspace_and_read_back_offline(
    dataset, tmp_path, monkeypatch
):
    passages = [f"Passage number {i}." for i in range(6)]
    monkeypatch.setattr(gc, "fetch_paper_corpus", lambda *a, **k: passages)
    corpora = tmp_path / "corpora"
    settled = gc.settle(GENTLE, dataset, corpora)
    assert settled.generic_corpus_id == gc.HUB_ID
    assert (corpora / gc.HUB_FILE).is_file()

    def offline(*args, **kwargs):
        raise AssertionError("the cached corpus must not be fetched again")

    monkeypatch.setattr(gc, "fetch_paper_corpus", offline)
    again = gc.choose(settled, dataset, corpora)
    assert again.texts == passages and again.identity == gc.HUB_ID and not again.stand_in
    assert gc.settle(GENTLE, dataset, corpora) == settled


def test_a_fixed_hub_corpus_that_is_gone_is_an_error_not_a_fallback(dataset, tmp_path, no_hub):
    fixed = dataclasses.replace(GENTLE, generic_corpus_id=gc.HUB_ID)
    with pytest.raises(FinetuneError, match="set up with the paper's generic corpus"):
        gc.choose(fixed, dataset, tmp_path / "corpora")


def test_a_file_corpus_is_named_by_its_contents(dataset, tmp_path, no_hub):
    corpus = tmp_path / "mine.txt"
    corpus.write_text("First passage.\nSecond passage.\n")
    settled = gc.settle(dataclasses.replace(GENTLE, generic_corpus=str(corpus)), dataset)
    assert no_hub == []  # a given file never asks the hub
    assert settled.generic_corpus_id is not None
    assert settled.generic_corpus_id.startswith("file:mine.txt;sha256=")
    assert gc.choose(settled, dataset).texts == ["First passage.", "Second passage."]
    corpus.write_text("First passage.\nA changed passage.\n")
    with pytest.raises(FinetuneError, match="set up with file:mine.txt"):
        gc.choose(settled, dataset)
    changed = gc.settle(dataclasses.replace(GENTLE, generic_corpus=str(corpus)), dataset)
    assert changed.key() != settled.key()  # another corpus, another donor


def test_the_stand_in_asked_for_is_said_too_and_is_the_fallbacks_donor(dataset, no_hub):
    settled = gc.settle(dataclasses.replace(GENTLE, generic_corpus=gc.STAND_IN), dataset)
    assert no_hub == []
    assert gc.choose(settled, dataset).record()["stand_in"] is True
    assert gc.settle(GENTLE, dataset).key() == settled.key()


def test_donors_of_different_corpora_live_in_different_folders(
    dataset, tmp_path, monkeypatch, no_hub
):
    corpus = tmp_path / "mine.txt"
    corpus.write_text("One passage.\nTwo passages.\n")
    ws = Workspace(tmp_path / "ws")
    stand_in = ws.locate_donor(DonorRequest("tiny-llama", dataset, "one", resolve_config("gentle")))
    given = dataclasses.replace(GENTLE, generic_corpus=str(corpus))
    mine = ws.locate_donor(DonorRequest("tiny-llama", dataset, "one", given))
    assert stand_in.path != mine.path
    assert mine.config.generic_corpus_id is not None
    assert mine.config.generic_corpus_id.startswith("file:")
    # the cpu preset mixes in nothing: no corpus is looked for, a given one changes nothing
    cpu = ws.locate_donor(DonorRequest("tiny-llama", dataset, "one", resolve_config("cpu")))
    assert cpu.config.generic_corpus_id is None and cpu.path.name == "cpu"
    cpu_given = dataclasses.replace(presets.CPU, generic_corpus=str(corpus))
    assert ws.locate_donor(DonorRequest("tiny-llama", dataset, "one", cpu_given)).path == cpu.path
    assert len(no_hub) == 1


def _fake_datasets(monkeypatch, load) -> None:
    module = types.ModuleType("datasets")
    module.load_dataset = load  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", module)


def test_fetch_samples_half_of_each_paper_source_with_the_fixed_seed(monkeypatch):
    calls = []

    class Stream:
        def __init__(self, repo):
            self.repo = repo

        def shuffle(self, seed, buffer_size):
            calls.append((self.repo, seed, buffer_size))
            return self

        def take(self, k):
            return [{"text": f"{self.repo} {i} " + "x" * 5000} for i in range(k)]

    _fake_datasets(monkeypatch, lambda repo, split, streaming: Stream(repo))
    texts = gc.fetch_paper_corpus(n=5, seed=7)
    assert [c[:2] for c in calls] == [(repo, 7) for repo, _ in gc.PAPER_SOURCES]
    owt, imdb = gc.PAPER_SOURCES[0][0], gc.PAPER_SOURCES[1][0]
    assert [t.split()[0] for t in texts] == [owt] * 3 + [imdb] * 2
    assert all(len(t) == gc.KEEP_CHARS for t in texts)


def test_fetch_says_why_the_hub_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
    with pytest.raises(gc.HubUnavailable, match=r"pip install 'graft-interp\[corpus\]'"):
        gc.fetch_paper_corpus()

    tries = []

    def unreachable(repo, split, streaming, revision=None):
        tries.append(revision)
        raise ConnectionError("Couldn't reach the hub")

    _fake_datasets(monkeypatch, unreachable)
    hub = gc.PaperCorpusHub()
    with pytest.raises(gc.HubUnavailable, match="openwebtext could not be read.*reach the hub"):
        gc.fetch_paper_corpus(hub=hub)
    assert tries == [None, gc.PARQUET_REVISION]  # the main branch, then the Parquet copy
    assert hub.failure is not None and "reach the hub" in hub.failure
    with pytest.raises(gc.HubUnavailable, match="openwebtext could not be read"):
        hub.fetch()
    assert len(tries) == 2  # asked once by this object


def test_two_hub_objects_share_nothing(monkeypatch):
    """The failure is the object's, not the process's: another object asks again, and a
    working hub after a failing one is read."""
    tries: list[str | None] = []
    online = [False]

    class Stream:
        def shuffle(self, seed, buffer_size):
            return self

        def take(self, k):
            return [{"text": "a passage"}] * k

    def load(repo, split, streaming, revision=None):
        tries.append(revision)
        if not online[0]:
            raise ConnectionError("Couldn't reach the hub")
        return Stream()

    _fake_datasets(monkeypatch, load)
    first, second = gc.PaperCorpusHub(), gc.PaperCorpusHub()
    with pytest.raises(gc.HubUnavailable):
        first.fetch(n=2)
    assert len(tries) == 2 and second.failure is None
    with pytest.raises(gc.HubUnavailable):
        second.fetch(n=2)
    assert len(tries) == 4  # its own ask
    online[0] = True
    assert gc.PaperCorpusHub().fetch(n=2) == ["a passage"] * 2
    with pytest.raises(gc.HubUnavailable):  # the failed objects keep their answer
        first.fetch(n=2)
    # the module function asks through a new object unless given one
    assert gc.fetch_paper_corpus(n=2) == ["a passage"] * 2
    with pytest.raises(gc.HubUnavailable):
        gc.fetch_paper_corpus(n=2, hub=second)


def test_a_workspace_asks_the_hub_once_for_all_its_donors(dataset, tmp_path, monkeypatch, caplog):
    """A workspace locates several donors (a run does, per replicate): its hub is asked
    once, and every gentle donor falls back to the same stand-in."""
    tries: list[str | None] = []

    def unreachable(repo, split, streaming, revision=None):
        tries.append(revision)
        raise ConnectionError("Couldn't reach the hub")

    _fake_datasets(monkeypatch, unreachable)
    ws = Workspace(tmp_path / "ws")
    with caplog.at_level(logging.WARNING, logger=gc.__name__):
        one = ws.locate_donor(DonorRequest("tiny-llama", dataset, "one", resolve_config("gentle")))
        seeded = dataclasses.replace(GENTLE, seed=GENTLE.seed + 1)
        other = ws.locate_donor(DonorRequest("tiny-llama", dataset, "one", seeded))
    assert tries == [None, gc.PARQUET_REVISION]  # one ask: the main branch, then Parquet
    assert one.path != other.path
    assert one.config.generic_corpus == other.config.generic_corpus == gc.STAND_IN
    assert caplog.text.count("openwebtext could not be read") == 2  # said for each donor
    Workspace(tmp_path / "ws").locate_donor(
        DonorRequest("tiny-llama", dataset, "one", resolve_config("gentle"))
    )
    assert len(tries) == 4  # another workspace object asks again


def test_a_dataset_whose_main_branch_has_a_script_is_read_from_its_parquet_copy(monkeypatch):
    def scripts_gone(repo, split, streaming, revision=None):
        if revision is None:
            raise RuntimeError("Dataset scripts are no longer supported")
        assert revision == gc.PARQUET_REVISION
        return types.SimpleNamespace(
            shuffle=lambda seed, buffer_size: types.SimpleNamespace(
                take=lambda k: [{"text": f"{repo} passage"}] * k
            )
        )

    _fake_datasets(monkeypatch, scripts_gone)
    assert len(gc.fetch_paper_corpus(n=4)) == 4
