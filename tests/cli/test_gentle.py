"""E5, gentle finetuning, as one path: ``graft-exp finetune --preset gentle`` writes the donor
that ``graft-exp position --preset gentle`` then finds (and does not finetune again), with
its generic corpus named in the donor's record and the run's ``config.json``. The hub is
never reached: :func:`graft.study.data.generic_corpus.fetch_paper_corpus` is patched.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graft.study.data import generic_corpus as gc
from graft.study.training import workspace as ws_mod
from tests.cli.test_experiments import invoke

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

SMALL = ("--model", "tiny-llama", "--n-facts", "6", "--finetune-max-steps", "2", "--quiet")


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    def fail(*args, **kwargs):
        raise gc.HubUnavailable("no network in tests")

    monkeypatch.setattr(gc, "fetch_paper_corpus", fail)


def finetuned(workspace: Path) -> list[Path]:
    return sorted(p.parent for p in workspace.glob("finetuned/**/finetune_config.json"))


def finetune_then_position(
    tmp_path: Path, monkeypatch, *corpus: str
) -> tuple[dict, dict, str, str]:
    """Finetune the gentle donor, then run position with the same options while finetuning
    is forbidden; (the donor's record, the run's config.json, both outputs)."""
    ws = tmp_path / "ws"
    made = invoke("finetune", *SMALL, "--workspace", str(ws), "--preset", "gentle", *corpus)
    [donor] = finetuned(ws)

    def refinetune(*args, **kwargs):
        raise AssertionError("position finetuned again instead of finding the donor")

    monkeypatch.setattr(ws_mod, "finetune", refinetune)
    out = tmp_path / "run"
    ran = invoke(
        "position",
        *SMALL,
        "--workspace",
        str(ws),
        "--preset",
        "gentle",
        *corpus,
        "--n",
        "1",
        "--n-boot",
        "50",
        "--out",
        str(out),
    )
    assert finetuned(ws) == [donor]
    record = json.loads((donor / "finetune_config.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert str(donor) in config["finetuned_models"]
    return record, config, made.output, ran.output


def test_a_gentle_donor_with_a_corpus_file_is_the_one_position_finds(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "A generic passage."}\n{"text": "Another one."}\n')
    record, config, _, _ = finetune_then_position(
        tmp_path, monkeypatch, "--generic-corpus", str(corpus)
    )
    used = record["generic_corpus"]
    assert used["identity"].startswith("file:corpus.jsonl;sha256=")
    assert used["stand_in"] is False and used["passages"] == 2
    assert record["config"]["generic_corpus"] == str(corpus.resolve())
    assert record["n_generic_texts"] > 0
    assert config["options"]["generic_corpus"] == str(corpus)


def test_the_stand_in_is_said_in_a_warning_and_in_the_records(tmp_path, monkeypatch):
    record, config, made, ran = finetune_then_position(tmp_path, monkeypatch)
    for output in (made, ran):
        assert "no network in tests" in output and "stand-in passages instead" in output
    assert record["generic_corpus"]["stand_in"] is True
    assert record["config"]["generic_corpus_id"].startswith("stand-in:")
    [(_, donor_record)] = config["finetuned_models"].items()
    assert "not the paper's gentle finetuning" in donor_record["generic_corpus"]["note"]
