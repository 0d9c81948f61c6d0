"""How many bytes of donor weights ship mode sends: per request, per graft, per paper model.

A shipped request carries the donor modules of exactly the grafted (layer, component) sites;
the base is named by its model key and never travels. Tensors a donor's modules share (tied
embeddings) count once per donor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from graft.core.families.arch import Architecture, architecture_of
from graft.core.families.wrapping import unwrap
from graft.core.language.spec import EMBEDDING_COMPONENTS, GraftSpec, expand_components, parse_spec
from graft.models.paper import PAPER_CONFIGS, meta_model

if TYPE_CHECKING:
    from transformers import PretrainedConfig

TABLE_SPECS = ("LT:all:all", "LT:q4:o,ffn", "FE:all:qkv", "ALL:all:q")


def module_bytes(modules: Iterable[nn.Module], dtype: torch.dtype | None = None) -> int:
    """Bytes of the tensors of ``modules`` (each shared tensor once), at ``dtype``'s size if given."""
    seen: dict[int, torch.Tensor] = {}
    for module in modules:
        for t in (*module.parameters(), *module.buffers()):
            seen.setdefault(id(t), t)
    size = (lambda t: dtype.itemsize) if dtype is not None else (lambda t: t.element_size())
    return sum(t.numel() * size(t) for t in seen.values())


def keyed_bytes(
    keys: Iterable[tuple[str, str]],
    module_at: Callable[[str, str], nn.Module],
    dtype: torch.dtype | None = None,
) -> int:
    """Bytes of the donor modules at ``keys`` ((donor, path) pairs; ``module_at(donor, path)``
    gives the module); tensors shared within one donor count once."""
    per_donor: dict[str, list[nn.Module]] = {}
    for donor, path in keys:
        per_donor.setdefault(donor, []).append(module_at(donor, path))
    return sum(module_bytes(mods, dtype) for mods in per_donor.values())


def spec_module_paths(arch: Architecture, spec: GraftSpec | str) -> set[tuple[str, str]]:
    """``(donor, module path)`` of every donor module ``spec`` can call, on any prompt.

    Positions are taken as non-empty (an upper bound: a rule fully overridden by a later one
    still counts). A fused QKV site counts whole even when only q, k or v is grafted (the
    whole module runs). Layer groups and ``all`` resolve under the spec's protocol, as in a
    run.
    """
    if isinstance(spec, str):
        spec = parse_spec(spec)
    out: set[tuple[str, str]] = set()
    for rule in spec.rules:
        layers = rule.layer_list(arch.n_layers, spec.protocol)
        comps = expand_components(rule.components, arch.components, arch.family, spec.protocol)
        for comp in comps:
            for layer in [-1] if comp in EMBEDDING_COMPONENTS else layers:
                out.add((rule.donor, arch.site_for(layer, comp)[0]))
    if spec.head == "donor":
        out.add((spec.head_donor, arch.table.final_norm_path))
        out.add((spec.head_donor, arch.table.unembed_path))
    elif spec.head == "paper" and arch.tied_embeddings:
        embed = arch.table.embed_sites[0].path
        for donor in {d for d, p in out if p == embed}:
            out.add((donor, arch.table.unembed_path))
    return out


def estimate_payload_bytes(
    model: Any,
    specs: GraftSpec | str | Iterable[GraftSpec | str],
    *,
    dtype: torch.dtype | None = None,
) -> int:
    """Bytes of donor weights ship mode sends for grafts ``specs`` (one request, all donors).

    Args:
        model: a donor (or the base: same shapes), its nnsight wrapper, or a config
            (``transformers.PretrainedConfig``, built on the meta device: no weights needed).
        specs: one spec or several (text or ``GraftSpec``); modules shared by several count
            once per donor.
        dtype: count every tensor at this dtype's size (default: the tensors' own dtype).

    Tied tensors count once. Serialisation adds a little (the trace, the envoy tree: tens
    of KB); zstd takes little off float weights.
    """
    if not isinstance(model, nn.Module) and hasattr(model, "model_type"):
        model = meta_model(model)
    torch_model = unwrap(model)
    arch = architecture_of(torch_model)
    if isinstance(specs, str | GraftSpec):
        specs = [specs]
    keys = set().union(*(spec_module_paths(arch, s) for s in specs)) if specs else set()
    return keyed_bytes(keys, lambda _donor, path: torch_model.get_submodule(path), dtype)


def payload_table(
    specs: Sequence[str] = TABLE_SPECS,
    models: Mapping[str, Callable[[], PretrainedConfig]] | None = None,
) -> list[dict[str, Any]]:
    """Ship-mode payload of each graft on each paper model, from configs alone (meta device).

    One dict per (model, graft): ``model``, ``graft``, ``bytes_float32``, ``bytes_bfloat16``
    (gpt2-xl's checkpoint is float32, Llama-3.2-1B's bfloat16) and ``params``.
    """
    rows = []
    for name, make_config in (models or PAPER_CONFIGS).items():
        model = meta_model(make_config())
        for spec in specs:
            n32 = estimate_payload_bytes(model, spec, dtype=torch.float32)
            rows.append(
                {
                    "model": name,
                    "graft": spec,
                    "params": n32 // 4,
                    "bytes_float32": n32,
                    "bytes_bfloat16": estimate_payload_bytes(model, spec, dtype=torch.bfloat16),
                }
            )
    return rows


def format_bytes(n: float) -> str:
    """``1.23 GB``-style size (powers of 1024)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GB"
