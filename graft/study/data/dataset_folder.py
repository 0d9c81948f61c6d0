"""A dataset folder read back: the folder checked for its files, every file verified against
the sha256 its manifest records, and its manifest, facts, training records and generic text
read (what :mod:`graft.study.data.datasets` wrote)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from graft.errors import DamagedFileError, DatasetError
from graft.storage.files import file_sha256, refuse_special_under
from graft.study.data.facts import Fact
from graft.study.data.files import read_jsonl

#: The dataset's file of generic text (written only when the config names a corpus).
CORPUS_FILE = "corpus.jsonl"

#: The fields of a fact that have a default (a line may leave them out).
_DEFAULTED = {f.name for f in dataclasses.fields(Fact) if f.default is not dataclasses.MISSING}


def check_dataset_folder(dataset_dir: str | os.PathLike[str], files: Sequence[str]) -> Path:
    """``dataset_dir`` as a Path, if it is a folder holding ``files``.

    Raises:
        DatasetError: the folder does not exist, is empty or lacks one of ``files``; the
            message says how to make a dataset.
    """
    path = Path(dataset_dir)
    make = "make one with graft.study.data.datasets.generate_dataset"
    if not path.is_dir():
        raise DatasetError(f"dataset folder {path} does not exist; {make}", "dataset")
    refuse_special_under(path)
    missing = [name for name in files if not (path / name).is_file()]
    if missing:
        what = "is empty" if not any(path.iterdir()) else f"has no {', '.join(missing)}"
        raise DatasetError(f"dataset folder {path} {what}; {make}", "dataset")
    verify_dataset(path)
    return path


def _damaged(path: Path, problem: str) -> DamagedFileError:
    """The one-line error for a dataset file ``path`` that is not what graft wrote; a data
    file's also names the way to keep hand edits (drop the manifest's hashes)."""
    folder = path.parent
    keep = (
        ""
        if path.name == "manifest.json"
        else f'; to use hand-edited files, remove "files" from {folder / "manifest.json"}'
    )
    return DamagedFileError(
        f"{path} {problem} (edited or damaged); regenerate the dataset (delete {folder}; graft "
        f"regenerates a workspace dataset) or restore the file{keep}"
    )


def verify_dataset(dataset_dir: str | os.PathLike[str]) -> None:
    """Check every file whose sha256 the dataset's ``manifest.json`` records (under
    ``"files"``); each file is hashed once per process (:func:`file_sha256`). A folder
    without a manifest, or whose manifest records no hashes (one made by hand), passes.

    Raises:
        DamagedFileError: a recorded file is missing or its bytes differ from its hash.
    """
    folder = Path(dataset_dir)
    refuse_special_under(folder)  # before anything in it is opened (a FIFO would hang)
    if not (folder / "manifest.json").is_file():
        return
    hashes = load_manifest(folder).get("files")
    if hashes is None:
        return
    if not isinstance(hashes, dict):
        raise _damaged(
            folder / "manifest.json", 'has a "files" entry that is no name -> sha256 map'
        )
    for name, expected in sorted(hashes.items()):
        path = folder / str(name)
        if not path.is_file():
            raise _damaged(path, "is recorded in manifest.json but missing")
        if file_sha256(path) != expected:
            raise _damaged(path, "does not match the sha256 in manifest.json")


def dataset_line(dataset_dir: str | os.PathLike[str]) -> str:
    """One line saying what the dataset in ``dataset_dir`` holds: its facts (or articles),
    training texts and test prompts, from its manifest."""
    manifest = load_manifest(dataset_dir)
    sizes = manifest["sizes"]
    what = "articles" if manifest.get("config", {}).get("kind") == "articles" else "facts"
    return (
        f"{dataset_dir}: {sizes['facts']} {what}, {sizes['train']} training texts, "
        f"{sizes['test_prompts']} test prompts"
    )


def load_manifest(dataset_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The dataset's ``manifest.json``.

    Raises:
        DamagedFileError: it is not a JSON object.
    """
    path = Path(dataset_dir) / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        manifest = None
    if not isinstance(manifest, dict):
        raise _damaged(path, "is not a JSON object")
    return manifest


def load_facts(dataset_dir: str | os.PathLike[str]) -> list[Fact]:
    """The dataset's facts (the folder's files checked by :func:`verify_dataset`).

    Raises:
        DatasetError: a line of ``facts.jsonl`` is no fact (fields missing or unknown).
    """
    verify_dataset(dataset_dir)
    path = Path(dataset_dir) / "facts.jsonl"
    facts = []
    for number, row in enumerate(read_jsonl(path), 1):
        try:
            facts.append(Fact(**row))
        except TypeError:
            fields = {f.name for f in dataclasses.fields(Fact)}
            missing = sorted(fields - set(row) - _DEFAULTED)
            unknown = sorted(set(row) - fields)
            problem = f"lacks {', '.join(missing)}" if missing else f"has {', '.join(unknown)}"
            raise DatasetError(
                f"{path} line {number} is no fact: it {problem}; each line needs the fields "
                f"{', '.join(sorted(fields - _DEFAULTED))} (regenerate the dataset or fix the line)"
            ) from None
    return facts


def check_facts(dataset_dir: str | os.PathLike[str]) -> None:
    """Raise as :func:`load_facts` does when the dataset has a ``facts.jsonl`` (articles
    datasets have none), before a run's batches rather than after them."""
    if (Path(dataset_dir) / "facts.jsonl").is_file():
        load_facts(dataset_dir)


def load_train_records(
    dataset_dir: str | os.PathLike[str],
    *,
    sets: Sequence[str] | None = None,
    directions: Sequence[str] | None = None,
    styles: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Training records (text, fact_id, set, style, template, direction), optionally
    restricted to some sets (``"A"``/``"B"``/``"all"``), directions or styles; the folder's
    files checked by :func:`verify_dataset`."""
    verify_dataset(dataset_dir)
    return [
        r
        for r in read_jsonl(Path(dataset_dir) / "train.jsonl")
        if (sets is None or r["set"] in sets)
        and (directions is None or r["direction"] in directions)
        and (styles is None or r["style"] in styles)
    ]


def load_dataset_corpus(dataset_dir: str | os.PathLike[str]) -> list[str]:
    """The extra corpus stored with the dataset (empty when none was given); the folder's
    files checked by :func:`verify_dataset`."""
    verify_dataset(dataset_dir)
    path = Path(dataset_dir) / CORPUS_FILE
    return [r["text"] for r in read_jsonl(path)] if path.is_file() else []
