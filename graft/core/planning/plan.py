"""Planning a batch: rows of (prompt, spans, spec) become padded inputs and per-site masks.

Nothing here runs a model. A :class:`BatchPlan` is what an executor needs to run one batch
(locally or on a server): padded ids with explicit position ids, each row's last index, and
the :class:`SitePatch` list saying, per grafted module and donor, at which (row, position)
cells the donor's module output replaces the base's, in the order the forward pass reaches
the modules.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from graft.core.families.arch import Architecture, Site
from graft.core.language.graft_object import as_spec
from graft.core.language.spec import GraftSpec, ResolvedGraft
from graft.core.planning.masks import Entry, Positions, mask_entries
from graft.errors import SpecError

_SLICE_INDEX = {"q": 0, "k": 1, "v": 2}

#: What makes rows resolve alike: spec, length, spans and prompt length (:func:`_layout_key`).
LayoutKey = tuple[GraftSpec, int, tuple[tuple[str, tuple[int, ...]], ...], int | None]


@dataclass
class GraftRow:
    """One (prompt, graft) pair.

    Args:
        input_ids: token ids of the prompt (BOS included if the model expects one).
        spans: named token positions, e.g. ``{"FE": [1, 2], "M": [5, 6, 7]}``.
        spec: the graft to apply to this prompt (a spec text or a graft.Graft is parsed).
        prompt_length: when set, only ``input_ids[:prompt_length]`` is the prompt and the
            rest a continuation being scored: ``LT`` then covers every continuation position
            (see :func:`graft.core.language.selectors.position_set`). None: all of it is the prompt.
    """

    input_ids: Sequence[int]
    spans: Mapping[str, Sequence[int]] = field(default_factory=dict)
    spec: GraftSpec = field(default_factory=GraftSpec)
    prompt_length: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.spec, GraftSpec):  # a spec text or a graft.Graft
            self.spec = as_spec(self.spec)


@dataclass
class SitePatch:
    """What one donor replaces at one module in one batch.

    Args:
        path: module path in the base model.
        donor: donor name.
        rows: bool [batch, positions]: where the donor's module output is used at all.
        fused: ``None``, ``"thirds"`` or ``"heads"`` (fused QKV layout).
        slices: for fused sites, ``(slice index 0/1/2, bool [n_selected])`` pairs saying which
            of q, k, v to take at each selected position; empty means the whole output.
        n_heads: attention heads (for ``"heads"`` slicing).
        seq_dim: dimension of the positions in the module's input and output.
    """

    path: str
    donor: str
    rows: torch.Tensor
    fused: str | None = None
    slices: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    n_heads: int = 1
    seq_dim: int = 1


@dataclass
class BatchPlan:
    """A padded batch and its patches, in forward order.

    Args:
        input_ids: [batch, positions] padded ids.
        attention_mask: [batch, positions] 1 for real tokens.
        position_ids: [batch, positions] positions counted from each prompt's first token.
        last_index: [batch] index of each row's last real token.
        patches: site patches in the order the forward pass reaches their modules.
        keep_last_only: whether only the last position's logits are computed (left padding).
        targets: [batch] each row's target token id, or None. Given, the trace returns each
            row's metrics (:func:`graft.core.execution.trace.row_metrics`) instead of its logits.
        top_k: how many most probable tokens those metrics list.
        prefix: for a step on shared prefixes (local runs only): the prefixes it continues,
            :class:`SharedPrefix`. Its ids are then each row's last token [batch, 1] and its
            attention mask covers the prefix too [batch, prefix width + 1].
        step_model: for a step, the model that runs it, by its name among the executor's
            donors (the base as ``graft.core.planning.carrier.BASE``), its patches relative to that
            model; None: the model that computes the prefixes.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    last_index: torch.Tensor
    patches: list[SitePatch]
    keep_last_only: bool
    targets: torch.Tensor | None = None
    top_k: int = 0
    prefix: SharedPrefix | None = None
    step_model: str | None = None


