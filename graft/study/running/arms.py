"""The grafts each replicate of a run runs: the run's own, or for a control replicate their
control twins (the grafts that read a finetuned model, renamed ``<graft> [control]``); the
run's whole graft order; and the checks that finetune seeds, data seeds and control models
have what they replace."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from graft.errors import ExperimentError
from graft.results.compare import CONTROL_SUFFIX, control_name
from graft.study.specs.config import ModelSource, Replicate
from graft.study.specs.grafts import NamedGraft
from graft.study.specs.run import RunSpecs
from graft.study.training.sources import needs_finetune


def check_replicates(
    run: RunSpecs,
    grafts: Sequence[NamedGraft],
    base: ModelSource,
    donors: Mapping[str, ModelSource],
) -> None:
    """Finetune seeds and control models need a model the run finetunes; data seeds and
    control models need a generated dataset (a data kind, not a folder); control twins need
    their names free."""
    finetuned = any(needs_finetune(s) for s in [base, *donors.values()])
    if not finetuned and (len(run.donors.finetune_seeds) > 1 or run.donors.control):
        raise ExperimentError(
            "finetune_seeds and control replace the run's finetuned models, but every model "
            "of this run is pretrained or an explicit folder; give a finetune variant "
            "(ModelSource('one'), ...) or drop them"
        )
    control = run.donors.control
    taken = [g.name for g in grafts if g.name.endswith(CONTROL_SUFFIX)] if control else []
    if taken:
        raise ExperimentError(
            f"graft {taken[0]!r} ends in {CONTROL_SUFFIX.strip()!r}, the mark of the control "
            "twins control adds; rename it"
        )
    several_data = len(run.data.data_seeds) > 1
    if Path(run.data.dataset).is_dir() and (several_data or run.donors.control):
        raise ExperimentError(
            f"data_seeds and control generate datasets of other data seeds, but the dataset "
            f"{run.data.dataset} is a folder; give a data kind as the dataset"
        )


def control_twins(
    grafts: Sequence[NamedGraft], base: ModelSource, donors: Mapping[str, ModelSource]
) -> list[NamedGraft]:
    """The grafts that read a finetuned model (the base, or a donor the spec names), renamed
    ``<name> [control]``: what a control replicate runs (the others would repeat the real
    replicate's rows, e.g. PRE)."""
    if needs_finetune(base):
        uses = list(grafts)
    else:
        finetuned = {n for n, s in donors.items() if needs_finetune(s)}
        uses = [g for g in grafts if g.spec.donors() & finetuned]
    return [replace(g, name=control_name(g.name)) for g in uses]


def replicate_arms(
    run: RunSpecs,
    grafts: Sequence[NamedGraft],
    base: ModelSource,
    donors: Mapping[str, ModelSource],
) -> dict[Replicate, list[NamedGraft]]:
    """Replicate -> the grafts it runs (the control twins for a control replicate)."""
    twins = control_twins(grafts, base, donors) if run.donors.control else []
    return {r: twins if r.control else list(grafts) for r in run.replicates}


def graft_order(
    grafts: Sequence[NamedGraft], arms: Mapping[Replicate, list[NamedGraft]]
) -> list[NamedGraft]:
    """Every graft the run has, each control twin right after its graft."""
    twins = {(g.group, g.name): g for r, gs in arms.items() if r.control for g in gs}
    order = []
    for g in grafts:
        order.append(g)
        twin = twins.get((g.group, control_name(g.name)))
        if twin is not None:
            order.append(twin)
    return order
