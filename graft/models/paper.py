"""The paper's models as hand-written configs (no download), and weightless meta copies.

Used to size what a remote run would send (:func:`graft.remote.payload.payload_table`) and
as a weightless client-side base for a server that holds the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import GPT2Config, LlamaConfig, PretrainedConfig


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


PAPER_CONFIGS: dict[str, Callable[[], PretrainedConfig]] = {
    "gpt2-xl": gpt2_xl_config,
    "llama3.2-1b": llama32_1b_config,
}


def meta_model(config: PretrainedConfig) -> nn.Module:
    """A weightless causal LM of ``config`` on the meta device (shapes only, no download)."""
    import transformers

    with torch.device("meta"):
        model: nn.Module = transformers.AutoModelForCausalLM.from_config(config)
        return model.eval()
