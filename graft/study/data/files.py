"""The study's text files: the one JSONL reader and writer, and text corpora.

Facts files, dataset files and corpora all go through here, so every bad line is reported
the same way: the file, the line number and what is wrong, as a :class:`DatasetError`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from graft.errors import DatasetError
from graft.storage.files import refuse_special

#: The files shipped with graft (real actors and movies, generic text).
RESOURCES = Path(__file__).parents[2] / "resources"
GENERIC_TEXT = RESOURCES / "generic_text.txt"


def read_jsonl(path: str | os.PathLike[str], param: str = "dataset") -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, one per non-blank line; the one JSONL reader of graft.

    ``param`` names the parameter the file came from, for :attr:`DatasetError.param`.

    Raises:
        DatasetError: the file is missing or unreadable, or a line is not a JSON object
            (the message names the file and the line number).
    """
    path = Path(path)
    refuse_special(path)  # a FIFO would wait for a writer forever
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DatasetError(f"{path} does not exist", param) from None
    except (OSError, UnicodeDecodeError) as err:
        raise DatasetError(
            f"cannot read {path} ({type(err).__name__}); it must be a UTF-8 JSONL file",
            param,
        ) from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(
                f"{path}, line {number}: not valid JSON ({err.msg}); fix or regenerate the file",
                param,
            ) from None
        if not isinstance(row, dict):
            raise DatasetError(
                f"{path}, line {number}: expected a JSON object, got {type(row).__name__}",
                param,
            )
        rows.append(row)
    return rows


def jsonl_bytes(records: Iterable[dict[str, Any]]) -> bytes:
    """``records`` as UTF-8 JSONL (one object per line, non-ASCII kept as is)."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def read_text_corpus(path: str | os.PathLike[str], param: str = "corpus_path") -> list[str]:
    """Documents of a corpus file: JSONL with a ``text`` field (``.jsonl``/``.ndjson``)
    or plain text with one document per non-empty line. ``param`` as for :func:`read_jsonl`."""
    path = Path(path)
    refuse_special(path)  # a FIFO would wait for a writer forever
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DatasetError(
            f"cannot read corpus {path}: it does not exist; pass an existing UTF-8 file", param
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(
            f"cannot read corpus {path}: {e.__class__.__name__}; pass a readable UTF-8 file",
            param,
        ) from e
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        rows = read_jsonl(path, param)
        lacking = [i for i, r in enumerate(rows, 1) if "text" not in r]
        if lacking:
            raise DatasetError(
                f"corpus {path} must hold one JSON object with a 'text' field per line "
                f"(object {lacking[0]} has none)",
                param,
            )
        docs = [str(r["text"]).strip() for r in rows]
        return [d for d in docs if d]
    return [line.strip() for line in lines if line.strip()]


def load_generic_texts(corpus: str | os.PathLike[str] | None = None) -> list[str]:
    """Generic passages for gentle finetuning: the documents of ``corpus``, else the shipped
    ``generic_text.txt``.

    Raises:
        DatasetError: the corpus does not exist, cannot be read or holds no document.
    """
    path = GENERIC_TEXT if corpus is None else Path(corpus)
    texts = read_text_corpus(path, "generic_corpus")
    if not texts:
        raise DatasetError(f"generic text corpus {path} is empty", "generic_corpus")
    return texts
