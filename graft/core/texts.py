"""The notebook entry point on text prompts: :func:`graft_texts` tokenizes each text, finds the
named spans of its fields in tokens, and runs every spec on every text through
:func:`graft.core.engine.run_grafts`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from graft.core.engine import as_list, is_loaded, run_grafts
from graft.core.plan import GraftRow
from graft.core.spec import GraftSpec
from graft.errors import SpecError

__all__ = ["graft_texts"]


def _text_list(texts: Sequence[str] | str) -> list[str]:
    texts = [texts] if isinstance(texts, str) else as_list(texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise SpecError("texts must be a prompt string or a non-empty list of prompt strings")
    return texts


def _spec_list(specs: Sequence[GraftSpec | str] | GraftSpec | str) -> list[GraftSpec]:
    specs = [specs] if isinstance(specs, str | GraftSpec) else as_list(specs)
    if not specs or not all(isinstance(s, str | GraftSpec) for s in specs):
        raise SpecError("specs must be a spec (string or GraftSpec) or a non-empty list of them")
    return [GraftSpec.parse(s) if isinstance(s, str) else s for s in specs]


def _field_list(fields, texts: list[str]) -> list[Mapping[str, str]]:
    if fields is None:
        return [{} for _ in texts]
    if isinstance(fields, Mapping):
        if len(texts) != 1:
            raise SpecError(
                f"fields: one {{name: substring}} dict per text, i.e. a list of {len(texts)} "
                "dicts (a single dict only goes with a single text)"
            )
        return [fields]
    fields = as_list(fields)
    if (
        fields is None
        or len(fields) != len(texts)
        or not all(isinstance(f, Mapping) for f in fields)
    ):
        raise SpecError(
            f"fields: one {{name: substring}} dict per text, i.e. a list of {len(texts)} dicts"
        )
    return fields


def _char_spans(text: str, named: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    chars = {}
    for name, value in named.items():
        start = text.find(value) if isinstance(value, str) and value else -1
        if start < 0:
            raise SpecError(f"field {name!r}: {value!r} does not occur in the prompt {text!r}")
        chars[name] = (start, start + len(value))
    return chars


def graft_texts(
    base,
    donors,
    tokenizer,
    texts: Sequence[str] | str,
    specs: Sequence[GraftSpec | str] | GraftSpec | str,
    *,
    fields: Sequence[Mapping[str, str]] | Mapping[str, str] | None = None,
    **kwargs,
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
    from graft.core.spans import tokenize_with_spans

    if tokenizer is None:
        if not is_loaded(base):
            raise SpecError("pass the models' tokenizer (or a LoadedModel as base)")
        tokenizer = base.tokenizer
    text_list, spec_list = _text_list(texts), _spec_list(specs)
    rows = []
    for text, named in zip(text_list, _field_list(fields, text_list), strict=True):
        prompt = tokenize_with_spans(tokenizer, text, _char_spans(text, named))
        if prompt.missing:
            raise SpecError(f"fields {prompt.missing} of {text!r} map to no token")
        rows += [GraftRow(prompt.input_ids, prompt.spans, spec) for spec in spec_list]
    kwargs.setdefault("pad_id", getattr(tokenizer, "pad_token_id", None))
    logits = run_grafts(base, donors, rows, **kwargs)
    logits = logits.view(len(text_list), len(spec_list), -1)
    if isinstance(specs, str | GraftSpec):
        logits = logits[:, 0]
    return logits[0] if isinstance(texts, str) else logits
