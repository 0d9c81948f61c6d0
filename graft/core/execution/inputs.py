"""What :func:`graft.core.execution.engine.run_grafts` accepts as models and rows: a model given as
an HF causal LM, its nnsight wrapper or a loaded-model record; donors given as one model, a
mapping or names; and the checks of rows and donors against the base before any compute."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import nn

from graft.core.families.arch import check_compatible, context_length
from graft.core.families.wrapping import unwrap
from graft.core.planning.plan import GraftRow
from graft.errors import SpecError


def is_loaded(model) -> bool:
    """Whether ``model`` is a loaded-model record (``.model`` module and ``.tokenizer``)."""
    return (
        not isinstance(model, nn.Module)
        and isinstance(getattr(model, "model", None), nn.Module)
        and hasattr(model, "tokenizer")
    )


def model_of(model):
    """The model itself when given a loaded model (``graft.models.LoadedModel``)."""
    return model.model if is_loaded(model) else model


def as_donors(donors) -> dict:
    """``{name: model}`` from a mapping, one model (named ``"sft"``), ``None`` (no donors)
    or donor names (``{name: None}``: weights held elsewhere, e.g. by a server); loaded
    models (``graft.models.LoadedModel``) are unwrapped."""
    if donors is None:
        return {}
    if isinstance(donors, nn.Module) or is_loaded(donors) or hasattr(donors, "trace"):
        donors = {"sft": donors}
    elif isinstance(donors, str):
        donors = {donors: None}
    elif not isinstance(donors, Mapping):
        names = as_list(donors)
        if not names or not all(isinstance(n, str) for n in names):
            raise SpecError(
                f"donors must be a model, a {{name: model}} mapping or donor names, not "
                f"{type(donors).__name__}"
            )
        donors = dict.fromkeys(names)
    return {name: model_of(d) for name, d in donors.items()}


def as_list(items) -> list | None:
    """``list(items)``, or ``None`` for something that is not iterable."""
    try:
        return list(items)
    except TypeError:
        return None


def check_lengths(model: nn.Module, rows: Sequence[GraftRow]) -> None:
    """Refuse prompts longer than the positions the model was built for (GPT-2's learned
    positions would fail mid-run with an IndexError)."""
    limit = context_length(model)
    for i, row in enumerate(rows):
        if limit is not None and len(row.input_ids) > limit:
            raise SpecError(
                f"prompt {i} has {len(row.input_ids)} tokens but the model has only {limit} "
                "positions; shorten the prompt"
            )


def check_donors(torch_base: nn.Module, donors: Mapping[str, nn.Module | None]) -> set[str]:
    """Every donor with weights fits the base. Returns the names of donors that ARE the base."""
    same = set()
    for name, donor in donors.items():
        if donor is None:
            continue
        if unwrap(donor) is torch_base:
            same.add(name)
        check_compatible(torch_base, unwrap(donor), name)
    return same
