"""One run of grafts, typed: everything :func:`~graft.study.running.runner.run_experiment` and
:func:`~graft.study.planning.run_plan.plan_experiment` take, in one object a design builds
and a researcher can build by hand."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graft.study.specs.config import ExperimentConfig, ModelSource
from graft.study.specs.grafts import NamedGraft
from graft.study.specs.run import RunSpecs, resolve

if TYPE_CHECKING:
    from graft.core.execution.executor import Executor
    from graft.study.running.analysis import BatchAnalysis


@dataclass(frozen=True)
class RunRequest:
    """One run: named grafts on a base model's test prompts, with their donors.

    Args:
        specs: the run's options, resolved (an :class:`ExperimentConfig` given here is
            resolved on construction, every default applied once).
        grafts: the named grafts (unique names within a group).
        base: where the base model comes from (default: the pretrained model).
        donors: donor name (as the specs name it, e.g. ``sft``) -> where it comes from.
        data_direction: the direction of the generated dataset the test prompts come from
            (``one`` or ``both``).
        extra_config: more entries for the stored ``config.json``.
        out_tag: a part of the default run folder's name.
        analyses: per-batch analyses computed and stored beside the examples, each with its
            own table (:class:`~graft.study.running.analysis.BatchAnalysis`, e.g. the logit
            lens); their ``finish`` results are ``ExperimentRun.analyses``.
        executor: where the engine runs the rows (None: this machine's, or the remote one
            of the specs), e.g. a patching sweep's executor.
    """

    specs: RunSpecs
    grafts: tuple[NamedGraft, ...]
    base: ModelSource = ModelSource()  # noqa: RUF009 - frozen dataclass
    donors: Mapping[str, ModelSource] = field(default_factory=dict)
    data_direction: str = "one"
    extra_config: Mapping[str, Any] = field(default_factory=dict)
    out_tag: str = ""
    analyses: tuple[BatchAnalysis, ...] = ()
    executor: Executor | None = None

    def __post_init__(self) -> None:
        specs: ExperimentConfig | RunSpecs = self.specs
        object.__setattr__(self, "specs", resolve(specs))
        object.__setattr__(self, "grafts", tuple(self.grafts))
        object.__setattr__(self, "donors", dict(self.donors))
        object.__setattr__(self, "extra_config", dict(self.extra_config))
        object.__setattr__(self, "analyses", tuple(self.analyses))
