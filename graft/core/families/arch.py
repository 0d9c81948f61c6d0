"""One table per architecture family: logical component -> module path, in forward order.

A *site* is one module whose output the engine may replace. Most sites carry one logical
component; a fused QKV projection carries three (``q``, ``k``, ``v``), each a slice of the
module's output:

- ``thirds`` (GPT-2 ``attn.c_attn``): output features are ``[q | k | v]``, each ``d`` wide;
- ``heads`` (GPT-NeoX ``attention.query_key_value``): output features are interleaved per
  head as ``[head, (q | k | v), head_dim]``.

Sites are listed in the order the family's forward pass calls them, which nnsight requires.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from graft.errors import SpecError, UnsupportedModelError

if TYPE_CHECKING:
    import transformers


@dataclass(frozen=True)
class Site:
    """A module whose output can be replaced.

    Args:
        path: module path relative to the layer (layer sites) or to the model (others).
        components: logical components computed by this module (several for fused QKV).
        fused: ``None``, ``"thirds"`` or ``"heads"`` -- how components slice the output.
        seq_dim: dimension of the token positions in the module's input and output (1 for
            ``[batch, positions, ...]``; 2 for Gemma 3's q/k norms, applied to
            ``[batch, heads, positions, head_dim]``).
    """

    path: str
    components: tuple[str, ...]
    fused: str | None = None
    seq_dim: int = 1


@dataclass(frozen=True)
class Family:
    """Module layout of one architecture family.

    Args:
        name: family name, e.g. ``"llama"``.
        model_types: HF ``config.model_type`` values of this family.
        embed_sites: token (and learned position) embedding sites, in forward order.
        layers_path: path of the ModuleList of decoder layers.
        layer_sites: sites inside one decoder layer, in forward order.
        final_norm_path: path of the final norm.
        unembed_path: path of the unembedding (LM head).
        example: a model of this family the paper or this project uses.
    """

    name: str
    model_types: tuple[str, ...]
    embed_sites: tuple[Site, ...]
    layers_path: str
    layer_sites: tuple[Site, ...]
    final_norm_path: str
    unembed_path: str
    example: str


def _llama_like(
    name: str,
    model_types: tuple[str, ...],
    example: str,
    *,
    qk_norm_after: str | None = None,
    sandwich: bool = False,
) -> Family:
    attn = [Site("self_attn.q_proj", ("q",)), Site("self_attn.k_proj", ("k",))]
    if qk_norm_after == "each":  # qwen3: q_norm(q_proj(x)), then k_norm(k_proj(x))
        attn = [
            Site("self_attn.q_proj", ("q",)),
            Site("self_attn.q_norm", ("q_norm",)),
            Site("self_attn.k_proj", ("k",)),
            Site("self_attn.k_norm", ("k_norm",)),
            Site("self_attn.v_proj", ("v",)),
        ]
    else:
        attn.append(Site("self_attn.v_proj", ("v",)))
        if qk_norm_after == "v":  # gemma3: q, k, v, then q_norm, k_norm
            attn += [
                Site("self_attn.q_norm", ("q_norm",), seq_dim=2),
                Site("self_attn.k_norm", ("k_norm",), seq_dim=2),
            ]
    sites = [Site("input_layernorm", ("ln_1",)), *attn, Site("self_attn.o_proj", ("o",))]
    if sandwich:
        sites += [
            Site("post_attention_layernorm", ("ln_post_attn",)),
            Site("pre_feedforward_layernorm", ("ln_2",)),
        ]
    else:
        sites.append(Site("post_attention_layernorm", ("ln_2",)))
    sites += [
        Site("mlp.gate_proj", ("gate",)),
        Site("mlp.up_proj", ("up",)),
        Site("mlp.down_proj", ("down",)),
    ]
    if sandwich:
        sites.append(Site("post_feedforward_layernorm", ("ln_post_ffn",)))
    return Family(
        name=name,
        model_types=model_types,
        embed_sites=(Site("model.embed_tokens", ("embed",)),),
        layers_path="model.layers",
        layer_sites=tuple(sites),
        final_norm_path="model.norm",
        unembed_path="lm_head",
        example=example,
    )


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            name="gpt2",
            model_types=("gpt2",),
            embed_sites=(
                Site("transformer.wte", ("embed",)),
                Site("transformer.wpe", ("pos_embed",)),
            ),
            layers_path="transformer.h",
            layer_sites=(
                Site("ln_1", ("ln_1",)),
                Site("attn.c_attn", ("q", "k", "v"), fused="thirds"),
                Site("attn.c_proj", ("o",)),
                Site("ln_2", ("ln_2",)),
                Site("mlp.c_fc", ("up",)),
                Site("mlp.c_proj", ("down",)),
            ),
            final_norm_path="transformer.ln_f",
            unembed_path="lm_head",
            example="gpt2-xl",
        ),
        Family(
            name="gpt_neox",
            model_types=("gpt_neox",),
            embed_sites=(Site("gpt_neox.embed_in", ("embed",)),),
            layers_path="gpt_neox.layers",
            layer_sites=(
                Site("input_layernorm", ("ln_1",)),
                Site("attention.query_key_value", ("q", "k", "v"), fused="heads"),
                Site("attention.dense", ("o",)),
                Site("post_attention_layernorm", ("ln_2",)),
                Site("mlp.dense_h_to_4h", ("up",)),
                Site("mlp.dense_4h_to_h", ("down",)),
            ),
            final_norm_path="gpt_neox.final_layer_norm",
            unembed_path="lm_head",
            example="pythia-2.8b",
        ),
        _llama_like("llama", ("llama", "mistral"), "Llama-3.2-1B, SmolLM2-135M"),
        _llama_like("gemma", ("gemma",), "gemma-1.1-2b"),
        _llama_like("gemma2", ("gemma2",), "gemma-2-2b", sandwich=True),
        _llama_like("gemma3", ("gemma3_text",), "gemma-3-270m", qk_norm_after="v", sandwich=True),
        _llama_like("qwen2", ("qwen2",), "Qwen2.5-0.5B"),
        _llama_like("qwen3", ("qwen3",), "Qwen3-0.6B", qk_norm_after="each"),
    )
}


def supported_families() -> str:
    return ", ".join(
        f"{f.name} ({'/'.join(f.model_types)}, e.g. {f.example})" for f in FAMILIES.values()
    )


def model_config(model: nn.Module) -> transformers.PretrainedConfig:
    """An HF model's ``config`` (torch types module attributes as ``Tensor | Module``)."""
    return cast("transformers.PretrainedConfig", model.config)


