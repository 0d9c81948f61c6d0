"""Test prompts tokenized for one tokenizer, and the count of those that could not be.

A dataset stores each test prompt as text plus the character span of each field;
:func:`load_test_prompts` tokenizes them for a given tokenizer, maps the spans to token
positions and finds the target's first token. Prompts that cannot be used are dropped and
counted by reason in a :class:`DropReport`, never silently. :func:`entity_prompts` gives the
stored text, target and first entity of a template's prompts, untokenized (what
``graft.attribute`` and ``graft-exp attribution --dataset`` take).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graft.core.language.spans import TokenizedPrompt, tokenize_with_spans
from graft.errors import DatasetError
from graft.study.data.datasets import check_dataset_folder
from graft.study.data.files import read_jsonl

#: A bound on the characters one token covers: no token of the tokenizers graft uses decodes
#: to more (longest: SmolLM2 81, a newline and 80 spaces; gemma 3 31; the tiny models' 2;
#: GPT-2-style byte-level vocabularies merge at most 128 bytes). So a text of more than
#: ``n * MAX_CHARS_PER_TOKEN`` characters has more than ``n`` tokens, known without
#: tokenizing it; realistic text has 3-5 characters per token.
MAX_CHARS_PER_TOKEN = 128


def char_bound(n_tokens: int) -> int:
    """The most characters ``n_tokens`` tokens can cover (:data:`MAX_CHARS_PER_TOKEN`)."""
    return n_tokens * MAX_CHARS_PER_TOKEN


@dataclass
class TestExample:
    """A test prompt tokenized for one tokenizer.

    Args:
        fact_id: the fact the prompt asks about.
        template: test template name (``headline``, ``qa``, ``movie``).
        text: the prompt text.
        input_ids: its token ids (special tokens included as the tokenizer adds them).
        spans: field/alias -> token positions (``FE``, ``M``, ``R``, ``first_actor``, ...).
        target_text: the continuation whose first token is the target (``" " + actor``).
        target_id: that first token's id, as tokenized in context after the prompt.
        direction: ``"forward"`` (target second_actor) or ``"reverse"`` (actors swapped).
        prompt_id: the stored prompt's id, ``"<fact>:<template>:<direction>[:r<i>]"``.
        target_ids: every token of the target, as tokenized in context after the prompt
            (``target_ids[0] == target_id``): what whole-name scoring reads.
    """

    __test__ = False  # not a pytest class

    fact_id: int
    template: str
    text: str
    input_ids: list[int]
    spans: dict[str, list[int]]
    target_text: str
    target_id: int
    direction: str = "forward"
    prompt_id: str = ""
    target_ids: list[int] = field(default_factory=list)


@dataclass
class DropReport:
    """What :func:`load_test_prompts` kept and why it dropped the rest.

    Args:
        total: stored prompts that matched the template/direction filter.
        kept: prompts returned as :class:`TestExample`.
        dropped: reason -> count. Reasons: ``missing_span:<field>`` (no token overlaps the
            field), ``target_empty`` (the target adds no token), ``target_merges_with_prompt``
            (prompt + target does not start with the prompt's tokens),
            ``target_unknown_token`` (the target's first token is the unknown token),
            ``too_long`` (the prompt has more tokens than the model has positions; when
            the whole target is scored, the prompt and all target tokens but the last).
        dropped_ids: prompt ids of the dropped prompts, in file order.
    """

    total: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    dropped_ids: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line, e.g. ``kept 98/100 (missing_span:first_actor: 2)``."""
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.dropped.items()))
        return f"kept {self.kept}/{self.total}" + (f" ({reasons})" if reasons else "")


def _drop_reason(
    tokenizer: Any, record: dict[str, Any], prompt: TokenizedPrompt
) -> tuple[str | None, list[int]]:
    """Why the prompt cannot be used (None: it can), and the target's token ids."""
    for name in record["fields"]:
        if name in prompt.missing:
            return f"missing_span:{name}", []
    plain = list(tokenizer(record["text"], add_special_tokens=False)["input_ids"])
    full = list(
        tokenizer(record["text"] + record["target_text"], add_special_tokens=False)["input_ids"]
    )
    if full[: len(plain)] != plain:
        return "target_merges_with_prompt", []
    if len(full) == len(plain):
        return "target_empty", []
    target_ids = full[len(plain) :]
    if target_ids[0] is not None and target_ids[0] == getattr(tokenizer, "unk_token_id", None):
        return "target_unknown_token", []
    return None, target_ids


