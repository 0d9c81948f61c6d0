"""The paper's four models as hand-written configs (no download), scaled-down copies of
them, and weightless meta copies.

The configs follow the published ones (gpt2-xl, pythia-2.8b, Llama-3.2-1B, gemma-1.1-2b-it):
used to size what a remote run would send (:func:`graft.remote.payload.payload_table`), as a
weightless client-side base for a server that holds the weights, and, scaled down
(:func:`scaled_down`: same family code paths, a few layers of small width), in tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import GemmaConfig, GPT2Config, GPTNeoXConfig, LlamaConfig, PretrainedConfig


def gpt2_xl_config() -> GPT2Config:
    """Hand-written config of gpt2-xl (no download): d=1600, 48 layers, 25 heads, tied."""
    import transformers

    return transformers.GPT2Config(
        n_embd=1600, n_layer=48, n_head=25, vocab_size=50257, n_positions=1024
    )


def llama32_1b_config() -> LlamaConfig:
    """Hand-written config of Llama-3.2-1B (no download): d=2048, 16 layers, tied embeddings."""
    import transformers

    return transformers.LlamaConfig(
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=8192,
        vocab_size=128256,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )


def pythia_28b_config() -> GPTNeoXConfig:
    """Hand-written config of pythia-2.8b (no download): d=2560, 32 layers, parallel
    attention and MLP, rotary on a quarter of each head, untied."""
    import transformers

    return transformers.GPTNeoXConfig(
        hidden_size=2560,
        num_hidden_layers=32,
        num_attention_heads=32,
        intermediate_size=10240,
        vocab_size=50304,
        max_position_embeddings=2048,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
        use_parallel_residual=True,
        tie_word_embeddings=False,
    )


def gemma_11_2b_config() -> GemmaConfig:
    """Hand-written config of gemma-1.1-2b-it (no download): d=2048, 18 layers, one key/value
    head, GeGLU, embeddings scaled by sqrt(d) and tied to the head."""
    import transformers

    return transformers.GemmaConfig(
        hidden_size=2048,
        num_hidden_layers=18,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=256,
        intermediate_size=16384,
        vocab_size=256000,
        hidden_act="gelu_pytorch_tanh",
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )


PAPER_CONFIGS: dict[str, Callable[[], PretrainedConfig]] = {
    "gpt2-xl": gpt2_xl_config,
    "pythia-2.8b": pythia_28b_config,
    "llama3.2-1b": llama32_1b_config,
    "gemma-1.1-2b": gemma_11_2b_config,
}

#: Size fields of a config: width, depth, heads, feed-forward width, vocabulary (GPT-2 names
#: them its own way; GPT-NeoX, Llama and Gemma share these).
_SIZE_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)
_GPT2_SIZE_FIELDS = ("n_embd", "n_layer", "n_head", "n_inner", "vocab_size")


def scaled_down(
    name: str, *, width: int = 64, layers: int = 4, heads: int = 4, vocab: int = 96
) -> PretrainedConfig:
    """The paper model ``name``'s config at a small size: ``width``, ``layers``, ``heads``
    (key/value heads scaled in proportion, at least one), feed-forward width ``4 * width``
    and a ``vocab``-token vocabulary; everything else (attention layout, rotary fraction,
    parallel residual, activation, tied head) as published."""
    config = PAPER_CONFIGS[name]()
    d, n, h, ff, v = _GPT2_SIZE_FIELDS if config.model_type == "gpt2" else _SIZE_FIELDS
    full_heads = getattr(config, h)
    kv = getattr(config, "num_key_value_heads", None)
    for field, value in ((d, width), (n, layers), (h, heads), (ff, 4 * width), (v, vocab)):
        setattr(config, field, value)
    if kv is not None:
        config.num_key_value_heads = max(1, heads * kv // full_heads)
    if getattr(config, "head_dim", None) is not None:
        config.head_dim = width // heads
    return config


def meta_model(config: PretrainedConfig) -> nn.Module:
    """A weightless causal LM of ``config`` on the meta device (shapes only, no download)."""
    import transformers

    with torch.device("meta"):
        model: nn.Module = transformers.AutoModelForCausalLM.from_config(config)
        return model.eval()
