"""Independent reference implementation of dynamic weight grafting (DWG), the paper's way.

The model runs token by token with a KV cache. Before each position ``t`` a single work copy
of the base model gets, for every parameterised component, the base's weights, except for
the (layer, component) cells that map ``t`` to a donor: those weights are copied in from the
donor. Keys and values cached at earlier positions stay as they were computed, with the
weights that were active at their own position.

This module is deliberately self-contained: it imports nothing from ``graft`` (tests build
their models with ``graft.models.tiny``), uses no hooks and no activation patching, only weight
copies, so that it can check a fast one-pass grafting engine.

Tied embeddings (GPT-2, Gemma*, tied Llama): the work copy gets an untied lm_head (its own
parameter), so grafting ``embed`` never changes the unembedding; the unembedding comes from
``unembed_donor`` (base when ``None``), the final norm from ``final_norm_donor``.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable

import torch
from torch import nn
from transformers import PreTrainedModel

# A selector maps (parameter name within its module, tensor) to the index of the part of that
# tensor that belongs to the component (``...`` = the whole tensor).
Selector = Callable[[str, torch.Tensor], object]


def _whole(_name: str, _tensor: torch.Tensor) -> object:
    return ...


def _gpt2_qkv(which: int) -> Selector:
    """GPT-2 ``attn.c_attn`` is a Conv1D: weight [d, 3d], output columns are q | k | v thirds."""

    def select(name: str, tensor: torch.Tensor) -> object:
        d = tensor.shape[-1] // 3
        cols = slice(which * d, (which + 1) * d)
        return (slice(None), cols) if name == "weight" else cols

    return select


def _neox_qkv(which: int, n_heads: int) -> Selector:
    """GPT-NeoX ``attention.query_key_value`` is a Linear with weight [3d, d].

    ``GPTNeoXAttention.forward`` does ``qkv.view(..., n_heads, 3 * head_size)`` and then
    ``chunk(3, dim=-1)``, so output feature ``h * 3 * hs + which * hs + i`` is element ``i`` of
    head ``h`` of q (which=0), k (1) or v (2).
    """

    def select(_name: str, tensor: torch.Tensor) -> object:
        hs = tensor.shape[0] // (3 * n_heads)
        heads = torch.arange(n_heads).unsqueeze(1) * (3 * hs)
        rows = (heads + which * hs + torch.arange(hs).unsqueeze(0)).reshape(-1)
        return rows.to(tensor.device)

    return select


# Per family: the layer-module prefix, the final norm path, and the components of a decoder
# layer as component -> (module path relative to the layer, selector).
_LLAMA_LAYER = {
    "ln_1": ("input_layernorm", _whole),
    "q": ("self_attn.q_proj", _whole),
    "k": ("self_attn.k_proj", _whole),
    "v": ("self_attn.v_proj", _whole),
    "o": ("self_attn.o_proj", _whole),
    "ln_2": ("post_attention_layernorm", _whole),
    "gate": ("mlp.gate_proj", _whole),
    "up": ("mlp.up_proj", _whole),
    "down": ("mlp.down_proj", _whole),
}
_QK_NORM = {
    "q_norm": ("self_attn.q_norm", _whole),
    "k_norm": ("self_attn.k_norm", _whole),
}
_GEMMA2_LAYER = {
    **_LLAMA_LAYER,
    "ln_post_attn": ("post_attention_layernorm", _whole),
    "ln_2": ("pre_feedforward_layernorm", _whole),
    "ln_post_ffn": ("post_feedforward_layernorm", _whole),
}


def _family(model: PreTrainedModel) -> str:
    model_type = model.config.model_type
    if model_type in ("gemma3", "gemma3_text"):
        return "gemma3"
    if model_type in ("gpt2", "gpt_neox", "llama", "gemma", "gemma2", "qwen2", "qwen3"):
        return model_type
    raise ValueError(f"reference: unsupported model type {model_type!r}")


def family_spec(model: PreTrainedModel) -> dict:
    """The component table of ``model``'s family (exposed for tests)."""
    family = _family(model)
    if family == "gpt2":
        return {
            "layers": "transformer.h",
            "final_norm": "transformer.ln_f",
            "embeddings": {"embed": "transformer.wte", "pos_embed": "transformer.wpe"},
            "layer": {
                "ln_1": ("ln_1", _whole),
                "q": ("attn.c_attn", _gpt2_qkv(0)),
                "k": ("attn.c_attn", _gpt2_qkv(1)),
                "v": ("attn.c_attn", _gpt2_qkv(2)),
                "o": ("attn.c_proj", _whole),
                "ln_2": ("ln_2", _whole),
                "up": ("mlp.c_fc", _whole),
                "down": ("mlp.c_proj", _whole),
            },
        }
    if family == "gpt_neox":
        n_heads = model.config.num_attention_heads
        return {
            "layers": "gpt_neox.layers",
            "final_norm": "gpt_neox.final_layer_norm",
            "embeddings": {"embed": "gpt_neox.embed_in"},
            "layer": {
                "ln_1": ("input_layernorm", _whole),
                "q": ("attention.query_key_value", _neox_qkv(0, n_heads)),
                "k": ("attention.query_key_value", _neox_qkv(1, n_heads)),
                "v": ("attention.query_key_value", _neox_qkv(2, n_heads)),
                "o": ("attention.dense", _whole),
                "ln_2": ("post_attention_layernorm", _whole),
                "up": ("mlp.dense_h_to_4h", _whole),
                "down": ("mlp.dense_4h_to_h", _whole),
            },
        }
    layer = {
        "llama": _LLAMA_LAYER,
        "qwen2": _LLAMA_LAYER,
        "gemma": _LLAMA_LAYER,
        "qwen3": {**_LLAMA_LAYER, **_QK_NORM},
        "gemma2": _GEMMA2_LAYER,
        "gemma3": {**_GEMMA2_LAYER, **_QK_NORM},
    }[family]
    return {
        "layers": "model.layers",
        "final_norm": "model.norm",
        "embeddings": {"embed": "model.embed_tokens"},
        "layer": layer,
    }


