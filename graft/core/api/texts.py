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
from graft.core.language.graft_object import Graft, as_spec
from graft.core.language.spec import GraftSpec
from graft.core.planning.plan import GraftRow
from graft.errors import SpecError

__all__ = ["graft_texts", "score_targets"]


def _text_list(texts: Sequence[str] | str) -> list[str]:
    items = [texts] if isinstance(texts, str) else as_list(texts)
    if not items or not all(isinstance(t, str) for t in items):
        raise SpecError("texts must be a prompt string or a non-empty list of prompt strings")
    return items


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
    fields: Sequence[Mapping[str, str]] | Mapping[str, str] | None, texts: list[str]
) -> list[Mapping[str, str]]:
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


def graft_texts(
    base: Any,
    donors: Any,
    tokenizer: Any,
    texts: Sequence[str] | str,
    specs: Sequence[GraftSpec | str] | GraftSpec | str,
    *,
    fields: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """Notebook entry point: graft every spec on every text; final-position logits.

    Args:
        base: the pretrained HF causal LM, or a ``graft.models.LoadedModel``.
        donors: ``{name: model}`` or one donor model (named ``"sft"``); models may be
            ``LoadedModel`` objects.
        tokenizer: the models' tokenizer (a fast one gives exact character offsets);
            ``None`` takes the tokenizer of a ``LoadedModel`` base.
        texts: a prompt, or a list of prompts.
        specs: a graft spec, or a list of them (objects or text forms such as
            ``"FE+LT:all:all"``).
        fields: per text, span name -> substring of the text, e.g. ``{"FE": "Keanu Reeves"}``;
            its first occurrence becomes the span of that name. One dict per text; a single
            dict is accepted with a single text.
        **kwargs: passed to ``run_grafts`` (batch_size, padding_side, log_probs, executor, ...).

    Returns:
        logits ``[texts, specs, vocab]`` for lists; a single text (a ``str``) drops the texts
        dimension and a single spec (a ``str`` or ``GraftSpec``) the specs dimension, so one
        text and one spec give ``[vocab]``.
    """
    tokenizer = _tokenizer(base, tokenizer)
    text_list, spec_list = _text_list(texts), _spec_list(specs)
    rows = _rows(tokenizer, text_list, spec_list, fields)
    kwargs.setdefault("pad_id", getattr(tokenizer, "pad_token_id", None))
    logits = run_grafts(base, donors, rows, **kwargs)
    assert isinstance(logits, torch.Tensor)  # no targets: logits, not metrics
    return _shaped(logits.view(len(text_list), len(spec_list), -1), texts, specs)


def _tokenizer(base: Any, tokenizer: Any) -> Any:
    """``tokenizer``, or a ``LoadedModel`` base's own when it is None."""
    if tokenizer is None:
        if not is_loaded(base):
            raise SpecError("pass the models' tokenizer (or a LoadedModel as base)")
        tokenizer = base.tokenizer
    return tokenizer


def _rows(
    tokenizer: Any,
    text_list: list[str],
    spec_list: list[GraftSpec],
    fields: Sequence[Mapping[str, str]] | Mapping[str, str] | None,
) -> list[GraftRow]:
    """Every spec on every text, texts outer: the texts tokenized, their fields located."""
    from graft.core.language.spans import tokenize_with_spans

    rows = []
    for text, named in zip(text_list, _field_list(fields, text_list), strict=True):
        prompt = tokenize_with_spans(tokenizer, text, _char_spans(text, named))
        if prompt.missing:
            raise SpecError(f"fields {prompt.missing} of {text!r} map to no token")
        rows += [GraftRow(prompt.input_ids, prompt.spans, spec) for spec in spec_list]
    return rows


def _shaped(
    values: torch.Tensor,
    texts: Sequence[str] | str,
    specs: Sequence[GraftSpec | str] | GraftSpec | str,
) -> torch.Tensor:
    """``values`` [texts, specs, ...] without the dimension of a single text or spec."""
    if is_one_spec(specs):
        values = values[:, 0]
    return values[0] if isinstance(texts, str) else values


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
    text_list, spec_list = _text_list(texts), _spec_list(specs)
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