def family_of(model: nn.Module) -> Family:
    """The family table of an HF causal LM, or an UnsupportedModelError listing the supported ones."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    return _family_of_type(model_type, type(model).__name__)


def family_of_config(config: Any) -> Family:
    """The family table of an HF config (a multimodal config by its text model's), before any
    weights load, or the UnsupportedModelError :func:`family_of` would raise once they had."""
    model_type = getattr(config, "model_type", None)
    text = getattr(config, "get_text_config", None)
    text_type = getattr(text(), "model_type", None) if callable(text) else None
    if text_type is not None and any(text_type in f.model_types for f in FAMILIES.values()):
        model_type = text_type
    return _family_of_type(model_type, f"{type(config).__name__}")


def _family_of_type(model_type: object, what: str) -> Family:
    for fam in FAMILIES.values():
        if model_type in fam.model_types:
            return fam
    raise UnsupportedModelError(
        f"model type {model_type!r} ({what}) is not supported; supported "
        f"families: {supported_families()}"
    )


@dataclass(frozen=True)
class Architecture:
    """A family table bound to one model's sizes.

    Args:
        family: family name.
        table: the ``Family`` table.
        n_layers: number of decoder layers.
        n_heads: attention heads (for per-head fused QKV slicing).
        components: every logical component this model has (embeddings first).
        tied_embeddings: whether the token embedding and the unembedding are one tensor.
    """

    family: str
    table: Family
    n_layers: int
    n_heads: int
    components: tuple[str, ...]
    tied_embeddings: bool

    def layer_site_path(self, layer: int, site: Site) -> str:
        return f"{self.table.layers_path}.{layer}.{site.path}"

    def site_for(self, layer: int, component: str) -> tuple[str, Site]:
        """(module path, site) that computes ``component`` in ``layer`` (-1 = embeddings)."""
        sites = self.table.embed_sites if layer < 0 else self.table.layer_sites
        for site in sites:
            if component in site.components:
                path = site.path if layer < 0 else self.layer_site_path(layer, site)
                return path, site
        raise SpecError(f"component {component!r} does not exist in the {self.family} family")


def architecture_of(model: nn.Module) -> Architecture:
    """The bound architecture table of an HF causal LM."""
    fam = family_of(model)
    # torch types submodules and module attributes loosely (Module, Tensor | Module)
    layers = cast(nn.ModuleList, model.get_submodule(fam.layers_path))
    cfg = model_config(model)
    n_heads = getattr(cfg, "num_attention_heads", None) or cfg.n_head
    comps = [c for s in fam.embed_sites for c in s.components]
    comps += [c for s in fam.layer_sites for c in s.components]
    emb = cast(torch.Tensor, model.get_submodule(fam.embed_sites[0].path).weight)
    unemb = cast(torch.Tensor, model.get_submodule(fam.unembed_path).weight)
    tied = emb is unemb or (not emb.is_meta and emb.data_ptr() == unemb.data_ptr())
    return Architecture(fam.name, fam, len(layers), int(n_heads), tuple(comps), bool(tied))


def check_compatible(base: nn.Module, donor: nn.Module, donor_name: str = "donor") -> None:
    """Raise a SpecError naming the first tensor whose shape differs between base and donor."""
    fb, fd = family_of(base), family_of(donor)
    if fb.name != fd.name:
        raise SpecError(
            f"donor {donor_name!r} is a {fd.name} model but the base is {fb.name}: grafting needs "
            "one architecture"
        )
    base_params = dict(base.named_parameters())
    donor_params = dict(donor.named_parameters())
    for name, p in base_params.items():
        q = donor_params.get(name)
        if q is None:
            raise SpecError(f"donor {donor_name!r} has no tensor {name!r} that the base has")
        if q.shape != p.shape:
            raise SpecError(
                f"tensor {name!r} differs: base {tuple(p.shape)} vs donor {donor_name!r} "
                f"{tuple(q.shape)}; donor and base must share one architecture and size"
            )
    extra = set(donor_params) - set(base_params)
    if extra:
        raise SpecError(
            f"donor {donor_name!r} has tensors the base lacks, e.g. {sorted(extra)[0]!r}"
        )


def context_length(model: Any) -> int | None:
    """The most positions ``model`` (a model, a loaded model with ``.model`` or a config) was
    built for: ``n_positions`` (GPT-2's learned positions) or ``max_position_embeddings``."""
    model = getattr(model, "model", model)
    config = getattr(model, "config", model)
    for attr in ("n_positions", "max_position_embeddings"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