def component_names(model: PreTrainedModel) -> tuple[list[str], list[str]]:
    """(embedding components, per-layer components) of ``model``'s family."""
    spec = family_spec(model)
    return list(spec["embeddings"]), list(spec["layer"])


def _module_params(module: nn.Module) -> dict[str, nn.Parameter]:
    return {name: p for name, p in module.named_parameters(recurse=False) if p is not None}


def _resolve(spec: dict, n_layers: int, layer: int, component: str) -> tuple[str, Selector]:
    """Module path (relative to the model) and selector of one (layer, component)."""
    if layer == -1:
        if component not in spec["embeddings"]:
            raise ValueError(
                f"reference: component {component!r} at layer -1 is not an embedding of this "
                f"family (choose from {sorted(spec['embeddings'])})"
            )
        return spec["embeddings"][component], _whole
    if component not in spec["layer"]:
        raise ValueError(
            f"reference: unknown component {component!r} for this family "
            f"(choose from {sorted(spec['layer'])}, or {sorted(spec['embeddings'])} at layer -1)"
        )
    if not 0 <= layer < n_layers:
        raise ValueError(f"reference: layer {layer} out of range 0..{n_layers - 1}")
    path, selector = spec["layer"][component]
    return f"{spec['layers']}.{layer}.{path}", selector


