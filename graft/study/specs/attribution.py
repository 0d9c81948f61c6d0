"""What an attribution run is, typed once: the models, the prompts (given, or a dataset's),
the kinds, the measure and the real grafts that check the estimates
(:func:`~graft.study.designs.attribution.run_attribution` runs it)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from graft.core import ATTRIBUTION_METRICS, DEFAULT_KINDS, ESTIMATORS
from graft.errors import ExperimentError

#: the test template whose prompts a dataset gives by default
DEFAULT_TEMPLATE = "headline"


@dataclass(frozen=True)
class AttributionRequest:
    """Every cell's graft effect estimated (:func:`graft.attribute`), some grafted for real.

    The fields are named as ``graft-exp attribution``'s parameters (and ``config.json``'s
    options), so the command hands its values over as they are.

    Args:
        donor: the donor (finetuned) model: registry name or folder.
        texts: the prompts (a string: one prompt; likewise targets, entity and kinds).
        targets: the target after each prompt, e.g. ``" Tracey Childs"`` (its first token is
            scored): one per text, or one for all (a string: one).
        entity: the first entity of each text (a substring of it), the FE unit: one per
            text, or none (the only unit is then LT).
        base: the base model: registry name or folder.
        kinds: module kinds as specs name them (empty: :data:`graft.core.DEFAULT_KINDS`).
        metric: what is estimated: ``logprob`` (the target's first-token log-prob) or
            ``logit`` (its raw logit).
        estimator: how attention cells are estimated (:data:`graft.core.ESTIMATORS`):
            ``local`` (the attention block's exact change, linear downstream) or ``linear``
            (first order in each module's output change).
        verify: the top cells of each prompt grafted for real (0: none; None: every cell).
        multi_cell: also graft multi-cell sets for real (each whole layer; FE, LT, FE+LT in
            every layer) against the sum of their cells' estimates.
        dataset: instead of texts, targets and entity: a dataset folder whose stored forward
            test prompts of ``template`` give them (:func:`graft.study.entity_prompts`).
        template: with ``dataset``: the test template whose prompts are taken, or several,
            comma-separated (``"headline,qa,movie"``), their prompts in that order.
        n_prompts: with ``dataset``: the first ``n_prompts`` prompts of each template, in file
            order (None: all).

    Raises:
        ExperimentError: prompts given twice or not at all, counts of targets or entities
            that do not match the texts, an entity not in its text, ``template`` or
            ``n_prompts`` without a dataset, an unknown metric or estimator, a negative
            ``verify``.
    """

    donor: str
    texts: Sequence[str] = ()
    targets: Sequence[str] = ()
    entity: Sequence[str] = ()
    base: str = "smollm2-135m"
    kinds: Sequence[str] = DEFAULT_KINDS
    metric: str = "logprob"
    estimator: str = "local"
    verify: int | None = 0
    multi_cell: bool = False
    dataset: str | os.PathLike[str] | None = None
    template: str = DEFAULT_TEMPLATE
    n_prompts: int | None = None

    def __post_init__(self) -> None:
        # normalised in place (frozen: through object.__setattr__): tuples, a folder's text
        for name in ("texts", "targets", "entity", "kinds"):
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))
        object.__setattr__(self, "kinds", self.kinds or DEFAULT_KINDS)
        if self.dataset is not None:
            object.__setattr__(self, "dataset", os.fspath(self.dataset))
        self._check_prompts()
        if self.metric not in ATTRIBUTION_METRICS:
            raise ExperimentError(
                f"metric {self.metric!r}: choose {' or '.join(ATTRIBUTION_METRICS)}", param="metric"
            )
        if self.estimator not in ESTIMATORS:
            raise ExperimentError(
                f"estimator {self.estimator!r}: choose {' or '.join(ESTIMATORS)}",
                param="estimator",
            )
        if self.verify is not None and (type(self.verify) is not int or self.verify < 0):
            raise ExperimentError(
                f"verify={self.verify!r}: give a number of cells per prompt (0: none), or "
                "None for every cell",
                param="verify",
            )
        if self.n_prompts is not None and self.n_prompts < 1:
            raise ExperimentError(
                f"n_prompts={self.n_prompts}: give 1 or more prompts, or None for all",
                param="n_prompts",
            )

    def _check_prompts(self) -> None:
        """The prompts come from exactly one place, and the given ones fit together."""
        if self.dataset is not None:
            if self.texts or self.targets or self.entity:
                raise ExperimentError(
                    "dataset takes the prompts from the dataset: drop texts, targets and entity",
                    param="dataset",
                    params=("texts", "targets", "entity"),
                )
            return
        if self.n_prompts is not None or self.template != DEFAULT_TEMPLATE:
            raise ExperimentError(
                "template and n_prompts choose a dataset's prompts: add dataset",
                params=("template", "dataset"),
            )
        if not self.texts or not self.targets:
            raise ExperimentError(
                "give the prompts: texts and targets (repeat), or dataset",
                params=("texts", "targets", "dataset"),
            )
        n = len(self.texts)
        if len(self.targets) not in (1, n):
            raise ExperimentError(f"targets: one per text ({n}), or one for all", param="targets")
        if self.entity and len(self.entity) != n:
            raise ExperimentError(f"entity: one per text ({n})", param="entity")
        for text, name in zip(self.texts, self.entity, strict=False):
            if name not in text:
                raise ExperimentError(
                    f"entity {name!r} does not occur in text {text!r}", param="entity"
                )
