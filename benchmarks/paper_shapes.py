"""The paper's model shapes as random-weight models: the published configs of
:mod:`graft.models.paper` at a chosen depth, or narrowed to a chosen width (the host-bound
proxy of :mod:`benchmarks.paper_scale`), and a donor made of seeded noise on a copy."""

from __future__ import annotations

import copy

import torch
from torch import nn

from benchmarks import plan_check
from benchmarks.workload import Workload, headline_workload
from graft.models import PAPER_CONFIGS

#: Depth field of each family's config (GPT-2 names it its own way).
_DEPTH_FIELD = {"gpt2": "n_layer"}
#: Width of one attention head in a narrowed config.
PROXY_HEAD_DIM = 16


def shape_config(name: str, layers: int | None = None, width: int | None = None):
    """The published config of paper model ``name``, at ``layers`` layers if given, and
    narrowed to a hidden size of ``width`` if given (heads of :data:`PROXY_HEAD_DIM`, the
    same ratio of query to key/value heads, an MLP 4 x as wide; vocabulary unchanged)."""
    config = PAPER_CONFIGS[name]()
    if layers is not None:
        setattr(config, _DEPTH_FIELD.get(config.model_type, "num_hidden_layers"), layers)
    if width is not None:
        heads = max(1, width // PROXY_HEAD_DIM)
        if config.model_type == "gpt2":
            config.n_embd, config.n_head, config.n_inner = width, heads, 4 * width
        else:
            kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            groups = max(1, config.num_attention_heads // kv)
            config.hidden_size, config.num_attention_heads = width, heads
            config.intermediate_size = 4 * width
            if hasattr(config, "num_key_value_heads"):
                config.num_key_value_heads = max(1, heads // groups)
            if getattr(config, "head_dim", None) is not None:
                config.head_dim = width // heads
    return config


def random_model(
    name: str,
    dtype: torch.dtype,
    device: torch.device,
    layers: int | None,
    width: int | None = None,
):
    """A random-weight causal LM of ``name``'s shape, built on ``device`` in ``dtype``."""
    return plan_check.random_model(shape_config(name, layers, width), dtype, device).eval()


@torch.no_grad()
def noisy_copy(model: nn.Module, seed: int, scale: float = 0.05) -> nn.Module:
    """A copy of ``model`` with seeded noise on every parameter, drawn on its device (at 2.8B
    parameters, :func:`graft.models.tiny.perturbed_copy`'s CPU draw costs more than the run)."""
    donor = copy.deepcopy(model)
    for p in donor.parameters():
        generator = torch.Generator(p.device).manual_seed(seed)
        noise = torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype)
        p.add_(scale * p.abs().mean().clamp_min(0.02) * noise)
    return donor.eval()


def random_workload(
    name: str,
    dtype: torch.dtype,
    device: torch.device,
    layers: int | None,
    width: int | None,
    tokenizer,
    prompts: int,
    batch_size: int,
    executor: object | None = None,
) -> Workload:
    """The headline workload of a random model of ``name``'s shape (:func:`random_model`)
    with its noisy copy (seed 1) as the donor."""
    base = random_model(name, dtype, device, layers, width)
    donor = noisy_copy(base, seed=1)
    return headline_workload(
        base, donor, tokenizer, prompts, batch_size, device=device, executor=executor
    )
