"""The ``local`` estimator of :func:`graft.attribute` for attention-side cells: the attention
block's change computed exactly, linearised only downstream of the block (AtP*'s fix of
attention's nonlinearity, Kramár et al. 2024).

A cell (layer ``l``, unit ``U``, kind ``m``) whose components all lie in layer ``l``'s
attention block ``A`` (``q``, ``k``, ``v``, the q/k norms, ``o``, and their groups ``qkv``,
``attn``) is estimated as

    estimate = sum over every position p of  grad_z f[p] . (A(x; m from the donor at U)[p] - A(x)[p])

``x`` the base's input to the block (with its position embeddings and mask), ``z = A(x)`` the
block's output and ``grad_z f`` its gradient, both from the plain base run; ``A(x; m from the
donor at U)`` the block run again on ``x`` with the outputs of ``m``'s modules at ``U``'s
positions replaced by the donor modules' outputs on their running inputs, as the engine
grafts. Every position counts: a donor key or value at ``U`` changes the outputs of the
positions after it. ``v`` and ``o`` alone enter the block linearly, so there it equals the
``linear`` estimator; ``q``, ``k`` and the groups get the softmax's change exactly.

Cost: per layer one more call of the attention block, on the batch repeated once per
(unit, kind) and once unchanged (the reference the changes are taken against, so both sides
see the same batch shape).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from graft.core.families.arch import Architecture, Site

__all__ = [
    "AttentionCapture",
    "attention_path",
    "block_changes",
    "block_kinds",
    "local_effects",
]


def attention_path(arch: Architecture, layer: int) -> str:
    """The module path of ``layer``'s attention block: the module holding its ``o``."""
    return arch.site_for(layer, "o")[0].rsplit(".", 1)[0]


def block_kinds(arch: Architecture, leaves: Mapping[str, list[str]]) -> list[str]:
    """The kinds of ``leaves`` (kind -> its leaf components) whose leaves all lie inside the
    attention block (the same for every layer)."""
    block = attention_path(arch, 0) + "."
    return [
        kind
        for kind, parts in leaves.items()
        if all(
            leaf in arch.components and arch.site_for(0, leaf)[0].startswith(block)
            for leaf in parts
        )
    ]


class AttentionCapture:
    """Forward hooks on the base's attention blocks of ``layers`` during its plain run: each
    block's inputs (``inputs[layer] = (args, kwargs)``, detached) and its output with its
    gradient kept (``outputs[layer]``, its ``.grad`` after the backward)."""

    def __init__(self, base: torch.nn.Module, arch: Architecture, layers: Sequence[int]) -> None:
        self.inputs: dict[int, tuple[Any, Any]] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []
        for layer in layers:
            block = base.get_submodule(attention_path(arch, layer))
            self._handles.append(
                block.register_forward_pre_hook(self._keep_inputs(layer), with_kwargs=True)
            )
            self._handles.append(block.register_forward_hook(self._keep_output(layer)))

    def _keep_inputs(self, layer: int) -> Any:
        def run(module: Any, args: Any, kwargs: Any) -> None:
            self.inputs[layer] = (_detached(args), _detached(kwargs))

        return run

    def _keep_output(self, layer: int) -> Any:
        def run(module: Any, args: Any, out: Any) -> None:
            first = out[0] if isinstance(out, tuple | list) else out
            if first.requires_grad:
                first.retain_grad()
            self.outputs[layer] = first

        return run

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def local_effects(
    capture: AttentionCapture,
    base: torch.nn.Module,
    donor: torch.nn.Module,
    arch: Architecture,
    layers: Sequence[int],
    leaves: Mapping[str, list[str]],
    unit_rows: Mapping[str, torch.Tensor],
) -> dict[tuple[int, str, str], torch.Tensor]:
    """Per (layer, kind, unit): the estimate of each row [rows] (float64), for the attention
    kinds ``leaves`` (kind -> leaf components) and the units ``unit_rows`` (unit -> its
    positions as a bool mask [rows, width]; a row without the unit has none). Run after the
    base's forward and backward with ``capture`` in place (and removed)."""
    variants = [(unit, kind) for unit in unit_rows for kind in leaves]
    effects: dict[tuple[int, str, str], torch.Tensor] = {}
    if not variants:
        return effects
    for layer in layers:
        cells = [(unit_rows[unit], leaves[kind]) for unit, kind in variants]
        change = block_changes(capture, base, donor, arch, layer, cells)
        first = capture.outputs[layer]
        grad = first.grad if first.grad is not None else torch.zeros_like(first)
        estimates = (change * grad.double()).reshape(len(variants), first.shape[0], -1).sum(-1)
        for j, (unit, kind) in enumerate(variants):
            effects[(layer, kind, unit)] = estimates[j].cpu()
    return effects


