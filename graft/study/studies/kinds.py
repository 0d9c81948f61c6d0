"""The experiments a study file may list: each a design function of :mod:`graft.study.designs`
and the options it takes (its keyword arguments after the specs)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from graft.study.designs import (
    component,
    custom,
    hybrid,
    layers,
    lens,
    necessity,
    position,
    tokens,
)
from graft.study.designs.design import Design
from graft.study.specs.run import RunSpecs
from graft.study.training.sources import model_source


@dataclass(frozen=True)
class ExperimentKind:
    """An experiment of a study file.

    Args:
        name: its name in the file (``position``, ``component``, ...).
        build: its design function (resolved specs, then its own options).
    """

    name: str
    build: Callable[..., Design]

    @property
    def options(self) -> tuple[str, ...]:
        """The options its ``[experiments.NAME]`` table takes."""
        return tuple(list(inspect.signature(self.build).parameters)[1:])

    def design(self, specs: RunSpecs, options: Mapping[str, Any]) -> Design:
        """Its design of ``specs`` with ``options`` (model sources given as text, as
        ``custom``'s ``donors = {sft = "one"}`` and ``base = "pretrained"``)."""
        given = dict(options)
        if "donors" in given:
            given["donors"] = {k: model_source(v) for k, v in given["donors"].items()}
        if "base" in given:
            given["base"] = model_source(given["base"], "base")
        return self.build(specs, **given)


#: Experiment name -> its kind, in the order the commands list them.
DESIGNS: dict[str, ExperimentKind] = {
    kind.name: kind
    for kind in (
        ExperimentKind("position", position),
        ExperimentKind("component", component),
        ExperimentKind("necessity", necessity),
        ExperimentKind("hybrid", hybrid),
        ExperimentKind("layers", layers),
        ExperimentKind("tokens", tokens),
        ExperimentKind("lens", lens),
        ExperimentKind("custom", custom),
    )
}
