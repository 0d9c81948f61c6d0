"""Dataset folders read back as written: sha256-verified files, unique prompt ids, lengths
bounded before tokenizing, seeds in range, disk errors as one line (issue 24)."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from graft.errors import DamagedFileError, DatasetError, StorageError
from graft.models import ensure_embedded, tiny_tokenizer
from graft.ranges import MAX_SEED
from graft.storage import files as result_files
from graft.study.data.datasets import (
    DatasetConfig,
    generate_dataset,
    load_dataset_corpus,
    load_facts,
    load_manifest,
    load_train_records,
    validate_config,
    verify_dataset,
)
from graft.study.data.files import load_generic_texts
from graft.study.data.prompts import char_bound, load_test_prompts
from graft.study.data.training_data import TokenisedTexts, cut_for_tokens, load_fact_dataset
from graft.study.training.workspace import Workspace
from tests.fast_tier import slow_except


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _without_hashes(folder: Path) -> Path:
    """``folder`` made a hand-made dataset: its manifest records no hashes."""
    manifest = load_manifest(folder)
    manifest.pop("files")
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return folder


def _config(tmp_path: Path) -> DatasetConfig:
    return DatasetConfig(n_facts=3, corpus_path=tmp_path / "corpus.txt")


@pytest.fixture
def dataset(tmp_path) -> Path:
    (tmp_path / "corpus.txt").write_text("One generic document.\nAnother generic document.\n")
    return generate_dataset(_config(tmp_path), tmp_path / "d")


# --------------------------------------------------------------------------- sha256 verified


def test_hand_edited_test_prompts_are_refused_not_used(dataset, tmp_path):
    """An edited test_prompts.jsonl (still valid JSON) was used silently."""
    rows = _rows(dataset / "test_prompts.jsonl")
    rows[0]["target_text"] = " Somebody Else"
    _write_rows(dataset / "test_prompts.jsonl", rows)
    path = dataset / "test_prompts.jsonl"
    with pytest.raises(DamagedFileError) as info:
        load_test_prompts(dataset, tiny_tokenizer())
    message = str(info.value)
    assert message.startswith(f"{path} does not match the sha256 in manifest.json")
    assert f"delete {dataset}" in message and "restore the file" in message
    assert "\n" not in message
    for load in (load_fact_dataset, load_facts, load_train_records, load_dataset_corpus):
        with pytest.raises(DamagedFileError, match="test_prompts.jsonl does not match"):
            load(dataset)
    # the same config is not "kept as it is" over a damaged copy; overwrite regenerates it
    config = _config(tmp_path)
    with pytest.raises(DamagedFileError, match="test_prompts.jsonl does not match"):
        generate_dataset(config, dataset)
    generate_dataset(config, dataset, overwrite=True)
    assert load_test_prompts(dataset, tiny_tokenizer())[1].kept > 0


@pytest.mark.parametrize("name", ["train.jsonl", "facts.jsonl", "corpus.jsonl"])
def test_every_hashed_file_is_verified(dataset, name):
    path = dataset / name
    path.write_bytes(path.read_bytes()[:-10])  # truncated by a crash
    with pytest.raises(DamagedFileError, match=f"{name} does not match the sha256"):
        load_fact_dataset(dataset)
    path.unlink()
    with pytest.raises(DamagedFileError, match=f"{name} is recorded in manifest.json but missing"):
        load_test_prompts(dataset, tiny_tokenizer())


def test_a_dataset_without_hashes_is_accepted_as_edited(dataset):
    """The escape hatch for hand-made datasets: a manifest without "files" (or none)."""
    rows = _rows(dataset / "test_prompts.jsonl")
    rows[0]["target_text"] = " Somebody Else"
    _write_rows(dataset / "test_prompts.jsonl", rows)
    with pytest.raises(DamagedFileError, match='remove "files" from .*manifest.json'):
        verify_dataset(dataset)
    _without_hashes(dataset)
    examples, _ = load_test_prompts(dataset, tiny_tokenizer())
    assert examples[0].target_text == " Somebody Else"
    (dataset / "manifest.json").unlink()
    assert load_test_prompts(dataset, tiny_tokenizer())[0][0].target_text == " Somebody Else"


def test_a_damaged_manifest_is_one_line(dataset):
    (dataset / "manifest.json").write_text('{"files": {"train.jsonl": "ab')
    with pytest.raises(DamagedFileError, match="manifest.json is not a JSON object"):
        load_test_prompts(dataset, tiny_tokenizer())


def test_each_file_is_hashed_once_per_process(dataset, monkeypatch):
    hashed: list[int] = []
    real = result_files.hashlib.sha256

    def counting():
        hashed.append(1)
        return real()

    monkeypatch.setattr(result_files.hashlib, "sha256", counting)
    monkeypatch.setattr(result_files, "_HASHES", {})
    load_test_prompts(dataset, tiny_tokenizer())
    assert len(hashed) == len(load_manifest(dataset)["files"]) == 4
    load_test_prompts(dataset, tiny_tokenizer())
    load_fact_dataset(dataset)
    assert len(hashed) == 4


# --------------------------------------------------------------------------- duplicate ids


def test_duplicate_prompt_ids_are_refused_at_load(dataset):
    """Found only after every experiment row had run."""
    _without_hashes(dataset)
    rows = _rows(dataset / "test_prompts.jsonl")
    _write_rows(dataset / "test_prompts.jsonl", [*rows, rows[0], rows[2]])
    with pytest.raises(DatasetError) as info:
        load_test_prompts(dataset, tiny_tokenizer(), templates=["qa"])  # other templates too
    message = str(info.value)
    assert message.startswith(f"{dataset / 'test_prompts.jsonl'} repeats the prompt id(s) ")
    assert repr(rows[0]["id"]) in message and repr(rows[2]["id"]) in message
    assert "give each prompt its own id" in message and info.value.param == "dataset"


# --------------------------------------------------------------------------- length bounds


class _WatchedTokenizer:
    """The tiny tokenizer, recording the longest text it was asked to tokenize."""

    def __init__(self) -> None:
        self.inner = tiny_tokenizer()
        self.longest = 0

    def __call__(self, text: str, *args: Any, **kwargs: Any) -> Any:
        self.longest = max(self.longest, len(text))
        return self.inner(text, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("whole_target", [False, True])
def test_a_huge_prompt_is_dropped_without_tokenizing_it(dataset, whole_target):
    """A 10 MB test prompt took 63 s and 5.3 GB before being dropped as too_long."""
    _without_hashes(dataset)
    rows = _rows(dataset / "test_prompts.jsonl")
    limit = 256  # every other prompt and target fits
    rows[0]["text"] += " x" * char_bound(limit)
    _write_rows(dataset / "test_prompts.jsonl", rows)
    tokenizer = _WatchedTokenizer()
    examples, report = load_test_prompts(
        dataset, tokenizer, directions=None, max_length=limit, whole_target=whole_target
    )
    assert report.dropped == {"too_long": 1} and report.dropped_ids == [rows[0]["id"]]
    assert report.kept == len(rows) - 1 == len(examples)
    assert 0 < tokenizer.longest < 200


@pytest.mark.slow
def test_the_character_bound_holds_for_the_shipped_tokenizers():
    """No token of the tokenizers graft ships (or embeds) covers more than the bound's
    characters, so a text over ``char_bound(n)`` characters surely has over ``n`` tokens."""
    from transformers import AutoTokenizer

    tokenizers = [tiny_tokenizer()]
    for name in ("smollm2-135m", "gemma3-270m"):
        tokenizers.append(AutoTokenizer.from_pretrained(ensure_embedded(name)))
    for tok in tokenizers:
        longest = max(map(len, tok.batch_decode([[i] for i in range(len(tok))])))
        assert longest <= char_bound(1), (tok.name_or_path, longest)


# --------------------------------------------------------------------------- training texts


def _training_texts(dataset: Path) -> list[str]:
    texts = [r["text"] for r in load_train_records(dataset)] + load_generic_texts()
    long = " ".join(load_generic_texts())  # a realistic text longer than every cut below
    return [*texts, long, "\n\n".join(texts)]


@pytest.mark.parametrize("name", slow_except(["tiny", "smollm2-135m", "gemma3-270m"], "tiny"))
def test_cutting_training_texts_keeps_their_tokens(dataset, name):
    """The cut before tokenizing changes no token of realistic texts, at any max_length,
    including texts far longer than the cut."""
    from transformers import AutoTokenizer

    tok = (
        tiny_tokenizer() if name == "tiny" else AutoTokenizer.from_pretrained(ensure_embedded(name))
    )
    texts = _training_texts(dataset)
    assert all(len(t) > len(cut_for_tokens(t, 16)) for t in texts[-2:])  # cut at 4 and 16
    for max_length in (4, 16, 128, 512):
        cut = TokenisedTexts(texts, tok, max_length).items
        whole = [tok(t, truncation=True, max_length=max_length)["input_ids"] for t in texts]
        assert cut == whole, (name, max_length)


def test_a_huge_training_text_is_cut_before_tokenizing():
    """A 10 MB training line took 2.7 GB to tokenize before truncation."""
    tokenizer = _WatchedTokenizer()
    items = TokenisedTexts(["word " * 2_000_000, "A short text."], tokenizer, 128).items
    assert len(items[0]) == 128 and items[1] == tiny_tokenizer()("A short text.")["input_ids"]
    assert tokenizer.longest == 2 * char_bound(128)


# --------------------------------------------------------------------------- seeds, disk


@pytest.mark.parametrize("seed", [MAX_SEED + 1, 99999999999999999999999, -1, True, 1.5])
def test_a_seed_out_of_range_is_refused_before_anything_is_written(tmp_path, seed):
    """--data-seed 99999999999999999999999 was an OverflowError after the dataset was made."""
    # DatasetConfig itself refuses it (graft.ranges), before anything is written
    with pytest.raises(DatasetError, match=r"seed must be (a whole number|at most|>= 0)") as info:
        generate_dataset(DatasetConfig(n_facts=2, seed=seed), tmp_path / "d")
    assert info.value.param == "seed" and "\n" not in str(info.value)
    with pytest.raises(DatasetError, match="seed must be"):
        Workspace(tmp_path / "ws").generated_dataset("fake_movies_real_actors", seed=seed)
    assert not (tmp_path / "d").exists() and not (tmp_path / "ws" / "datasets").exists()
    validate_config(DatasetConfig(seed=MAX_SEED))


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(
        StorageError, match="cannot write the dataset to .*No space left on device"
    ) as info:
        generate_dataset(DatasetConfig(n_facts=2), tmp_path / "d")
    assert info.value.param == "out" and "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []
