"""Tiny random models of every supported family, built from configs (no downloads).

Used by the tests and by the ``tiny-<family>`` model names. Norm weights and biases are
randomised (HF initialises them to constants, which would hide norm-grafting bugs), and a
donor is the base plus a seeded perturbation of every parameter, like a finetune.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import transformers
from torch import nn

from graft.errors import UnsupportedModelError
from graft.models.registry import TINY_FAMILIES

_COMMON: dict[str, Any] = dict(vocab_size=96, max_position_embeddings=64)
_SPECIAL: dict[str, Any] = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)

ModuleT = TypeVar("ModuleT", bound=nn.Module)


def tiny_config(
    family: str, *, tied: bool | None = None, n_layers: int = 4
) -> transformers.PretrainedConfig:
    """Config of a tiny model of ``family`` (d=32, 4 heads, ``n_layers`` layers)."""
    cfg: transformers.PretrainedConfig
    if family == "gpt2":
        cfg = transformers.GPT2Config(
            n_embd=32, n_layer=n_layers, n_head=4, n_positions=64, vocab_size=96, **_SPECIAL
        )
    elif family == "gpt_neox":
        cfg = transformers.GPTNeoXConfig(
            hidden_size=32,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            intermediate_size=64,
            rotary_pct=0.5,  # type: ignore[call-arg]  # not in the signature; still read by transformers 5
            use_parallel_residual=True,
            tie_word_embeddings=False,
            **_COMMON,
            **_SPECIAL,
        )
    elif family in ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3"):
        kwargs: dict[str, Any] = dict(
            hidden_size=32,
            num_hidden_layers=n_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            head_dim=8,
            **_COMMON,
            **_SPECIAL,
        )
        cls = {
            "llama": transformers.LlamaConfig,
            "qwen2": transformers.Qwen2Config,
            "qwen3": transformers.Qwen3Config,
            "gemma": transformers.GemmaConfig,
            "gemma2": transformers.Gemma2Config,
            "gemma3": transformers.Gemma3TextConfig,
        }[family]
        if family in ("gemma2", "gemma3"):
            kwargs.update(sliding_window=4, query_pre_attn_scalar=8)
        if family == "qwen2":
            kwargs.pop("head_dim")
        cfg = cls(**kwargs)
    else:
        raise UnsupportedModelError(
            f"unknown tiny family {family!r}; choose one of {', '.join(TINY_FAMILIES)}"
        )
    if tied is not None:
        cfg.tie_word_embeddings = tied
    # 5x HF's default init: sharper attention, so that grafting q or k alone visibly matters
    cfg.initializer_range = 0.1
    return cfg


def _randomise_norms(model: nn.Module, generator: torch.Generator) -> None:
    for module in model.modules():
        if "norm" in type(module).__name__.lower() or isinstance(module, nn.LayerNorm):
            # Gemma norms scale by (1 + w): keep their gain in 0.5..1.5 like everyone else's,
            # so that float32 noise stays far below the tests' 1e-5 tolerance
            offset = -0.5 if "gemma" in type(module).__name__.lower() else 0.5
            for p in module.parameters(recurse=False):
                p.data = offset + torch.rand(p.shape, generator=generator)


def tiny_model(
    family: str, *, seed: int = 0, tied: bool | None = None, n_layers: int = 4
) -> transformers.PreTrainedModel:
    """A tiny random causal LM of ``family`` in float32 eval mode."""
    cfg = tiny_config(family, tied=tied, n_layers=n_layers)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        _randomise_norms(model, generator)
    return model.float().eval()


def perturbed_copy(model: ModuleT, *, seed: int = 1, scale: float = 0.05) -> ModuleT:
    """A copy of ``model`` with every parameter moved by seeded Gaussian noise (a fake finetune)."""
    import copy

    donor = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in donor.parameters():
            # drawn on the CPU, so a donor is the same noise on any device
            noise = torch.randn(p.shape, generator=generator).to(p.device)
            p.add_(scale * p.abs().mean().clamp_min(0.02) * noise)
    return donor.eval()


def tiny_pair(
    family: str, *, seed: int = 0, tied: bool | None = None, n_layers: int = 4
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedModel]:
    """(base, donor) tiny models of one family; the donor is a perturbed copy of the base."""
    base = tiny_model(family, seed=seed, tied=tied, n_layers=n_layers)
    return base, perturbed_copy(base, seed=seed + 100)
