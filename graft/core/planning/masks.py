"""A batch's masks from its rows' layouts, with work proportional to the distinct layouts of
the batch, not to its rows or cells.

Rows with one layout (the same spec on the same prompt shape) and one padding offset mark the
same columns. A (module, donor) key's mask is therefore fixed by the
positions each distinct layout marks for it (its *signature*, :func:`_signature`); keys with
equal signatures have equal masks and share one tensor (a graft of whole layers marks the
same cells at every site), built once from a few index writes per layout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypedDict

import torch

#: The positions a key marks in one layout (sorted, distinct); ``()`` where it marks none.
Positions = tuple[int, ...]
#: A mask's signature: its :data:`Positions` per distinct layout of the batch.
Signature = tuple[Positions, ...]


class Marks(Protocol):
    """What :func:`mask_entries` reads of a row layout (``graft.core.planning.plan._Layout``)."""

    entries: dict[tuple[str, str], tuple[list[int], dict[int, list[int]]]]
    normal: dict[tuple[tuple[str, str], int | None], Positions] | None


class Entry(TypedDict):
    """One (module path, donor)'s masks: where its output is used, and per q/k/v slice."""

    rows: torch.Tensor
    slices: dict[int, torch.Tensor]


def _normal(layout: Marks) -> dict[tuple[tuple[str, str], int | None], Positions]:
    """``{(key, None): positions, (key, slice index): positions}`` of ``layout``, positions
    sorted and distinct, keys that mark no position left out (made once per layout)."""
    if layout.normal is None:
        normal: dict[tuple[tuple[str, str], int | None], Positions] = {}
        for key, (pos, slices) in layout.entries.items():
            if not pos:
                continue
            normal[key, None] = tuple(sorted(set(pos)))
            for s, spos in slices.items():
                normal[key, s] = tuple(sorted(set(spos)))
        layout.normal = normal
    return layout.normal


def _signature(
    normals: Sequence[dict[tuple[tuple[str, str], int | None], Positions]],
    key: tuple[tuple[str, str], int | None],
) -> Signature:
    return tuple(n.get(key, ()) for n in normals)


def mask_entries(
    layouts: Sequence[Marks], offsets: Sequence[int], shape: tuple[int, ...]
) -> dict[tuple[str, str], Entry]:
    """``{(path, donor): {"rows": mask, "slices": {slice index: mask}}}`` of the rows whose
    layouts and padding offsets are given, in order of first marking (row by row, each row's
    keys in its layout's order); equal masks are one tensor."""
    distinct: dict[tuple[int, int], int] = {}  # (id(layout), offset) -> number, first row first
    kinds: list[Marks] = []
    rows_of: list[list[int]] = []
    offset_of: list[int] = []
    for i, (layout, offset) in enumerate(zip(layouts, offsets, strict=True)):
        u = distinct.get((id(layout), offset))
        if u is None:
            u = distinct[id(layout), offset] = len(kinds)
            kinds.append(layout)
            rows_of.append([])
            offset_of.append(offset)
        rows_of[u].append(i)
    normals = [_normal(layout) for layout in kinds]
    row_index = [torch.tensor(r, dtype=torch.long).unsqueeze(1) for r in rows_of]
    masks: dict[Signature, torch.Tensor] = {}

    def mask(sig: Signature) -> torch.Tensor:
        made = masks.get(sig)
        if made is None:
            made = masks[sig] = torch.zeros(shape, dtype=torch.bool)
            for u, positions in enumerate(sig):
                if positions:
                    cols = torch.tensor(positions, dtype=torch.long) + offset_of[u]
                    made[row_index[u], cols.unsqueeze(0)] = True
        return made

    entries: dict[tuple[str, str], Entry] = {}
    for normal in normals:  # keys in order of first marking: the first row of each layout
        for key, s in normal:
            if s is None and key not in entries:
                entries[key] = {"rows": mask(_signature(normals, (key, None))), "slices": {}}
    slice_keys = dict.fromkeys(ks for normal in normals for ks in normal if ks[1] is not None)
    for key, s in slice_keys:
        assert s is not None
        entries[key]["slices"][s] = mask(_signature(normals, (key, s)))
    return entries
