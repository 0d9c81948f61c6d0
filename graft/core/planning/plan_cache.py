"""Planning kept across calls: the row layouts (and what else the planner derives from a
row's graft alone) of one base model, reused by every later
:func:`graft.core.execution.engine.run_grafts` call on it with the same donors.

An experiment calls the engine once per stored batch; its prompts repeat a few shapes
(length and spans) under a few grafts, so after the first batches every row's layout is
known. A cache is kept per base model (dropped with it) and per *scope*: how the rows run
(traced, plain, steps on shared prefixes and the prefixes themselves) and on which carrier,
since a row's graft on a carrier depends on that. It is valid only for the same donor models
(held by weak reference and checked by identity) and the same architecture; otherwise the
scope starts afresh.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from graft.core.families.arch import Architecture
from graft.core.families.wrapping import unwrap
from graft.core.planning.plan import LayoutCache


@dataclass
class _Scope:
    """One scope's layouts and what they are valid for.

    Args:
        arch: the base's architecture when the layouts were made.
        donors: each donor name's model (a weak reference), or None for a donor without
            weights.
        layouts: the layouts.
    """

    arch: Architecture
    donors: dict[str, weakref.ref | None]
    layouts: LayoutCache


_CACHES: weakref.WeakKeyDictionary[nn.Module, dict[Hashable, _Scope]] = weakref.WeakKeyDictionary()


def _same_donors(kept: Mapping[str, weakref.ref | None], donors: Mapping[str, Any]) -> bool:
    if kept.keys() != donors.keys():
        return False
    for name, model in donors.items():
        ref = kept[name]
        if (ref is None) != (model is None) or (ref is not None and ref() is not unwrap(model)):
            return False
    return True


def layouts_for(
    base: nn.Module, arch: Architecture, donors: Mapping[str, Any], scope: Hashable
) -> LayoutCache:
    """The layouts of ``scope`` kept for ``base`` (a torch model) with these ``donors``: the
    ones of an earlier call when its donors and architecture were the same, else new ones."""
    scopes = _CACHES.get(base)
    if scopes is None:
        scopes = _CACHES[base] = {}
    kept = scopes.get(scope)
    if kept is None or kept.arch != arch or not _same_donors(kept.donors, donors):
        refs = {n: None if m is None else weakref.ref(unwrap(m)) for n, m in donors.items()}
        kept = scopes[scope] = _Scope(arch, refs, LayoutCache())
    return kept.layouts


def forget_plans(base: nn.Module | None = None) -> None:
    """Drop the kept layouts of ``base`` (of every model when None)."""
    if base is None:
        _CACHES.clear()
    else:
        _CACHES.pop(base, None)