def _tokenizer_context(tokenizer: Any) -> int | None:
    """The tokenizer's ``model_max_length`` when it states a real one (HF uses ~1e30 for none)."""
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 1_000_000_000 else None


def _prompt_fields(path: Path, index: int, record: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """A stored prompt's field spans, checked against its text."""
    where = f"{path}, prompt {record.get('id', index)!r} (object {index})"
    missing = [k for k in _PROMPT_KEYS if k not in record]
    if missing:
        raise DatasetError(f"{where} lacks {', '.join(missing)}; regenerate the dataset", "dataset")
    text = record["text"]
    if not isinstance(text, str) or not isinstance(record["target_text"], str):
        raise DatasetError(f"{where}: text and target_text must be strings", "dataset")
    try:
        fields = {k: (int(v[0]), int(v[1])) for k, v in record["fields"].items()}
    except (AttributeError, TypeError, ValueError, IndexError, KeyError):
        raise DatasetError(
            f"{where}: fields must map names to [start, end] character spans", "dataset"
        ) from None
    for name, (start, end) in fields.items():
        if not 0 <= start <= end <= len(text):
            raise DatasetError(
                f"{where}: field {name!r} span ({start}, {end}) is outside its text "
                f"({len(text)} characters); fix the span or regenerate the dataset",
                "dataset",
            )
    return fields


def _example(
    tokenizer: Any,
    record: dict[str, Any],
    fields: dict[str, tuple[int, int]],
    add_special_tokens: bool,
    limit: int | None,
    whole_target: bool = False,
) -> tuple[TestExample | None, str | None]:
    """A stored prompt tokenized, or ``None`` and the reason it cannot be used;
    ``whole_target``: the prompt and all target tokens but the last must fit ``limit``."""
    if _surely_too_long(record, limit, whole_target):
        return None, "too_long"
    prompt = tokenize_with_spans(
        tokenizer, record["text"], fields, add_special_tokens=add_special_tokens
    )
    if limit is not None and len(prompt.input_ids) > limit:
        return None, "too_long"
    reason, target_ids = _drop_reason(tokenizer, record, prompt)
    if reason is not None:
        return None, reason
    if whole_target and limit is not None and len(prompt.input_ids) + len(target_ids) - 1 > limit:
        return None, "too_long"
    example = TestExample(
        fact_id=record["fact_id"],
        template=record["template"],
        text=record["text"],
        input_ids=prompt.input_ids,
        spans=prompt.spans,
        target_text=record["target_text"],
        target_id=int(target_ids[0]),
        direction=record["direction"],
        prompt_id=record["id"],
        target_ids=[int(t) for t in target_ids],
    )
    return example, None


def _surely_too_long(record: dict[str, Any], limit: int | None, whole_target: bool) -> bool:
    """Whether the prompt (with ``whole_target``: the prompt and the target but its last
    token) has more characters than ``limit`` tokens can cover: too long for the model,
    known without tokenizing it (a 10 MB prompt took a minute and 5 GB to tokenize)."""
    if limit is None:
        return False
    if whole_target:
        return len(record["text"]) + len(record["target_text"]) > char_bound(limit + 1)
    return len(record["text"]) > char_bound(limit)


def _check_unique_ids(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Refuse prompt ids given twice: results are keyed by prompt id, so the repeated
    prompts' rows would collide once every row had run."""
    counts = Counter(r["id"] for r in records if isinstance(r.get("id"), str))
    repeated = [i for i, n in counts.items() if n > 1]
    if repeated:
        shown = ", ".join(map(repr, repeated[:5])) + (
            f" and {len(repeated) - 5} more" if len(repeated) > 5 else ""
        )
        raise DatasetError(
            f"{path} repeats the prompt id(s) {shown}; give each prompt its own id or "
            "regenerate the dataset",
            "dataset",
        )


_PROMPT_KEYS = ("id", "fact_id", "template", "direction", "text", "fields", "target_text")


def load_test_prompts(
    dataset_dir: str | os.PathLike[str],
    tokenizer: Any,
    templates: Sequence[str] | None = None,
    *,
    directions: Sequence[str] | None = ("forward",),
    add_special_tokens: bool = True,
    max_length: int | None = None,
    whole_target: bool = False,
) -> tuple[list[TestExample], DropReport]:
    """Tokenize the dataset's test prompts for ``tokenizer``.

    Args:
        dataset_dir: a folder written by :func:`generate_dataset`.
        tokenizer: a Hugging Face tokenizer.
        templates: test template names to keep (default: all).
        directions: ``("forward",)`` by default; ``("reverse",)`` for reversal tests, or
            ``None`` for both.
        add_special_tokens: passed to the tokenizer (BOS etc.).
        max_length: the model's context (:func:`graft.models.context_length`); longer
            prompts are dropped as ``too_long``. Default: the tokenizer's
            ``model_max_length`` when it states one.
        whole_target: the whole target is to be scored (teacher-forced, token by token):
            the prompt followed by all target tokens but the last must fit ``max_length``.

    Prompts whose fields cannot be located, whose target cannot be tokenized or that do
    not fit the model are dropped and counted by reason in the returned
    :class:`DropReport`, never silently.

    Prompts with more characters than ``max_length`` tokens can cover
    (:func:`char_bound`) are dropped as ``too_long`` without being tokenized.

    Raises:
        DatasetError: no such dataset folder (or no ``test_prompts.jsonl`` in it), a line
            that is not JSON, a prompt that lacks a key or has a span outside its text, a
            prompt id given twice.
        DamagedFileError: a file whose sha256 the manifest records was edited or damaged
            (:func:`graft.study.data.datasets.verify_dataset`).
    """
    path = check_dataset_folder(dataset_dir, ["test_prompts.jsonl"]) / "test_prompts.jsonl"
    limit = max_length if max_length is not None else _tokenizer_context(tokenizer)
    report = DropReport()
    examples = []
    dropped: Counter[str] = Counter()
    records = read_jsonl(path)
    _check_unique_ids(path, records)
    for index, record in enumerate(records, 1):
        fields = _prompt_fields(path, index, record)
        if templates is not None and record["template"] not in templates:
            continue
        if directions is not None and record["direction"] not in directions:
            continue
        report.total += 1
        example, reason = _example(
            tokenizer, record, fields, add_special_tokens, limit, whole_target
        )
        if example is None:
            assert reason is not None  # _example gives a reason with every None
            dropped[reason] += 1
            report.dropped_ids.append(record["id"])
        else:
            examples.append(example)
    report.kept = len(examples)
    report.dropped = dict(sorted(dropped.items()))
    return examples, report


def entity_prompts(
    dataset_dir: str | os.PathLike[str],
    template: str = "headline",
    n: int | None = None,
    directions: Sequence[str] = ("forward",),
) -> list[tuple[str, str, str]]:
    """``(text, target_text, first entity)`` of the first ``n`` (default all) stored test
    prompts of ``template`` and ``directions``, in file order; the entity is the text of the
    prompt's ``first_actor`` span (the FE unit).

    Raises:
        DatasetError: no such dataset folder, a damaged prompt (as :func:`load_test_prompts`),
            no prompt of that template and direction (the templates there are named), one
            without a ``first_actor`` span, ``n`` below 1.
    """
    if n is not None and n < 1:
        raise DatasetError(f"n={n}: give a number of prompts of 1 or more", "n")
    path = check_dataset_folder(dataset_dir, ["test_prompts.jsonl"]) / "test_prompts.jsonl"
    records = read_jsonl(path)
    _check_unique_ids(path, records)
    found: list[tuple[str, str, str]] = []
    for index, record in enumerate(records, 1):
        fields = _prompt_fields(path, index, record)
        if record["template"] != template or record["direction"] not in directions:
            continue
        if "first_actor" not in fields:
            raise DatasetError(
                f"{path}, prompt {record['id']!r}: no first_actor span, so no FE unit; "
                "regenerate the dataset",
                "dataset",
            )
        start, end = fields["first_actor"]
        found.append((record["text"], record["target_text"], record["text"][start:end]))
        if n is not None and len(found) == n:
            break
    if not found:
        templates = sorted({r["template"] for r in records})
        raise DatasetError(
            f"no {'/'.join(directions)} prompt of template {template!r} in {path}; "
            f"templates there: {', '.join(templates) or 'none'}",
            "template",
        )
    return found
