"""Planning a batch: rows of (prompt, spans, spec) become padded inputs and per-site masks.

Nothing here runs a model. A :class:`BatchPlan` is what an executor needs to run one batch
(locally or on a server): padded ids with explicit position ids, each row's last index, and
the :class:`SitePatch` list saying, per grafted module and donor, at which (row, position)
cells the donor's module output replaces the base's, in the order the forward pass reaches
the modules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from graft.core.arch import Architecture, Site
from graft.core.spec import GraftSpec, ResolvedGraft
from graft.errors import SpecError

_SLICE_INDEX = {"q": 0, "k": 1, "v": 2}


@dataclass
class GraftRow:
    """One (prompt, graft) pair.

    Args:
        input_ids: token ids of the prompt (BOS included if the model expects one).
        spans: named token positions, e.g. ``{"FE": [1, 2], "M": [5, 6, 7]}``.
        spec: the graft to apply to this prompt.
    """

    input_ids: Sequence[int]
    spans: Mapping[str, Sequence[int]] = field(default_factory=dict)
    spec: GraftSpec = field(default_factory=GraftSpec)


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
            row's metrics (:func:`graft.core.trace.row_metrics`) instead of its logits.
        top_k: how many most probable tokens those metrics list.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    last_index: torch.Tensor
    patches: list[SitePatch]
    keep_last_only: bool
    targets: torch.Tensor | None = None
    top_k: int = 0


def default_pad_id(config) -> int:
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


def resolve_rows(arch: Architecture, rows: Sequence[GraftRow], donors) -> list[ResolvedGraft]:
    """Resolve every row's spec on ``arch``; a SpecError if one uses a donor not in ``donors``."""
    resolved = [_resolve(arch, r) for r in rows]
    for res in resolved:
        missing = res.donors() - set(donors)
        if missing:
            raise SpecError(
                f"the graft uses donor(s) {sorted(missing)} but only {sorted(donors)} were given"
            )
    return resolved


def _resolve(arch: Architecture, row: GraftRow) -> ResolvedGraft:
    spans = {k: list(v) for k, v in row.spans.items()}
    return row.spec.resolve(arch, len(row.input_ids), spans)


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


def _pad(rows: Sequence[GraftRow], pad_id: int, padding_side: str) -> _Padded:
    """Pad the rows' ids to one width; positions count from each prompt's first token."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', not {padding_side!r}")
    lengths = [len(r.input_ids) for r in rows]
    if min(lengths) < 1:
        raise SpecError("a prompt has no tokens")
    batch, width = len(rows), max(lengths)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    position_ids = torch.zeros((batch, width), dtype=torch.long)
    offsets = []
    for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
        off = width - n if padding_side == "left" else 0
        offsets.append(off)
        input_ids[i, off : off + n] = torch.as_tensor(list(row.input_ids), dtype=torch.long)
        attention_mask[i, off : off + n] = 1
        position_ids[i, off : off + n] = torch.arange(n)
    last_index = torch.tensor([o + n - 1 for o, n in zip(offsets, lengths, strict=True)])
    return _Padded(input_ids, attention_mask, position_ids, offsets, last_index)


class _Masks:
    """Per (module path, donor): where the donor's output is used, and which q/k/v slices."""

    def __init__(self, shape: tuple[int, int]) -> None:
        self.shape = shape
        self.entries: dict[tuple[str, str], dict] = {}

    def mark(self, path: str, site, donor: str, component, row: int, pos: int) -> None:
        entry = self.entries.setdefault(
            (path, donor),
            {"rows": torch.zeros(self.shape, dtype=torch.bool), "slices": {}},
        )
        entry["rows"][row, pos] = True
        if site is not None and site.fused:
            sl = entry["slices"].setdefault(
                _SLICE_INDEX[component], torch.zeros(self.shape, dtype=torch.bool)
            )
            sl[row, pos] = True


def _mark_all(arch: Architecture, resolved: Sequence[ResolvedGraft], padded: _Padded) -> _Masks:
    masks = _Masks(tuple(padded.input_ids.shape))
    for i, res in enumerate(resolved):
        for (layer, comp), cell in res.cells.items():
            path, site = arch.site_for(layer, comp)
            for pos, donor in cell.items():
                masks.mark(path, site, donor, comp, i, pos + padded.offsets[i])
        last = int(padded.last_index[i])
        if res.final_norm_donor:
            masks.mark(arch.table.final_norm_path, None, res.final_norm_donor, None, i, last)
        if res.unembed_donor:
            masks.mark(arch.table.unembed_path, None, res.unembed_donor, None, i, last)
    return masks


def _fused_slices(entry: dict) -> list[tuple[int, torch.Tensor]]:
    """The q/k/v slices of a fused site; none when all three cover every marked cell."""
    rows_mask, slices = entry["rows"], entry["slices"]
    full = all(k in slices for k in range(3)) and all(
        torch.equal(slices[k], rows_mask) for k in range(3)
    )
    return [] if full else [(k, m[rows_mask]) for k, m in sorted(slices.items())]


def _patches(arch: Architecture, masks: _Masks) -> list[SitePatch]:
    patches: list[SitePatch] = []
    for path, site in _site_order(arch):
        for (p, donor), entry in masks.entries.items():
            if p != path:
                continue
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
) -> BatchPlan:
    """Pad ``rows`` and turn their specs into per-site masks (no model is run)."""
    padded = _pad(rows, pad_id, padding_side)
    if resolved is None:
        resolved = [_resolve(arch, r) for r in rows]
    patches = _patches(arch, _mark_all(arch, resolved, padded))
    return BatchPlan(
        padded.input_ids,
        padded.attention_mask,
        padded.position_ids,
        padded.last_index,
        patches,
        padding_side == "left",
    )