@dataclass
class SharedPrefix:
    """Prompts without their last token, run once for every step that continues them.

    Args:
        plan: the prefixes as a padded batch, grafted where its rows graft before their last
            token (its key/value cache is kept).
        prompt_index: [batch] for each row of the step, its prefix's row in ``plan``.
        parts: the row ranges ``(start, stop)`` of ``plan`` run one forward each to compute
            its cache (None: all rows at once).
    """

    plan: BatchPlan
    prompt_index: torch.Tensor
    parts: list[tuple[int, int]] | None = None


def default_pad_id(config: object) -> int:
    """The config's pad id, else its eos id, else 0 (padded positions are masked anyway)."""
    for value in (getattr(config, "pad_token_id", None), getattr(config, "eos_token_id", None)):
        if isinstance(value, int):
            return value
    return 0


def check_targets(
    targets: Sequence[int] | torch.Tensor, n_rows: int, top_k: int, vocab_size: int
) -> torch.Tensor:
    """``targets`` as a long tensor [n_rows]: one token id per row, and 1 <= top_k <= vocab."""
    ids = torch.as_tensor(targets, dtype=torch.long).reshape(-1)
    if len(ids) != n_rows:
        raise SpecError(f"targets needs one token id per row: {len(ids)} for {n_rows} rows")
    if len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
        raise SpecError(f"targets must be token ids of the model, 0 to {vocab_size - 1}")
    if not 1 <= top_k <= vocab_size:
        raise SpecError(f"top_k must be between 1 and the vocabulary size {vocab_size}")
    return ids


def resolve_rows(
    arch: Architecture, rows: Sequence[GraftRow], donors: Collection[str]
) -> list[ResolvedGraft]:
    """Resolve every row's spec on ``arch``; a SpecError if one uses a donor not in ``donors``.
    Rows with the same spec, length and spans resolve alike: once, to one shared object."""
    by_key: dict[LayoutKey, ResolvedGraft] = {}
    for row in rows:
        key = _layout_key(row)
        if key not in by_key:
            res = by_key[key] = _resolve(arch, row)
            missing = res.donors() - set(donors)
            if missing:
                raise SpecError(
                    f"the graft uses donor(s) {sorted(missing)} but only {sorted(donors)} "
                    "were given"
                )
    return [by_key[_layout_key(row)] for row in rows]


def _resolve(arch: Architecture, row: GraftRow) -> ResolvedGraft:
    spec, length, spans, prompt_length = _layout_key(row)
    return _resolved(spec, arch, length, spans, prompt_length)


@functools.lru_cache(maxsize=4096)
def _resolved(
    spec: GraftSpec,
    arch: Architecture,
    length: int,
    spans: tuple[tuple[str, tuple[int, ...]], ...],
    prompt_length: int | None,
) -> ResolvedGraft:
    """A spec resolved on a prompt shape, kept for the next rows and calls of that shape (a
    resolved graft is never changed in place: routing makes new ones)."""
    return spec.resolve(arch, length, {k: list(v) for k, v in spans}, prompt_length)


def _site_order(arch: Architecture) -> list[tuple[str, Site | None]]:
    """Every replaceable module path with its site, in forward order; head last."""
    order: list[tuple[str, Site | None]] = [(s.path, s) for s in arch.table.embed_sites]
    for layer in range(arch.n_layers):
        order += [(arch.layer_site_path(layer, s), s) for s in arch.table.layer_sites]
    order.append((arch.table.final_norm_path, None))
    order.append((arch.table.unembed_path, None))
    return order


@dataclass
class _Padded:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    offsets: list[int]
    last_index: torch.Tensor


def _id_list(ids: Sequence[int]) -> list[int]:
    """A row's token ids as a list of ints (a tensor's too)."""
    return ids.tolist() if isinstance(ids, torch.Tensor) else [int(i) for i in ids]