@torch.no_grad()
def reference_last_logits(
    base: PreTrainedModel,
    donors: dict[str, PreTrainedModel],
    input_ids: list[int],
    cells: dict[tuple[int, str], dict[int, str]],
    final_norm_donor: str | None = None,
    unembed_donor: str | None = None,
) -> torch.Tensor:
    """Logits (float32, [vocab]) at the last position of ``input_ids`` under the graft.

    ``cells`` maps (layer, component) -> {position: donor name}; layer -1 holds the embedding
    components (``embed``, GPT-2's ``pos_embed``).
    """
    input_ids = [int(i) for i in input_ids]
    n_tokens = len(input_ids)
    if n_tokens == 0:
        raise ValueError("reference: empty input_ids")
    spec = family_spec(base)
    n_layers = base.config.num_hidden_layers
    for name in (final_norm_donor, unembed_donor):
        if name is not None and name not in donors:
            raise ValueError(f"reference: unknown donor {name!r}")

    # Resolve every cell to (module path, selector) and group the swaps by position.
    per_position: dict[int, list[tuple[str, Selector, str]]] = {}
    for (layer, component), schedule in cells.items():
        path, selector = _resolve(spec, n_layers, layer, component)
        for t, donor_name in schedule.items():
            if not 0 <= t < n_tokens:
                raise ValueError(f"reference: position {t} out of range 0..{n_tokens - 1}")
            if donor_name not in donors:
                raise ValueError(f"reference: unknown donor {donor_name!r}")
            per_position.setdefault(t, []).append((path, selector, donor_name))

    # One work copy; untie the unembedding so that it is a parameter of its own.
    work = copy.deepcopy(base).eval()
    out_emb = work.get_output_embeddings()
    out_emb.weight = nn.Parameter(out_emb.weight.detach().clone(), requires_grad=False)
    work.config.tie_word_embeddings = False
    assert work.get_output_embeddings().weight is not work.get_input_embeddings().weight

    def swap(work_module: nn.Module, src_module: nn.Module, selector: Selector) -> None:
        work_params = _module_params(work_module)
        src_params = _module_params(src_module)
        if work_params.keys() != src_params.keys():
            raise ValueError("reference: donor module does not match the base module")
        for pname, wp in work_params.items():
            sp = src_params[pname]
            if sp.shape != wp.shape:
                raise ValueError(f"reference: shape mismatch for {pname}: {sp.shape} vs {wp.shape}")
            index = selector(pname, wp)
            wp[index] = sp[index].to(wp.dtype)

    def restore(dirty_modules: dict[int, tuple[nn.Module, str]]) -> None:
        for work_module, path in dirty_modules.values():
            base_params = _module_params(base.get_submodule(path))
            for pname, wp in _module_params(work_module).items():
                wp.copy_(base_params[pname])

    device = base.get_input_embeddings().weight.device
    ids = torch.tensor([input_ids], dtype=torch.long, device=device)
    past = None
    dirty_modules: dict[int, tuple[nn.Module, str]] = {}
    logits = None
    for t in range(n_tokens):
        # Every component back to the base's weights (only those changed before differ) ...
        restore(dirty_modules)
        dirty_modules = {}
        # ... then the donor weights of the cells active at this position.
        for path, selector, donor_name in per_position.get(t, []):
            work_module = work.get_submodule(path)
            swap(work_module, donors[donor_name].get_submodule(path), selector)
            dirty_modules[id(work_module)] = (work_module, path)
        if t == n_tokens - 1:
            if final_norm_donor is not None:
                path = spec["final_norm"]
                work_module = work.get_submodule(path)
                swap(work_module, donors[final_norm_donor].get_submodule(path), _whole)
            if unembed_donor is not None:
                donor_out = donors[unembed_donor].get_output_embeddings()
                work.get_output_embeddings().weight.copy_(donor_out.weight)
                if getattr(donor_out, "bias", None) is not None:
                    raise ValueError("reference: unembedding with a bias is not supported")
        out = work(
            input_ids=ids[:, t : t + 1],
            attention_mask=torch.ones((1, t + 1), dtype=torch.long, device=device),
            position_ids=torch.tensor([[t]], dtype=torch.long, device=device),
            use_cache=True,
            **{cache_name(work): past},
        )
        past = cache_of(out)
        logits = out.logits
    last = logits[0, -1]
    return last if last.dtype == torch.float64 else last.float()


def cache_name(model) -> str:
    """The cache argument of ``model``'s forward: ``cache`` (transformers >= 5.24) or
    ``past_key_values`` (before); written here again so the reference relies on no graft code."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_of(out):
    """The cache a forward returned, under either name."""
    return out["cache"] if "cache" in out else out.past_key_values  # noqa: SIM401 - lazy: no BC alias needed
