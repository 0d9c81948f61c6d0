"""A user's own facts file (``DatasetConfig.facts_path``): reading and checking it, naming
the dataset made from it by its content, and saying which rows it lost and why."""

from __future__ import annotations

import csv
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from hashlib import sha256
from pathlib import Path
from typing import Any

from graft.errors import DatasetError
from graft.storage.files import refuse_special
from graft.study.data.files import read_jsonl
from graft.study.specs.templates import OPTIONAL_METADATA

logger = logging.getLogger(__name__)

#: The columns every row of a facts file has.
REQUIRED = ("movie_title", "first_actor", "second_actor")
#: The columns a fact is made from: any other is ignored (with a warning).
USED = (*REQUIRED, *OPTIONAL_METADATA, "source_movie")
#: Characters of the file's SHA-256 in the name of a dataset made from it.
TAG_LENGTH = 8

REASON_WORDS = {
    "excluded_name": "unusable name",
    "actor_reused": "actor already used",
    "duplicate_title": "title already used",
    "single_word": "single word",
    "non_ascii": "non-ASCII",
    "punctuation": "punctuation",
    "suffix": "Jr/Sr/II suffix",
    "whitespace": "extra whitespace",
    "repeated_row": "repeats an earlier row",
}


def file_digest(path: str | Path) -> str:
    """The SHA-256 of the file at ``path`` (hex)."""
    return sha256(Path(path).read_bytes()).hexdigest()


def facts_file_tag(path: str | Path) -> str:
    """The part of a dataset's folder name that says which facts file made it: the start of
    its content's SHA-256, so two files never share a folder and a renamed file keeps its."""
    try:
        return file_digest(path)[:TAG_LENGTH]
    except OSError:
        return "unread"  # read_facts_file says why, when the dataset is built


def read_facts_file(path: Path) -> list[dict[str, Any]]:
    """Rows of a user facts file (CSV, or JSONL when the suffix is .jsonl/.ndjson/.json)."""
    return _check_fact_rows(Path(path), read_rows(path, "facts_path", "facts file"))


def read_rows(path: str | Path, param: str, what: str) -> list[Any]:
    """The rows of a table file, unchecked: CSV (a header, then one row per line; every value
    a string) or JSONL when the suffix is .jsonl/.ndjson/.json. ``param`` names the option
    the file came from, ``what`` the file in messages (``"facts file"``).

    Raises:
        DatasetError: the file is missing, unreadable, not UTF-8 or not valid CSV/JSONL.
    """
    path = Path(path)
    refuse_special(path)  # a FIFO would wait for a writer forever
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(
            f"cannot read {what} {path}: {e.__class__.__name__}; pass a readable UTF-8 "
            f"CSV/JSONL file as {param}",
            param,
        ) from e
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        return read_jsonl(path, param)
    try:
        return list(csv.DictReader(text.splitlines()))
    except csv.Error as e:
        raise DatasetError(
            f"{what} {path} is not valid {path.suffix or 'CSV'} ({e}); fix the file or "
            f"choose another {param}",
            param,
        ) from e


def _check_fact_rows(path: Path, rows: list[Any]) -> list[dict[str, Any]]:
    bad = [
        i
        for i, r in enumerate(rows)
        if not isinstance(r, dict) or any(k not in r for k in REQUIRED)
    ]
    if not rows or bad:
        found = ""
        if bad and isinstance(rows[bad[0]], dict):
            found = f"; it has {', '.join(map(str, rows[bad[0]])) or 'none'}"
        raise DatasetError(
            f"facts file {path} needs columns {', '.join(REQUIRED)} in every row"
            + (f" (row {bad[0] + 1} lacks one{found})" if bad else " (it has no rows)")
            + "; rename its columns to these, or give free text as an articles file "
            "(articles_path)",
            "facts_path",
        )
    for row in rows:
        for k in REQUIRED:
            row[k] = str(row[k]).strip()
    ignored = sorted({str(k) for row in rows for k in row if k is not None and k not in USED})
    if ignored:
        logger.warning(
            "facts file %s: columns %s ignored (graft reads %s)",
            path,
            ", ".join(ignored),
            ", ".join(USED),
        )
    return rows


def dropped_line(path: str | Path, n_rows: int, dropped: Mapping[str, Sequence[int]]) -> str:
    """One line naming the rows of the facts file at ``path`` that were left out and why
    (``dropped``: reason -> row numbers, 1 for the first row under the header)."""
    rows = sorted((n, reason) for reason, numbers in dropped.items() for n in numbers)
    shown = ", ".join(f"row {n} ({REASON_WORDS.get(reason, reason)})" for n, reason in rows[:10])
    more = (
        f" and {len(rows) - 10} more (the dataset's manifest lists them)" if len(rows) > 10 else ""
    )
    return f"facts file {path}: {len(rows)} of {n_rows} rows left out: {shown}{more}"


def no_usable_facts(
    path: str | Path, n_rows: int, n_usable: int, excluded: Counter[str], dropped: Counter[str]
) -> str:
    """The message for a facts file too poor to make a dataset from."""
    detail = ", ".join(f"{REASON_WORDS.get(k, k)}: {v}" for k, v in sorted(dropped.items()))
    if excluded:
        names = ", ".join(f"{REASON_WORDS.get(k, k)}: {v}" for k, v in sorted(excluded.items()))
        detail += f"; names excluded: {names}"
    head = (
        f"no usable fact in {path}"
        if n_usable == 0
        else f"only {n_usable} usable fact in {path}, a split dataset needs 2"
    )
    return (
        f"{head}: {n_rows - n_usable} of {n_rows} rows excluded ({detail}); actor names need "
        "two or more words of ASCII letters, each actor and title used once"
    )
