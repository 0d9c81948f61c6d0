"""Patching as the field runs it, beside weight grafting: a sweep over layers.

Causal tracing (Meng et al., ROME) and activation patching in nnsight, TransformerLens or
pyvene patch **one layer at a time** (or a window of a few layers around it) at one
position, and read how much of the clean answer comes back. graft's own experiments graft
the donor's *weights* at a position set in every layer at once. This module sets up both,
cell by cell, on the same prompts and donor:

- **kinds** of site: ``residual`` (the residual stream after a layer: the decoder layer's
  output), ``attn`` (what the attention block adds to the stream: the output of ``o``, or
  of the post-attention norm in sandwich-norm families) and ``mlp`` (what the MLP block
  adds: ``down``, or the post-feedforward norm);
- **methods**: ``weights`` grafts the donor's weights of that part of the layer at the
  unit's positions (``residual``: every module of the layer; ``attn``: the attention
  block's modules from its input norm to its output; ``mlp``: the MLP block's), computing on
  the run's own activations; ``patching`` writes the donor's own-run value of the kind's
  site there (``activation`` patching of the block's output module, or ``residual``
  patching of the layer's output: :class:`graft.study.analyses.patching.PatchingExecutor`);
- **directions**: ``restore`` runs the base (PRE) and takes the donor's (SFT) values,
  ``break`` runs the donor and takes the base's (noising and denoising, in the terms of
  Heimersheim and Nanda);
- **position units**: by default the first entity's tokens but its last (``FE[:-1]``), its
  last token (``FE[-1]``), every other token (``(FE+LT)^C``) and the last token ``LT``;
- **layers**: each layer alone, or windows of ``width`` layers centred on it.

Beside the sweep each method runs the whole-depth cells of E1 (FE, LT, FE+LT in every
layer). Two kinds of cell there say nothing about localisation and are labelled so:

- **identical by construction** (:func:`identical_by_construction`): a cell whose every
  grafted module reads inputs the donor itself computed, because everything upstream of it
  at every earlier position is grafted too (FE in every layer when FE starts the prompt
  and the model adds no start token). Weights and patching give the same numbers there
  whatever the model does, so their agreement is not evidence.
- **sanity checks** (:func:`copies_donor_stream`): patching every module at LT in every
  layer writes the donor's whole last-token stream into the base, so the result is the
  donor's final state read through the run's head: a check that patching works, not a
  finding about where the answer is (the residual patch of the last layer at LT is one too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from graft.core.families.arch import Architecture
from graft.core.language.spec import EMBEDDING_COMPONENTS, GraftSpec, ResolvedGraft, parse_spec
from graft.core.planning.plan import GraftRow, resolve_rows
from graft.errors import SpecError
from graft.study.specs.choices import SITE_KINDS, UNITS, WHOLE_DEPTH
from graft.study.specs.config import ModelSource
from graft.study.specs.grafts import NamedGraft, head_suffix, reference

#: The runs of one direction: the method of each, and the kinds it covers.
RUN_METHODS = {"weights": SITE_KINDS, "activation": ("attn", "mlp"), "residual": ("residual",)}
UNIT_LABELS = {"FE[:-1]": "FE but its last", "FE[-1]": "FE's last", "(FE+LT)^C": "other"}
WHOLE_GROUP = "all layers"
#: Between a unit and its layer (or window centre) in a sweep graft's name: ``LT | L12``.
LAYER_SEP = " | L"


@dataclass(frozen=True)
class Direction:
    """Which model runs and which gives the values, in one direction.

    Args:
        name: ``restore`` (the base runs, the donor's values go in) or ``break``.
        base: where the model that runs comes from.
        donors: the model that gives the values, under its spec name.
        donor: that spec name (``sft`` restoring, ``pre`` breaking).
        base_label: the name of the model that runs alone (``PRE`` restoring).
        donor_label: the name of the model that gives the values (``SFT`` restoring).
    """

    name: str
    base: ModelSource
    donors: dict[str, ModelSource] = field(default_factory=dict)
    donor: str = "sft"
    base_label: str = "PRE"
    donor_label: str = "SFT"


def direction_models(name: str, variant: str) -> Direction:
    """The models of direction ``name`` with the finetuned donor of ``variant``."""
    if name == "restore":
        return Direction(name, ModelSource(), {"sft": ModelSource(variant)}, "sft", "PRE", "SFT")
    if name == "break":
        return Direction(name, ModelSource(variant), {"pre": ModelSource()}, "pre", "SFT", "PRE")
    raise SpecError(f"direction {name!r}: use restore or break")


def check_choices(values: Sequence[str], allowed: Sequence[str], what: str) -> list[str]:
    """``values`` checked against ``allowed`` (order kept, repeats dropped)."""
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise SpecError(f"unknown {what} {bad}; use some of {', '.join(allowed)}")
    return list(dict.fromkeys(values))


def kind_components(arch: Architecture, kind: str) -> tuple[str, ...]:
    """The modules the ``weights`` method grafts for ``kind`` at a layer: every module of the
    layer (``residual``), the attention block from its input norm to its output (``attn``),
    or the MLP block from its input norm on (``mlp``)."""
    layer = [c for c in arch.components if c not in EMBEDDING_COMPONENTS]
    cut = layer.index("ln_2")  # every family's MLP input norm
    return {"residual": tuple(layer), "attn": tuple(layer[:cut]), "mlp": tuple(layer[cut:])}[kind]


def kind_site(arch: Architecture, kind: str) -> str:
    """The component whose output the ``patching`` method writes for ``kind``: the block's
    last module (``o`` or the post-attention norm; ``down`` or the post-feedforward norm);
    ``block`` for ``residual``, which the residual executor turns into the layer's output."""
    if kind == "residual":
        return "block"
    return kind_components(arch, kind)[-1]


def layer_windows(n_layers: int, width: int = 1) -> list[tuple[int, str]]:
    """``(centre layer, layer selector)`` for every layer: the layer alone (``width`` 1) or
    the ``width`` consecutive layers centred on it, shifted inside the model at its ends
    (causal tracing's windows)."""
    if width < 1 or width > n_layers:
        raise SpecError(f"window width {width}: use 1 to the model's {n_layers} layers")
    out = []
    for layer in range(n_layers):
        lo = min(max(0, layer - width // 2), n_layers - width)
        hi = lo + width - 1
        out.append((layer, str(lo) if width == 1 else f"{lo}-{hi}"))
    return out


def sweep_grafts(
    arch: Architecture,
    method: str,
    direction: Direction,
    units: Sequence[str] = UNITS,
    width: int = 1,
    kinds: Sequence[str] = SITE_KINDS,
    head_policy: str = "base",
    whole_depth: Sequence[str] = WHOLE_DEPTH,
) -> list[NamedGraft]:
    """The grafts of one run (``method``: ``weights``, ``activation`` or ``residual``; see
    :data:`RUN_METHODS`) in ``direction``: the two references, each (kind, unit, layer
    window) cell named ``"<unit> | L<centre>"`` in group ``<kind>``, and (weights and
    activation runs) the whole-depth cells in group :data:`WHOLE_GROUP`."""
    donor = direction.donor
    head = head_suffix(head_policy, donor)
    grafts = [reference(direction.base_label, None), reference(direction.donor_label, donor)]
    windows = layer_windows(arch.n_layers, width)
    for kind in (k for k in kinds if k in RUN_METHODS[method]):
        comps = kind_components(arch, kind) if method == "weights" else (kind_site(arch, kind),)
        for unit in units:
            for centre, layers in windows:
                spec = parse_spec(f"{unit}:{layers}:{','.join(comps)}@{donor}{head}")
                grafts.append(NamedGraft(f"{unit}{LAYER_SEP}{centre}", spec, kind))
    if method != "residual":
        for pos in whole_depth:
            grafts.append(NamedGraft(pos, parse_spec(f"{pos}:all:all@{donor}{head}"), WHOLE_GROUP))
    return grafts


def split_name(name: str) -> tuple[str, int | None]:
    """A sweep graft's ``(unit, centre layer)``; ``(name, None)`` for any other graft."""
    unit, sep, layer = name.rpartition(LAYER_SEP)
    return (unit, int(layer)) if sep and layer.isdigit() else (name, None)


# ------------------------------------------------------------ cells that test nothing


def forward_cells(arch: Architecture) -> list[tuple[int, str]]:
    """Every ``(layer, component)`` cell of ``arch`` in the order the forward pass computes
    them (embeddings at layer -1 first)."""
    embed = [(-1, c) for c in arch.components if c in EMBEDDING_COMPONENTS]
    layer = [c for c in arch.components if c not in EMBEDDING_COMPONENTS]
    return embed + [(i, c) for i in range(arch.n_layers) for c in layer]


def identical_by_construction(resolved: ResolvedGraft, arch: Architecture) -> bool:
    """Whether grafting these cells and patching them with the donor's own outputs must give
    the same numbers: every grafted cell's input is what the donor computes, because every
    module before it in the forward pass is grafted, from the same donor, at every position
    up to the cell's last one (attention at a position reads every earlier one). FE in
    every layer qualifies when FE starts the prompt; with a start token before it, the
    start token's keys and values come from the base and it does not. A graft of nothing
    does not qualify (there is nothing to compare)."""
    donors = {d for cell in resolved.cells.values() for d in cell.values()}
    if len(donors) != 1:
        return False
    order = forward_cells(arch)
    covered: list[set[int]] = []  # positions grafted at each cell, in forward order
    found = False
    for cell in order:
        positions = set(resolved.cells.get(cell, {}))
        if positions:
            found = True
            need = set(range(max(positions) + 1))
            if not all(need <= seen for seen in covered):
                return False
        covered.append(positions)
    return found


def whole_stream_at(resolved: ResolvedGraft, arch: Architecture, position: int) -> bool:
    """Whether every cell of every layer and the embeddings is grafted at ``position``:
    patched with the donor's own outputs there, the stream at ``position`` is the donor's
    after every layer (what each block adds and what it adds to both come from the donor)."""
    return all(position in resolved.cells.get(cell, {}) for cell in forward_cells(arch))


def copies_donor_stream(spec: GraftSpec, method: str, arch: Architecture, row: GraftRow) -> bool:
    """Whether ``method``'s patch of ``spec`` on ``row`` writes the donor's whole final
    stream at the row's last token, so that its result is the donor's last-token state read
    through the run's head (a sanity check of patching, not a localisation): residual
    patching of the last layer there, or activation patching of every module of every
    layer (and the embeddings) there. Weight grafting never copies a stream."""
    if method == "weights":
        return False
    (resolved,) = resolve_rows(arch, [GraftRow(row.input_ids, row.spans, spec)], {"sft", "pre"})
    last_token = len(row.input_ids) - 1
    if method == "residual":
        last = arch.n_layers - 1
        return any(last_token in resolved.cells.get((last, c), {}) for c in arch.components)
    return whole_stream_at(resolved, arch, last_token)


def cell_flags(
    spec: GraftSpec, method: str, arch: Architecture, row: GraftRow
) -> tuple[bool, bool]:
    """``(identical by construction, copies the donor's stream)`` of one cell on one row
    (:func:`identical_by_construction` for the spec both methods patch alike, i.e. the
    whole-depth cells; :func:`copies_donor_stream` for ``method``)."""
    if not spec.rules:
        return False, False
    comps = {c for r in spec.rules for c in r.components}
    identical = False
    if comps & {"all", "embed"}:  # without the embeddings, the first cell's input differs
        (resolved,) = resolve_rows(arch, [GraftRow(row.input_ids, row.spans, spec)], {"sft", "pre"})
        identical = identical_by_construction(resolved, arch)
    return identical, copies_donor_stream(spec, method, arch, row)