def _pad(rows: Sequence[GraftRow], pad_id: int, padding_side: str) -> _Padded:
    """Pad the rows' ids to one width; positions count from each prompt's first token."""
    if padding_side not in ("left", "right"):
        raise SpecError(f"padding_side must be 'left' or 'right', not {padding_side!r}")
    lengths = [len(r.input_ids) for r in rows]
    if min(lengths) < 1:
        raise SpecError("a prompt has no tokens")
    width = max(lengths)
    left = padding_side == "left"
    offsets = [width - n if left else 0 for n in lengths]
    # one tensor from Python lists, then masks by comparison: no per-row tensor writes
    pads = [[pad_id] * (width - n) for n in lengths]
    given = [_id_list(r.input_ids) for r in rows]
    ids = [p + g if left else g + p for g, p in zip(given, pads, strict=True)]
    input_ids = torch.tensor(ids, dtype=torch.long)
    n = torch.tensor(lengths, dtype=torch.long)[:, None]
    off = torch.tensor(offsets, dtype=torch.long)[:, None]
    position_ids = torch.arange(width, dtype=torch.long)[None, :] - off
    inside = (position_ids >= 0) & (position_ids < n)
    attention_mask = inside.long()
    position_ids = position_ids.masked_fill_(~inside, 0)
    last_index = (off + n - 1).squeeze(1)
    return _Padded(input_ids, attention_mask, position_ids, offsets, last_index)


class _Layout:
    """One row's marks in prompt positions, per (module path, donor): the positions where
    the donor's output is used and, at fused sites, per q/k/v slice. Insertion order is the
    order of first marking, which fixes the order of donors at one module."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], tuple[list[int], dict[int, list[int]]]] = {}
        #: its marks with positions sorted and distinct (:func:`graft.core.planning.masks._normal`)
        self.normal: dict[tuple[tuple[str, str], int | None], Positions] | None = None

    def add(self, key: tuple[str, str], slice_index: int | None, positions: Sequence[int]) -> None:
        pos, slices = self.entries.setdefault(key, ([], {}))
        pos.extend(positions)
        if slice_index is not None:
            slices.setdefault(slice_index, []).extend(positions)
        self.normal = None


def _row_layout(
    arch: Architecture,
    res: ResolvedGraft,
    length: int,
    sites: dict[tuple[int, str], tuple[str, Site]],
) -> _Layout:
    """``res``'s marks in prompt positions; ``sites`` caches ``arch.site_for``."""
    layout = _Layout()
    for (layer, comp), cell in res.cells.items():
        if (layer, comp) not in sites:
            sites[layer, comp] = arch.site_for(layer, comp)
        path, site = sites[layer, comp]
        slice_index = _SLICE_INDEX[comp] if site is not None and site.fused else None
        by_donor: dict[str, list[int]] = {}
        for pos, donor in cell.items():
            by_donor.setdefault(donor, []).append(pos)
        for donor, positions in by_donor.items():
            layout.add((path, donor), slice_index, positions)
    read_out = list(range(length)) if res.head_everywhere else [length - 1]
    if res.final_norm_donor:
        layout.add((arch.table.final_norm_path, res.final_norm_donor), None, read_out)
    if res.unembed_donor:
        layout.add((arch.table.unembed_path, res.unembed_donor), None, read_out)
    return layout


#: Most derived values a :class:`LayoutCache` keeps (:meth:`LayoutCache.remember`).
MEMO_ENTRIES = 200_000

_MISSING = object()
_V = TypeVar("_V")


class LayoutCache:
    """Row layouts (the marks of one spec on one prompt shape) kept across batches of a run:
    rows with the same spec, length and spans resolve to the same cells, so their layout is
    built once. Holds layouts of at most ``max_cells`` marked positions in all (the oldest
    are dropped first), so long prompts cannot make it grow without bound.

    Args:
        max_cells: most marked positions held, over all layouts.
    """

    def __init__(self, max_cells: int = 2_000_000) -> None:
        self.max_cells = max_cells
        #: what else the planner derives from a row's graft alone, by (what, layout key)
        #: (e.g. a shared prefix's signature); cleared when it holds :data:`MEMO_ENTRIES`
        self.memo: dict[tuple[str, LayoutKey], object] = {}
        self._layouts: dict[LayoutKey, tuple[_Layout, int]] = {}
        self._cells = 0

    def remember(self, what: str, key: LayoutKey, make: Callable[[], _V]) -> _V:
        """``make()``, kept under ``(what, key)`` for the next row with the same layout key."""
        hit = self.memo.get((what, key), _MISSING)
        if hit is _MISSING:
            if len(self.memo) >= MEMO_ENTRIES:
                self.memo.clear()
            hit = self.memo[what, key] = make()
        return hit  # type: ignore[return-value]  # what make() returned

    def get(self, key: LayoutKey) -> _Layout | None:
        """The layout stored under ``key``, or None."""
        hit = self._layouts.get(key)
        return None if hit is None else hit[0]

    def put(self, key: LayoutKey, layout: _Layout) -> None:
        """Store ``layout`` under ``key``, dropping the oldest layouts beyond the budget."""
        size = sum(len(pos) + sum(map(len, sl.values())) for pos, sl in layout.entries.values())
        while self._layouts and self._cells + size > self.max_cells:
            oldest = next(iter(self._layouts))
            self._cells -= self._layouts.pop(oldest)[1]
        self._layouts[key] = (layout, size)
        self._cells += size


