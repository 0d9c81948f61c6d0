"""Which model a row runs on: grafting read from the other side.

A graft runs the base with the donor's modules at some cells. Read the other way round, the
same computation is the donor run with the BASE's modules at every other cell: every
parameterised module is a site (:mod:`graft.core.families.arch`), so a cell computes with one
model's weights whichever model carries the run. A row therefore runs on its *carrier*: the model
(the base or one donor) that supplies most of its per-position work, with the other models'
modules grafted at the remaining cells. A complement such as ``LT^C:all:all`` then costs one
donor forward plus the base's modules at the last token, not a base forward plus the donor's
modules almost everywhere; ``ALL:all:all; head=donor`` is the donor's plain forward.

This holds only where the donor computes exactly what the base computes given the same
weights: same configuration, same buffers, and no parameter outside the family's sites.
:func:`can_carry` checks that; otherwise the row stays on the base.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from graft.core.families.arch import Architecture, model_config
from graft.core.language.spec import EMBEDDING_COMPONENTS, ResolvedGraft

#: The donor name under which the base's own modules are grafted into a donor's run.
BASE = "__base__"

Cell = tuple[int, str]

# Configuration entries that name or store a model but do not change what it computes.
_CONFIG_NOISE = {
    "_name_or_path",
    "name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "architectures",
    "quantization_config",
    "_commit_hash",
}


def every_cell(arch: Architecture) -> set[Cell]:
    """Every (layer, component) cell key of ``arch``; layer -1 holds the embeddings."""
    cells = {(-1, c) for c in arch.components if c in EMBEDDING_COMPONENTS}
    layer_components = [c for c in arch.components if c not in EMBEDDING_COMPONENTS]
    return cells | {(layer, c) for layer in range(arch.n_layers) for c in layer_components}


def cell_costs(arch: Architecture, model: nn.Module) -> dict[Cell, float]:
    """Work per position of each cell: the parameters its module multiplies with (a fused
    module's count shared among its components; embeddings are a lookup, cost 0)."""
    below: dict[str, int] = {}  # module path -> parameters at or under it (one walk)
    for name, p in model.named_parameters():
        path = name
        while "." in path:
            path = path.rpartition(".")[0]
            below[path] = below.get(path, 0) + p.numel()
    costs: dict[Cell, float] = {}
    for layer, comp in every_cell(arch):
        if comp in EMBEDDING_COMPONENTS:
            costs[layer, comp] = 0.0
            continue
        path, site = arch.site_for(layer, comp)
        costs[layer, comp] = below.get(path, 0) / len(site.components)
    return costs


def _site_paths(arch: Architecture) -> set[str]:
    paths = {s.path for s in arch.table.embed_sites}
    paths |= {
        arch.layer_site_path(i, s) for i in range(arch.n_layers) for s in arch.table.layer_sites
    }
    return paths | {arch.table.final_norm_path, arch.table.unembed_path}


def sites_hold_every_parameter(arch: Architecture, model: nn.Module) -> bool:
    """Whether every parameter of ``model`` belongs to one of the family's sites."""
    paths = _site_paths(arch)
    for name, _ in model.named_parameters():
        owner = name.rpartition(".")[0]
        if owner not in paths:
            return False
    return True


def _config(model: nn.Module) -> dict[str, Any]:
    data = model_config(model).to_dict()
    return {k: v for k, v in data.items() if k not in _CONFIG_NOISE}


def can_carry(arch: Architecture, base: nn.Module, donor: nn.Module) -> bool:
    """Whether ``donor`` may carry rows of ``base``: it computes what the base computes with
    the same weights (same configuration and buffers; every parameter in a site)."""
    if not sites_hold_every_parameter(arch, base) or _config(base) != _config(donor):
        return False
    base_buffers, donor_buffers = dict(base.named_buffers()), dict(donor.named_buffers())
    if base_buffers.keys() != donor_buffers.keys():
        return False
    return all(
        b.shape == donor_buffers[name].shape and torch.equal(b, donor_buffers[name].to(b.device))
        for name, b in base_buffers.items()
    )


def work_by_model(
    res: ResolvedGraft, length: int, costs: Mapping[Cell, float]
) -> dict[str | None, float]:
    """How much of ``res``'s per-position work (on a prompt of ``length`` tokens) each model
    does: ``{donor: work}``, the base under ``None``."""
    work: dict[str | None, float] = {}
    for key, cell in res.cells.items():
        cost = costs.get(key, 0.0)
        for donor in cell.values():
            work[donor] = work.get(donor, 0.0) + cost
    work[None] = sum(costs.values()) * length - sum(work.values())
    return work


def carrier_of(work: Mapping[str | None, float], candidates: set[str]) -> str | None:
    """The donor in ``candidates`` that does the most of a row's ``work``
    (:func:`work_by_model`), if it does more than the base does; else None (the base)."""
    best = max(candidates & work.keys(), key=lambda d: (work[d], d), default=None)
    if best is None or work[best] <= work[None]:
        return None
    return best


def relative_to(res: ResolvedGraft, length: int, carrier: str, every: set[Cell]) -> ResolvedGraft:
    """``res`` as a graft on ``carrier``'s run: every cell not from the carrier comes from its
    own model (the base as :data:`BASE`), and so do the final norm and the unembedding."""
    cells: dict[Cell, dict[int, str]] = {}
    for key in every:
        cell = res.cells.get(key, {})
        moved = {}
        for pos in range(length):
            source = cell.get(pos, BASE)
            if source != carrier:
                moved[pos] = source
        if moved:
            cells[key] = moved
    final_norm = res.final_norm_donor or BASE
    unembed = res.unembed_donor or BASE
    return ResolvedGraft(
        cells,
        None if final_norm == carrier else final_norm,
        None if unembed == carrier else unembed,
    )


def without(res: ResolvedGraft, names: set[str]) -> ResolvedGraft:
    """``res`` without the cells of donors in ``names`` (donors that ARE the carrier: their
    modules compute what the carrier's compute, so grafting them changes nothing)."""
    if not names or not (res.donors() & names):
        return res
    cells = {}
    for key, cell in res.cells.items():
        kept = {p: d for p, d in cell.items() if d not in names}
        if kept:
            cells[key] = kept
    final_norm = None if res.final_norm_donor in names else res.final_norm_donor
    unembed = None if res.unembed_donor in names else res.unembed_donor
    return ResolvedGraft(cells, final_norm, unembed)


def is_empty(res: ResolvedGraft) -> bool:
    """Whether ``res`` grafts nothing (its run is the carrier's plain forward)."""
    return not res.cells and res.final_norm_donor is None and res.unembed_donor is None
