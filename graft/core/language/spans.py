"""Locate template fields (character spans) in token positions.

Prompts are stored as text plus the character span of every filled field; each tokenizer
maps them to token positions on demand. Two methods:

- offsets: fast tokenizers' ``return_offsets_mapping``. A token belongs to a field when its
  characters, with surrounding whitespace trimmed, overlap the field's characters. Trimming
  makes leading-space tokens ("ĠKeanu", "▁Keanu", whose offsets may or may not include the
  space) behave the same, and zero-width tokens (BOS/EOS, offsets (0, 0)) never match.
- prefix: for tokenizers without offsets, tokenize the text up to each field boundary and
  compare with the full tokenization (longest common prefix).

Fields the rest of the project reads under short aliases (see :data:`ALIASES`):
``first_actor`` -> ``FE``, ``movie_title`` -> ``M``, ``relation`` + ``relation_preposition``
-> ``R``. ``LT`` (the last token) is the engine's business, not this module's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from graft.errors import SpanError

ALIASES: dict[str, tuple[str, ...]] = {
    "FE": ("first_actor",),
    "M": ("movie_title",),
    "R": ("relation", "relation_preposition"),
}


_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass
class TokenizedPrompt:
    """A prompt tokenized by one tokenizer, with the token positions of its fields.

    Args:
        text: the prompt text that was tokenized.
        input_ids: token ids of ``text``, special tokens (e.g. BOS) included when the
            tokenizer adds them.
        spans: field name or alias (``FE``, ``M``, ``R``) -> sorted 0-based positions in
            ``input_ids`` of the tokens that overlap the field's characters. Fields that
            could not be located are absent here and listed in ``missing``.
        missing: field names and aliases whose characters map to no token.
    """

    text: str
    input_ids: list[int]
    spans: dict[str, list[int]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def render(template: str, fields: Mapping[str, Any]) -> tuple[str, dict[str, tuple[int, int]]]:
    """Fill ``{name}`` placeholders of ``template``; ``{{``/``}}`` are literal braces.

    Returns the text and, per filled field, its character span ``[start, end)``. A field
    used more than once gets the span of its first occurrence.

    Raises:
        SpanError: a placeholder has no value in ``fields``.
    """
    parts: list[str] = []
    spans: dict[str, tuple[int, int]] = {}
    length = 0
    pos = 0
    for m in _PLACEHOLDER.finditer(template):
        literal = template[pos : m.start()]
        parts.append(literal)
        length += len(literal)
        if m.group(1) is None:
            piece = m.group(0)[0]
        else:
            name = m.group(1)
            if name not in fields:
                raise SpanError(f"template field {{{name}}} has no value; give it in fields")
            piece = str(fields[name])
            spans.setdefault(name, (length, length + len(piece)))
        parts.append(piece)
        length += len(piece)
        pos = m.end()
    parts.append(template[pos:])
    return "".join(parts), spans


def template_fields(template: str) -> list[str]:
    """The placeholder names of ``template`` in order of first appearance."""
    names: list[str] = []
    for m in _PLACEHOLDER.finditer(template):
        if m.group(1) is not None and m.group(1) not in names:
            names.append(m.group(1))
    return names


def tokenize_with_spans(
    tokenizer: Any,
    text: str,
    field_chars: Mapping[str, tuple[int, int]],
    *,
    add_special_tokens: bool = True,
) -> TokenizedPrompt:
    """Tokenize ``text`` and map each field's character span to token positions.

    Args:
        tokenizer: a Hugging Face tokenizer (or anything callable like one returning
            ``input_ids``). Offsets are used when it supports ``return_offsets_mapping``;
            otherwise incremental prefix tokenization.
        text: the prompt.
        field_chars: field name -> character span ``[start, end)`` in ``text``.
        add_special_tokens: passed to the tokenizer (BOS etc.).

    Aliases of :data:`ALIASES` are added for every alias whose fields are all in
    ``field_chars``; an alias is missing when any of its fields is.

    Raises:
        SpanError: a span that is not ``0 <= start <= end <= len(text)``.
    """
    for name, (start, end) in field_chars.items():
        if not 0 <= start <= end <= len(text):
            raise SpanError(
                f"field {name!r} span ({start}, {end}) is outside the text ({len(text)} characters)"
            )
    offsets = _offsets(tokenizer, text, add_special_tokens)
    if offsets is not None:
        input_ids, offset_list = offsets
        spans = {
            name: _positions_from_offsets(text, offset_list, start, end)
            for name, (start, end) in field_chars.items()
        }
    else:
        input_ids = _encode(tokenizer, text, add_special_tokens)
        spans = _spans_by_prefix(tokenizer, text, input_ids, field_chars)

    for alias, parts in ALIASES.items():
        if alias in field_chars or not all(p in field_chars for p in parts):
            continue
        if all(spans[p] for p in parts):
            spans[alias] = sorted({i for p in parts for i in spans[p]})
        else:
            spans[alias] = []
    missing = [name for name, positions in spans.items() if not positions]
    return TokenizedPrompt(
        text=text,
        input_ids=list(input_ids),
        spans={name: positions for name, positions in spans.items() if positions},
        missing=missing,
    )


def _encode(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def _offsets(
    tokenizer: Any, text: str, add_special_tokens: bool
) -> tuple[list[int], list[tuple[int, int]]] | None:
    if getattr(tokenizer, "is_fast", True) is False:
        return None
    try:
        enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    except (NotImplementedError, TypeError, ValueError):
        return None
    offsets = enc.get("offset_mapping") if hasattr(enc, "get") else None
    if offsets is None:
        return None
    return list(enc["input_ids"]), [(int(s), int(e)) for s, e in offsets]


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _positions_from_offsets(
    text: str, offsets: Sequence[tuple[int, int]], start: int, end: int
) -> list[int]:
    a, b = _trim(text, start, end)
    if a >= b:
        return []
    positions = []
    for i, (s0, e0) in enumerate(offsets):
        if e0 <= s0:
            continue
        s, e = _trim(text, s0, e0)
        if s < e:
            if s < b and e > a:
                positions.append(i)
        elif a <= s0 and e0 <= b:
            # A whitespace-only token counts only when it lies inside the field.
            positions.append(i)
    return positions


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _find_sub(haystack: Sequence[int], needle: Sequence[int]) -> int:
    n = len(needle)
    for j in range(len(haystack) - n + 1):
        if list(haystack[j : j + n]) == list(needle):
            return j
    return 0


def _is_blank(tokenizer: Any, token_id: int) -> bool:
    decode = getattr(tokenizer, "decode", None)
    if decode is None:
        return False
    try:
        piece: str = decode([token_id])
        return piece.strip() == ""
    except Exception:  # a decoder that rejects lone byte tokens: treat as content
        return False


def _spans_by_prefix(
    tokenizer: Any,
    text: str,
    input_ids: Sequence[int],
    field_chars: Mapping[str, tuple[int, int]],
) -> dict[str, list[int]]:
    # Work on the plain (no special tokens) ids and shift by where they sit in input_ids,
    # so that a BOS in front or an EOS behind does not disturb the prefix comparison.
    plain = _encode(tokenizer, text, False)
    shift = _find_sub(input_ids, plain)
    spans: dict[str, list[int]] = {}
    for name, (start, end) in field_chars.items():
        a, b = _trim(text, start, end)
        if a >= b:
            spans[name] = []
            continue
        first = _lcp(_encode(tokenizer, text[:a].rstrip(), False), plain)
        head = _encode(tokenizer, text[:b], False)
        last = _lcp(head, plain)
        if len(head) > last:
            last += 1  # the token at `last` straddles the field's end
        last = min(last, len(plain))
        while first < last and _is_blank(tokenizer, plain[first]):
            first += 1
        spans[name] = [shift + i for i in range(first, last)]
    return spans
