"""A batch's masks from its rows' layouts, with a few tensor operations per batch: every
row's marked (module, donor, position) cells are laid out flat once per layout
(:func:`_flat`), offset by the row's padding, and written into one bool tensor per
(module, donor) and q/k/v slice; equal masks become one tensor (:func:`mask_entries`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypedDict

import torch


class Marks(Protocol):
    """What :func:`_flat` reads of a row layout (``graft.core.plan.Marks``)."""

    entries: dict[tuple[str, str], tuple[list[int], dict[int, list[int]]]]
    flat: tuple[KeyIndex, FlatLayout] | None


class Entry(TypedDict):
    """One (module path, donor)'s masks: where its output is used, and per q/k/v slice."""

    rows: torch.Tensor
    slices: dict[int, torch.Tensor]


class KeyIndex:
    """A number per (module path, donor), given in order of first sight (kept by a
    :class:`LayoutCache` across the batches of a run, so cached layouts stay valid)."""

    def __init__(self) -> None:
        self.keys: list[tuple[str, str]] = []
        self._ids: dict[tuple[str, str], int] = {}

    def of(self, key: tuple[str, str]) -> int:
        known = self._ids.get(key)
        if known is None:
            known = self._ids[key] = len(self.keys)
            self.keys.append(key)
        return known


@dataclass
class FlatLayout:
    """A layout as index tensors: every marked (key, position), and every marked (key,
    q/k/v slice, position) as ``3 * key + slice``, in the layout's order.

    Args:
        keys: [cells] key numbers (:class:`KeyIndex`).
        positions: [cells] prompt positions.
        slice_keys: [slice cells] ``3 * key + slice index``.
        slice_positions: [slice cells] prompt positions.
    """

    keys: torch.Tensor
    positions: torch.Tensor
    slice_keys: torch.Tensor
    slice_positions: torch.Tensor


def _flat(layout: Marks, index: KeyIndex) -> FlatLayout:
    """``layout`` as a :class:`FlatLayout` under ``index`` (made once per layout)."""
    if layout.flat is not None and layout.flat[0] is index:
        return layout.flat[1]
    keys: list[int] = []
    positions: list[int] = []
    slice_keys: list[int] = []
    slice_positions: list[int] = []
    for key, (pos, slices) in layout.entries.items():
        k = index.of(key)
        keys += [k] * len(pos)
        positions += pos
        for s, spos in slices.items():
            slice_keys += [3 * k + s] * len(spos)
            slice_positions += spos
    flat = FlatLayout(*(torch.tensor(v, dtype=torch.long) for v in
                         (keys, positions, slice_keys, slice_positions)))  # fmt: skip
    layout.flat = (index, flat)
    return flat


def _first_seen(ids: torch.Tensor) -> torch.Tensor:
    """The distinct values of ``ids`` in order of first occurrence."""
    distinct, inverse = torch.unique(ids, return_inverse=True)
    first = torch.full((len(distinct),), len(ids), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(ids)), "amin")
    return distinct[first.argsort()]


def _stack_masks(
    ids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, shape: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the distinct ids in order of first sight, bool [ids, *shape]: each id's cells)."""
    order = _first_seen(ids)
    lookup = torch.empty(int(order.max()) + 1 if len(order) else 0, dtype=torch.long)
    lookup[order] = torch.arange(len(order))
    masks = torch.zeros((len(order), *shape), dtype=torch.bool)
    masks[lookup[ids], rows, cols] = True
    return order, masks


def mask_entries(
    layouts: Sequence[Marks], offsets: Sequence[int], shape: tuple[int, ...], index: KeyIndex
) -> dict[tuple[str, str], Entry]:
    """``{(path, donor): {"rows": mask, "slices": {slice index: mask}}}`` of the rows whose
    layouts and padding offsets are given, in order of first marking; built with a few tensor
    operations per batch (no loop over cells), and equal masks are one tensor (a graft of
    whole layers marks the same cells at every site)."""
    flats = [_flat(layout, index) for layout in layouts]
    offs = torch.tensor(list(offsets), dtype=torch.long)

    def cells(kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = [getattr(f, kind + "keys") for f in flats]
        pos = [getattr(f, kind + "positions") for f in flats]
        counts = torch.tensor([len(k) for k in ids], dtype=torch.long)
        rows = torch.arange(len(flats)).repeat_interleave(counts)
        if not len(rows):
            empty = torch.empty(0, dtype=torch.long)
            return empty, empty, empty
        return torch.cat(ids), rows, torch.cat(pos) + offs.repeat_interleave(counts)

    keys, key_masks = _stack_masks(*cells(""), shape)
    slice_keys, slice_masks = _stack_masks(*cells("slice_"), shape)
    every = torch.cat([key_masks, slice_masks]).flatten(1)
    distinct, which = (torch.unique(every, dim=0, return_inverse=True) if len(every)
                       else (every, torch.empty(0, dtype=torch.long)))  # fmt: skip
    one = [m.reshape(shape).clone() for m in distinct]  # one tensor per distinct mask
    entries: dict[tuple[str, str], Entry] = {}
    for j, k in enumerate(keys.tolist()):
        entries[index.keys[k]] = {"rows": one[which[j]], "slices": {}}
    for j, sk in enumerate(slice_keys.tolist()):
        k, s = divmod(sk, 3)
        entries[index.keys[k]]["slices"][s] = one[which[len(keys) + j]]
    return entries
