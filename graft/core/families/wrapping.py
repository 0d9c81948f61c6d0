"""Which nnsight wrapper graft traces a model with (:func:`wrap`), and the module inside one
(:func:`unwrap`)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

_WRAPPED: weakref.WeakKeyDictionary[nn.Module, Any] = weakref.WeakKeyDictionary()


def wrap(model: nn.Module) -> Any:
    """The nnsight wrapper of ``model`` (cached per model object; no copy of the weights).

    A Hugging Face causal LM is wrapped in nnsight's ``TransformersModel``, the class an
    NDIF server serves it as: a trace records the wrapper's forward method by name and a
    server running the trace in a sandbox calls that method on its own wrapper, so both
    sides must be the same kind. Other modules get a plain ``NNsight`` wrapper.
    """
    if hasattr(model, "trace") and hasattr(model, "get"):
        return model
    wrapped = _WRAPPED.get(model)
    if wrapped is None:
        can_generate = getattr(model, "can_generate", None)
        if callable(can_generate) and can_generate():
            from nnsight.modeling.transformers import TransformersModel

            # graft feeds token ids, so the tokenizer is never used; the wrapper insists on one.
            # A weightless (meta) copy, a remote client's base, stays where it is: the wrapper's
            # pipeline would otherwise move it to the CPU, which a meta tensor cannot do.
            weight = next(model.parameters(), None)
            where = {"device": "meta"} if weight is not None and weight.is_meta else {}
            wrapped = TransformersModel(
                model, task="text-generation", tokenizer=_placeholder_tokenizer(), **where
            )
        else:
            from nnsight import NNsight

            wrapped = NNsight(model)
        _WRAPPED[model] = wrapped
    return wrapped


def wrapped_by_graft(model: Any) -> bool:
    """Whether ``model`` is a wrapper :func:`wrap` made (whose tokenizer is a placeholder)."""
    inner = unwrap(model)
    return inner is not model and _WRAPPED.get(inner) is model


def _placeholder_tokenizer() -> PreTrainedTokenizerFast:
    """A one-token tokenizer (never called: graft passes token ids)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({"<pad>": 0}, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<pad>")


def unwrap(model: Any) -> nn.Module:
    """The torch module inside an nnsight wrapper (``model`` itself if it is not wrapped)."""
    inner = getattr(model, "__dict__", {}).get("_module")  # an envoy's module, no __getattr__
    return inner if isinstance(inner, nn.Module) and not isinstance(model, nn.Module) else model
