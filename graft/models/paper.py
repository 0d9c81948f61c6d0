"""The paper's four models as hand-written configs (no download), scaled-down copies of
them, and weightless meta copies.

The configs follow the published ones (gpt2-xl, pythia-2.8b, Llama-3.2-1B, gemma-1.1-2b-it):
used to size what a remote run would send (:func:`graft.remote.payload.payload_table`), as a
weightless client-side base for a server that holds the weights, and, scaled down
(:func:`scaled_down`: same family code paths, a few layers of small width), in tests; and to
tell a model folder named after a paper model that holds another model
(:func:`paper_mismatch`, said when it loads).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from graft.models.registry import HUB_MODELS

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


#: The size fields :func:`paper_mismatch` compares (every config answers to these names).
_SHAPE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")


def paper_name(name: str) -> str | None:
    """The paper model ``name`` is named after (its short name, its hub id, or a folder whose
    name is either, e.g. ``$GRAFT_MODELS/gpt2-xl`` or ``.../Llama-3.2-1B``), or None."""
    names = {short: short for short in PAPER_CONFIGS}
    for short in PAPER_CONFIGS:
        hub_id = HUB_MODELS[short]
        names |= {hub_id.lower(): short, hub_id.rsplit("/", 1)[-1].lower(): short}
    return names.get(name.lower()) or names.get(Path(name).name.lower())


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _shape(config: Any, n_params: int | None) -> str:
    layers, width, heads, vocab = (getattr(config, f, None) for f in _SHAPE_FIELDS)
    size = f"{_count(n_params)} parameters, " if n_params is not None else ""
    return (
        f"{size}{config.model_type}, {layers} layers, width {width}, {heads} heads, "
        f"vocabulary {vocab}"
    )


def paper_mismatch(name: str, folder: str, config: Any, n_params: int | None = None) -> str | None:
    """One line when the model folder ``folder``, loaded as ``name``, is named after a paper
    model (:func:`paper_name`) but its ``config`` is not that model's (another architecture,
    depth, width, number of heads or vocabulary), with both models' numbers; None when it
    matches or is named after none. ``n_params``: the folder model's parameter count."""
    short = paper_name(name)
    if short is None:
        return None
    paper = PAPER_CONFIGS[short]()
    same = config.model_type == paper.model_type and all(
        getattr(config, f, None) == getattr(paper, f) for f in _SHAPE_FIELDS
    )
    if same:
        return None
    paper_params = sum(p.numel() for p in meta_model(paper).parameters())
    return (
        f"the model folder {folder} is named after the paper's {short} but holds another "
        f"model: {_shape(config, n_params)}; {short} has {_shape(paper, paper_params)}. Its "
        f"results are labelled {short}: put {short}'s own weights there, or give the folder "
        "a name of its own"
    )
