"""The options of a tiny experiment run that the study tests share (tiny-llama, one or two
templates, a few prompts, few bootstrap resamples, no progress bars), and running one with
a donor folder as ``sft``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from graft.study.running.runner import (
    ExperimentConfig,
    ModelSource,
    NamedGraft,
    RunRequest,
    run_experiment,
)
from graft.study.specs.grafts import reference

#: PRE (grafting nothing) and SFT (everything from the donor ``sft``), the runs' references
REFERENCES = [reference("PRE", None), reference("SFT", "sft")]
TINY_RUN = dict(
    experiment="custom",
    model="tiny-llama",
    templates=("headline",),
    n=2,
    batch_size=4,
    device="cpu",
    n_boot=20,
    progress=False,
)


def tiny_config(out: Path | str, **options) -> ExperimentConfig:
    """:data:`TINY_RUN` writing to ``out``, ``options`` over it."""
    return ExperimentConfig(**(TINY_RUN | {"out": str(out)} | options))


def run_with_donor(
    cfg: ExperimentConfig,
    grafts: Sequence[NamedGraft],
    donor_path: str,
    echo: Callable[[str], None] | None = None,
):
    """Run ``cfg``'s ``grafts`` with the model at ``donor_path`` as the donor ``sft``, quietly
    unless ``echo`` is given."""
    request = RunRequest(specs=cfg, grafts=grafts, donors={"sft": ModelSource(path=donor_path)})
    return run_experiment(request, echo=echo or (lambda _: None))
