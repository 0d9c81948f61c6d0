"""A model's modules by path, each tree walked once (:func:`module_table`, and
:func:`tables_once` for a run that asks for the same models' modules batch after batch), and
the donor modules a batch's patches call (:func:`donor_modules`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from torch import nn

from graft.core.families.wrapping import unwrap
from graft.core.planning.plan import SitePatch
from graft.errors import SpecError

#: A model's modules by path (:func:`module_table`).
ModuleTable = Mapping[str, nn.Module]


def module_table(model: nn.Module) -> dict[str, nn.Module]:
    """Every submodule of ``model`` by path (one walk of the tree, where ``get_submodule``
    walks the path of each module asked for)."""
    return dict(unwrap(model).named_modules())


def tables_once() -> Callable[[nn.Module], ModuleTable]:
    """A :func:`module_table` lookup that walks each model's tree once (it holds the models
    it has seen, so their ids stay theirs)."""
    tables: dict[int, tuple[nn.Module, ModuleTable]] = {}

    def table_of(model: nn.Module) -> ModuleTable:
        hit = tables.get(id(model))
        if hit is None:
            hit = tables[id(model)] = (model, module_table(model))
        return hit[1]

    return table_of


def donor_modules(
    donors: Mapping[str, nn.Module | None],
    patches: Sequence[SitePatch],
    table_of: Callable[[nn.Module], ModuleTable] | None = None,
) -> dict[str, nn.Module]:
    """``{"donor:path": the donor's module at path}`` for every patch; ``table_of`` gives a
    model's :func:`module_table` (default: each model's made once for this call)."""
    lookup = table_of if table_of is not None else tables_once()
    mods = {}
    for p in patches:
        key = f"{p.donor}:{p.path}"
        if key not in mods:
            if donors.get(p.donor) is None:
                raise SpecError(
                    f"the graft uses donor {p.donor!r} but its weights were not given; pass "
                    "the model in donors={...}"
                )
            donor = unwrap(donors[p.donor])
            mods[key] = lookup(donor)[p.path]
    return mods
