"""A model's size from its transformers config alone: what its memory depends on.

Nothing here loads weights: parameters are counted on a weightless copy of the model on the
meta device (:func:`graft.models.paper.meta_model`), and the activations a finetune keeps
for its backward pass are found by running one forward pass on meta tensors and adding up
the tensors autograd saves (``torch.autograd.graph.saved_tensors_hooks``), so every family
transformers builds is sized the same way, dropout masks and attention included. Each size
is computed once per config (a dry run asks several times).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from graft.errors import GraftError
from graft.models.paper import meta_model

if TYPE_CHECKING:
    from transformers import PretrainedConfig

#: Bytes a value of each precision takes (``mixed``: float32 master weights).
DTYPE_BYTES = {"float32": 4, "mixed": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def precision_name(dtype: str | torch.dtype) -> str:
    """``dtype`` (a torch dtype, ``"bf16"``, ``"mixed"``, ...) as one of
    :data:`~graft.study.planning.memory.PRECISIONS` or ``"float64"``."""
    if isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
    else:
        name = str(dtype).lower().removeprefix("torch.")
        name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}.get(
            name, name
        )
    if name not in DTYPE_BYTES:
        raise GraftError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    return name


@dataclass(frozen=True)
class ModelSize:
    """What of a model's shape its memory depends on.

    Args:
        n_params: parameters, each counted once (a tied head is the embedding).
        matmul_params: parameters of the matrix-product modules (``Linear``, GPT-2's
            ``Conv1D``, the head): what autocast copies to 16 bits.
        head_params: parameters of the output head's weight.
        tied: whether the head is the input embedding (its gradient is summed from two).
        buffer_bytes: bytes of the model's buffers (rotary tables, masks) as built.
        n_layers: decoder layers.
        hidden: width of the residual stream.
        intermediate: width of the feed-forward layer.
        gated: whether the feed-forward layer is gated (gate and up projections).
        heads: attention heads.
        kv_width: width of the keys (and of the values) of one position, all heads.
        vocab: vocabulary size.
    """

    n_params: int
    matmul_params: int
    head_params: int
    tied: bool
    buffer_bytes: int
    n_layers: int
    hidden: int
    intermediate: int
    gated: bool
    heads: int
    kv_width: int
    vocab: int


def _config_key(config: PretrainedConfig) -> str:
    return config.to_json_string(use_diff=False)


#: Sizes and traces already computed, by config and arguments (a dry run asks several times).
_CACHE: dict[tuple, Any] = {}


def _cached(key: tuple, compute: Callable[[], Any]) -> Any:
    if key not in _CACHE:
        _CACHE[key] = compute()
    return _CACHE[key]


def model_size(config: PretrainedConfig) -> ModelSize:
    """The :class:`ModelSize` of ``config``, counted on a weightless meta model."""
    return _cached(("size", _config_key(config)), lambda: _model_size(config))


def _model_size(config: PretrainedConfig) -> ModelSize:
    model: Any = meta_model(copy.deepcopy(config))  # building sets fields of the config
    unique = {id(p): p for p in model.parameters()}
    matmul: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D":
            matmul.update((id(p), p) for p in module.parameters(recurse=False))
    head: Any = model.get_output_embeddings()
    inputs: Any = model.get_input_embeddings()
    head_params = 0
    tied = head is not None and head.weight is inputs.weight
    if head is not None:
        head_params = head.weight.numel()
        matmul.setdefault(id(head.weight), head.weight)
    text = config.get_text_config()
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    intermediate = getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None)
    return ModelSize(
        n_params=sum(p.numel() for p in unique.values()),
        matmul_params=sum(p.numel() for p in matmul.values()),
        head_params=head_params,
        tied=tied,
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        n_layers=int(text.num_hidden_layers),
        hidden=hidden,
        intermediate=int(intermediate or 4 * hidden),
        gated=any("gate" in name for name, _ in model.named_modules()),
        heads=heads,
        kv_width=kv_heads * head_dim,
        vocab=int(text.vocab_size),
    )


def saved_activation_bytes(
    config: PretrainedConfig,
    *,
    dtype: str | torch.dtype,
    batch_size: int,
    seq_len: int,
    gradient_checkpointing: bool = False,
) -> int:
    """Bytes of the tensors autograd keeps from one training forward pass (loss included) of
    ``batch_size`` x ``seq_len`` tokens, weights excluded: traced on meta tensors."""
    name = precision_name(dtype)
    key = ("saved", _config_key(config), name, batch_size, seq_len, gradient_checkpointing)
    return _cached(
        key, lambda: _saved_bytes(config, name, batch_size, seq_len, gradient_checkpointing)
    )


def _saved_bytes(
    config: PretrainedConfig, dtype: str, batch: int, seq: int, checkpointing: bool
) -> int:
    import transformers

    with _quiet_transformers(), torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            copy.deepcopy(config), dtype=getattr(torch, dtype)
        )
        model.train()
        if checkpointing:
            enable = getattr(model, "activation_checkpointing_enable", None)
            (enable or model.gradient_checkpointing_enable)()
        weights = {p.untyped_storage()._cdata for p in model.parameters()}
        saved: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            if storage._cdata not in weights:
                saved[storage._cdata] = storage.nbytes()
            return tensor

        ids = torch.zeros(batch, seq, dtype=torch.long)
        # a finished 4-D mask, as a padded batch has: the mask code reads no values then,
        # which meta tensors do not have
        mask = torch.ones(batch, 1, seq, seq, dtype=torch.bool)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False)
    return sum(saved.values())


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' warnings about the meta model (loss type, cache) are no news here."""
    import transformers

    hf_logging = transformers.utils.logging
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