def _layout_key(row: GraftRow) -> LayoutKey:
    spans = tuple(sorted((name, tuple(pos)) for name, pos in row.spans.items()))
    return row.spec, len(row.input_ids), spans, row.prompt_length


def _mark_all(
    arch: Architecture,
    rows: Sequence[GraftRow],
    resolved: Sequence[ResolvedGraft] | None,
    padded: _Padded,
    layouts: LayoutCache,
) -> dict[tuple[str, str], Entry]:
    """Every row's marks. A spec resolves the same way on every prompt of one length and
    spans, so such rows share one layout (and, cached, need no resolving)."""
    sites: dict[tuple[int, str], tuple[str, Site]] = {}
    row_layouts = []
    for i, row in enumerate(rows):
        key = _layout_key(row)
        layout = layouts.get(key)
        if layout is None:
            res = resolved[i] if resolved is not None else _resolve(arch, row)
            layout = _row_layout(arch, res, len(row.input_ids), sites)
            layouts.put(key, layout)
        row_layouts.append(layout)
    shape = tuple(padded.input_ids.shape)
    return mask_entries(row_layouts, padded.offsets, shape)


def _fused_slices(entry: Entry) -> list[tuple[int, torch.Tensor]]:
    """The q/k/v slices of a fused site; none when all three cover every marked cell."""
    rows_mask, slices = entry["rows"], entry["slices"]
    full = all(k in slices for k in range(3)) and all(
        torch.equal(slices[k], rows_mask) for k in range(3)
    )
    return [] if full else [(k, m[rows_mask]) for k, m in sorted(slices.items())]


def _patches(arch: Architecture, entries: dict[tuple[str, str], Entry]) -> list[SitePatch]:
    by_path: dict[str, list[tuple[str, Entry]]] = {}
    for (path, donor), entry in entries.items():
        by_path.setdefault(path, []).append((donor, entry))
    patches: list[SitePatch] = []
    for path, site in _site_order(arch):
        for donor, entry in by_path.get(path, []):
            fused = site.fused if site is not None else None
            patches.append(
                SitePatch(
                    path=path,
                    donor=donor,
                    rows=entry["rows"],
                    fused=fused,
                    slices=_fused_slices(entry) if fused else [],
                    n_heads=arch.n_heads,
                    seq_dim=site.seq_dim if site is not None else 1,
                )
            )
    return patches


def plan_batch(
    arch: Architecture,
    rows: Sequence[GraftRow],
    *,
    pad_id: int = 0,
    padding_side: str = "left",
    resolved: Sequence[ResolvedGraft] | None = None,
    layouts: LayoutCache | None = None,
) -> BatchPlan:
    """Pad ``rows`` and turn their specs into per-site masks (no model is run).

    ``resolved``, when given, holds each row's spec resolved on ``arch`` (as
    :func:`resolve_rows` returns them). ``layouts`` keeps row layouts across calls on the
    same ``arch`` (default: shared within this call only).
    """
    padded = _pad(rows, pad_id, padding_side)
    layouts = LayoutCache() if layouts is None else layouts
    patches = _patches(arch, _mark_all(arch, rows, resolved, padded, layouts))
    return BatchPlan(
        padded.input_ids,
        padded.attention_mask,
        padded.position_ids,
        padded.last_index,
        patches,
        padding_side == "left",
    )
