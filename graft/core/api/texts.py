"""The notebook entry point on text prompts: :func:`graft_texts` tokenizes each text, finds the
named spans of its fields in tokens, and runs every spec on every text through
:func:`graft.core.execution.engine.run_grafts`; :func:`score_targets` scores a whole target text
(e.g. a name) after each text, token by token."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from graft.core.api.continuation import score_continuations
from graft.core.execution.engine import as_list, is_loaded, run_grafts
from graft.core.families.wrapping import wrapped_by_graft
from graft.core.language.graft_object import Graft, as_spec
from graft.core.language.spec import GraftSpec
from graft.core.planning.plan import GraftRow
from graft.errors import SpecError

__all__ = ["graft_texts", "score_targets"]


#: One prompt: a text, or its token ids (a list of ints or a 1-D integer tensor).
Prompt = str | Sequence[int] | torch.Tensor

#: Prompts: one prompt, a list of them, or a 2-D tensor of token ids (one prompt per row).
Prompts = Prompt | Sequence[Prompt]


def is_token_ids(value: object) -> bool:
    """Whether ``value`` is one prompt's token ids: a non-empty list or tuple of ints, or a
    non-empty 1-D integer tensor."""
    if isinstance(value, torch.Tensor):
        return value.dim() == 1 and value.numel() > 0 and not value.is_floating_point()
    return (
        isinstance(value, list | tuple)
        and bool(value)
        and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    )


def is_one_prompt(value: object) -> bool:
    """Whether ``value`` is one prompt (a text or one prompt's token ids), not a list."""
    return isinstance(value, str) or is_token_ids(value)


def _prompt_list(texts: Prompts) -> list[str | list[int]]:
    """The prompts of ``texts``: each a text or a list of token ids."""
    if is_one_prompt(texts):
        items: list[Any] = [texts]
    elif isinstance(texts, torch.Tensor) and texts.dim() == 2:
        items = list(texts)
    else:
        items = as_list(texts) or []
    if not items or not all(is_one_prompt(t) for t in items):
        raise SpecError(
            "texts must be a prompt (a string, or token ids as a list of ints or a 1-D tensor), "
            "a non-empty list of prompts, or a 2-D tensor of token ids (one prompt per row)"
        )
    return [t if isinstance(t, str) else [int(i) for i in t] for t in items]


#: One graft: a spec text, a ``graft.Graft`` or a ``GraftSpec``.
OneSpec = GraftSpec | Graft | str


def _spec_list(specs: Sequence[OneSpec] | OneSpec) -> list[GraftSpec]:
    items: list[Any] = [specs] if is_one_spec(specs) else list(as_list(specs) or [])
    if not items or not all(is_one_spec(s) for s in items):
        raise SpecError(
            "specs must be a spec (a string, a graft.Graft or a GraftSpec) or a non-empty list "
            "of them"
        )
    return [as_spec(s) for s in items]


def is_one_spec(value: object) -> bool:
    """Whether ``value`` is one graft (a spec text, a graft.Graft or a GraftSpec)."""
    return isinstance(value, str | GraftSpec | Graft)


def _field_list(
    fields: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None, texts: Sequence[object]
) -> list[Mapping[str, Any]]:
    if fields is None:
        return [{} for _ in texts]
    if isinstance(fields, Mapping):
        if len(texts) != 1:
            raise SpecError(
                f"fields: one {{name: substring}} dict per text, i.e. a list of {len(texts)} "
                "dicts (a single dict only goes with a single text)"
            )
        return [fields]
    items = as_list(fields)
    if items is None or len(items) != len(texts) or not all(isinstance(f, Mapping) for f in items):
        raise SpecError(
            f"fields: one {{name: substring}} dict per text, i.e. a list of {len(texts)} dicts"
        )
    return items


def _char_spans(text: str, named: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    chars = {}
    for name, value in named.items():
        start = text.find(value) if isinstance(value, str) and value else -1
        if start < 0:
            raise SpecError(f"field {name!r}: {value!r} does not occur in the prompt {text!r}")
        chars[name] = (start, start + len(value))
    return chars


def _token_spans(ids: list[int], named: Mapping[str, Any]) -> dict[str, list[int]]:
    """The fields of a prompt given as token ids: name -> its token positions."""
    spans = {}
    for name, value in named.items():
        if isinstance(value, torch.Tensor):
            value = value.tolist()
        positions = [value] if isinstance(value, int) else as_list(value)
        if (
            isinstance(value, str)
            or not positions
            or not all(isinstance(p, int) for p in positions)
        ):
            raise SpecError(
                f"field {name!r} of a prompt given as token ids: give its token positions, e.g. "
                f"{{{name!r}: [1, 2]}}, or give the prompt as text"
            )
        outside = [p for p in positions if not -len(ids) <= p < len(ids)]
        if outside:
            raise SpecError(
                f"field {name!r}: position {outside[0]} is outside the prompt's {len(ids)} tokens"
            )
        spans[name] = sorted({p % len(ids) for p in positions})
    return spans


def graft_texts(
    base: Any,
    donors: Any,
    tokenizer: Any,
    texts: Prompts,
    specs: Sequence[GraftSpec | str] | GraftSpec | str,
    *,
    fields: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Notebook entry point: graft every spec on every text; final-position logits.

    Args:
        base: the pretrained HF causal LM, or a ``graft.models.LoadedModel``.
        donors: ``{name: model}`` or one donor model (named ``"sft"``); models may be
            ``LoadedModel`` objects.
        tokenizer: the models' tokenizer (a fast one gives exact character offsets);
            ``None`` takes the base's own (a ``LoadedModel``'s, or an nnsight
            ``LanguageModel``'s).
        texts: a prompt, or a list of prompts. A prompt is a text, or its token ids (a
            list of ints or a 1-D tensor, as the tokenizer gives them: BOS included); a 2-D
            tensor of ids is one prompt per row (no padding).
        specs: a graft spec, or a list of them (objects or text forms such as
            ``"FE+LT:all:all"``).
        fields: per text, span name -> substring of the text, e.g. ``{"FE": "Keanu Reeves"}``;
            its first occurrence becomes the span of that name. For a prompt given as token
            ids, span name -> its token positions, e.g. ``{"FE": [1, 2]}``. One dict per text;
            a single dict is accepted with a single text.
        **kwargs: passed to ``run_grafts`` (batch_size, padding_side, log_probs, executor, ...).

    Returns:
        logits ``[texts, specs, vocab]`` for lists; a single text (a ``str``, or one
        prompt's ids) drops the texts dimension and a single spec (a ``str`` or
        ``GraftSpec``) the specs dimension, so one text and one spec give ``[vocab]``.
    """
    tokenizer = _tokenizer(base, tokenizer)
    text_list, spec_list = _prompt_list(texts), _spec_list(specs)
    rows = _rows(tokenizer, text_list, spec_list, fields)
    kwargs.setdefault("pad_id", getattr(tokenizer, "pad_token_id", None))
    logits = run_grafts(base, donors, rows, **kwargs)
    assert isinstance(logits, torch.Tensor)  # no targets: logits, not metrics
    return _shaped(logits.view(len(text_list), len(spec_list), -1), texts, specs)


def _tokenizer(base: Any, tokenizer: Any) -> Any:
    """``tokenizer``, or when it is None the base's own: a ``LoadedModel``'s, or an nnsight
    ``LanguageModel``'s (not the placeholder of a wrapper graft made)."""
    if tokenizer is None:
        if is_loaded(base):
            tokenizer = base.tokenizer
        elif hasattr(base, "trace") and not wrapped_by_graft(base):
            tokenizer = getattr(base, "tokenizer", None)
        if tokenizer is None:
            raise SpecError(
                "pass the models' tokenizer (or as base a LoadedModel or an nnsight "
                "LanguageModel, which carry one)"
            )
    return tokenizer


def _rows(
    tokenizer: Any,
    text_list: Sequence[str | list[int]],
    spec_list: list[GraftSpec],
    fields: Sequence[Mapping[str, Any]] | Mapping[str, Any] | None,
) -> list[GraftRow]:
    """Every spec on every text, texts outer: the texts tokenized (token ids taken as they
    are), their fields located."""
    from graft.core.language.spans import tokenize_with_spans

    rows = []
    for text, named in zip(text_list, _field_list(fields, text_list), strict=True):
        if not isinstance(text, str):
            ids, spans = text, _token_spans(text, named)
        else:
            prompt = tokenize_with_spans(tokenizer, text, _char_spans(text, named))
            if prompt.missing:
                raise SpecError(f"fields {prompt.missing} of {text!r} map to no token")
            ids, spans = prompt.input_ids, prompt.spans
        rows += [GraftRow(ids, spans, spec) for spec in spec_list]
    return rows


def _shaped(
    values: torch.Tensor,
    texts: Prompts,
    specs: Sequence[GraftSpec | str] | GraftSpec | str,
) -> torch.Tensor:
    """``values`` [texts, specs, ...] without the dimension of a single text or spec."""
    if is_one_spec(specs):
        values = values[:, 0]
    return values[0] if is_one_prompt(texts) else values


def _continuation_ids(tokenizer: Any, text: str, target: str) -> list[int]:
    """The target's token ids as tokenized in context after ``text``."""
    plain = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(text + target, add_special_tokens=False)["input_ids"])
    if full[: len(plain)] != plain:
        raise SpecError(
            f"the target {target!r} merges with the end of {text!r} into other tokens; "
            "start it with a space or end the text differently"
        )
    if len(full) == len(plain):
        raise SpecError(f"the target {target!r} adds no token after {text!r}; give a longer one")
    return full[len(plain) :]


def score_targets(
    base: Any,
    donors: Any,
    tokenizer: Any,
    texts: Sequence[str] | str,
    specs: Sequence[GraftSpec | str] | GraftSpec | str,
    targets: Sequence[str] | str,
    *,
    fields: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
    **kwargs: Any,
) -> dict[str, torch.Tensor]:
    """Score a whole target (e.g. a name) after every text under every spec.

    Each target is read teacher-forced, token by token
    (:func:`graft.core.api.continuation.score_continuations`); the last-token graft follows the
    prediction position along it, everything else stays where it is on the text.

    Args:
        base, donors, tokenizer, texts, specs, fields: as for :func:`graft_texts`.
        targets: the continuation to score after each text, e.g. ``" Laurence Fishburne"``
            (mind the leading space): one per text, or one string for every text.
        **kwargs: passed to ``run_grafts`` (batch_size, executor, ...).

    Returns:
        ``logprob`` (the sum over the target's tokens), ``tokens`` and ``exact`` (greedy
        decoding gives the whole target) shaped ``[texts, specs]``, and ``step_logprobs``,
        ``step_ranks`` shaped ``[texts, specs, longest target]`` (NaN and -1 past a
        target's end); a single text or spec drops its dimension, as in :func:`graft_texts`.
    """
    tokenizer = _tokenizer(base, tokenizer)
    prompts, spec_list = _prompt_list(texts), _spec_list(specs)
    text_list = [t for t in prompts if isinstance(t, str)]
    if len(text_list) != len(prompts):
        raise SpecError(
            "score_targets tokenizes each target in context after its text: give texts as "
            "strings, not token ids"
        )
    target_list = [targets] * len(text_list) if isinstance(targets, str) else as_list(targets)
    if not target_list or len(target_list) != len(text_list):
        raise SpecError(f"targets: one target string per text ({len(text_list)}), or one for all")
    if not all(isinstance(t, str) for t in target_list):
        raise SpecError("targets must be strings, e.g. ' Laurence Fishburne'")
    ids = [_continuation_ids(tokenizer, x, t) for x, t in zip(text_list, target_list, strict=True)]
    rows = _rows(tokenizer, text_list, spec_list, fields)
    kwargs.setdefault("pad_id", getattr(tokenizer, "pad_token_id", None))
    per_row = [c for c in ids for _ in spec_list]
    scores = score_continuations(base, donors, rows, per_row, **kwargs)
    shape = (len(text_list), len(spec_list))
    return {k: _shaped(v.view(*shape, *v.shape[1:]), texts, specs) for k, v in scores.items()}