def block_changes(
    capture: AttentionCapture,
    base: torch.nn.Module,
    donor: torch.nn.Module,
    arch: Architecture,
    layer: int,
    cells: Sequence[tuple[torch.Tensor, Sequence[str]]],
) -> torch.Tensor:
    """The change of ``layer``'s attention block output [cells, rows, width, ...] (float64)
    when each cell (its positions as a bool mask [rows, width], its leaf components) is
    grafted, the block run on the base's inputs ``capture`` kept: all cells in one call, the
    batch repeated once per cell and once unchanged (the reference, so that both sides of the
    difference see one batch shape)."""
    args, kwargs = capture.inputs[layer]
    first = capture.outputs[layer]
    rows, width = first.shape[0], first.shape[1]
    times = len(cells) + 1
    masks: dict[str, dict[str, torch.Tensor]] = {}
    for j, (positions, parts) in enumerate(cells):
        for leaf in parts:
            path = arch.site_for(layer, leaf)[0]
            mask = masks.setdefault(path, {}).get(leaf)
            if mask is None:
                mask = torch.zeros((times * rows, width), dtype=torch.bool, device=first.device)
                masks[path][leaf] = mask
            mask[j * rows : (j + 1) * rows] = positions.to(first.device)
    handles = []
    for path, by_leaf in masks.items():
        site = arch.site_for(layer, next(iter(by_leaf)))[1]
        hook = _mixer(site, donor.get_submodule(path), by_leaf, arch.n_heads)
        handles.append(base.get_submodule(path).register_forward_hook(hook, with_kwargs=True))
    block = base.get_submodule(attention_path(arch, layer))
    try:
        with torch.no_grad():
            out = block(*_repeated(args, rows, times), **_repeated(kwargs, rows, times))
    finally:
        for handle in handles:
            handle.remove()
    out = (out[0] if isinstance(out, tuple | list) else out).double()
    out = out.reshape(times, rows, *out.shape[1:])
    return out[:-1] - out[-1]


def _mixer(
    site: Site, donor_module: torch.nn.Module, masks: Mapping[str, torch.Tensor], n_heads: int
) -> Any:
    """A forward hook writing the donor module's output (on the module's input) over the
    module's where ``masks`` (leaf component -> [batch, positions] bool) say."""

    def run(module: Any, args: Any, kwargs: Any, out: torch.Tensor) -> torch.Tensor:
        new = donor_module(*args, **kwargs)
        if site.fused is None:
            (mask,) = masks.values()
            shape = [1] * out.dim()
            shape[0], shape[site.seq_dim] = mask.shape
            return torch.where(mask.view(shape), new, out)
        parts = (3, -1) if site.fused == "thirds" else (n_heads, 3, -1)
        full = torch.zeros((*out.shape[:2], *(1,) * (len(parts) - 2), 3, 1), dtype=torch.bool)
        full = full.to(out.device)
        for leaf, mask in masks.items():
            full[..., site.components.index(leaf), 0] = mask.view(
                *mask.shape, *(1,) * (len(parts) - 2)
            )
        mixed = torch.where(full, new.unflatten(-1, parts), out.unflatten(-1, parts))
        return mixed.flatten(-len(parts))

    return run


def _detached(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, tuple | list):
        return type(obj)(_detached(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _detached(v) for k, v in obj.items()}
    return obj


def _repeated(obj: Any, rows: int, times: int) -> Any:
    """``obj`` with every per-row tensor (2 or more dimensions, the first ``rows`` long)
    repeated ``times`` along the batch; others (broadcast masks, 1-d cache positions) kept."""
    if isinstance(obj, torch.Tensor):
        if obj.dim() >= 2 and obj.shape[0] == rows:
            return obj.repeat(times, *(1,) * (obj.dim() - 1))
        return obj
    if isinstance(obj, tuple | list):
        return type(obj)(_repeated(o, rows, times) for o in obj)
    if isinstance(obj, dict):
        return {k: _repeated(v, rows, times) for k, v in obj.items()}
    return obj
