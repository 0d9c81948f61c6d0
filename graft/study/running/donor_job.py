"""One donor finetuned on its own, as ``graft-exp finetune`` trains it: a typed request,
its plan (nothing written), and the finetune into the folder the experiments look in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graft.study.planning.device_memory import device_memory
from graft.study.planning.finetune_plan import FinetunePlan, plan_donor, scratch_workspace
from graft.study.planning.run_plan import check_fits
from graft.study.specs.presets import FinetuneConfig
from graft.study.training.finetune import finetune
from graft.study.training.workspace import Workspace


@dataclass(frozen=True)
class DonorRequest:
    """A donor to finetune: the model, the data it learns, the settings.

    Args:
        model: the pretrained model (registry name, hub id or folder).
        dataset: a data kind (generated into the workspace) or a dataset folder.
        variant: the data variant (``one``, ``both``, ``task``, ``both-A``, ...).
        config: the finetune settings (a preset with its overrides).
        n_facts: facts per set of a generated dataset (None: the kind's default).
        data_seed: the generated dataset's seed.
        shuffle: how ``real_movies_shuffled`` shuffles the real casts.
        device: the device (None: CUDA if available, else the CPU).
        workspace: where datasets and donors live (None: the default workspace).
        out: the donor's folder (None: the workspace's, where the experiments look).
    """

    model: str
    dataset: str
    variant: str
    config: FinetuneConfig
    n_facts: int | None = None
    data_seed: int = 0
    shuffle: str = "relations"
    device: str | None = None
    workspace: str | None = None
    out: Path | None = None


def plan_donor_job(request: DonorRequest) -> FinetunePlan:
    """The plan of ``request`` (its dataset generated into a scratch folder if the
    workspace lacks it; nothing written to the workspace)."""
    with scratch_workspace(request.workspace) as ws:
        return plan_donor(
            request.model,
            request.dataset,
            request.variant,
            request.config,
            workspace=ws,
            n_facts=request.n_facts,
            data_seed=request.data_seed,
            shuffle=request.shuffle,
            device=request.device,
            out=request.out,
            what=f"{request.model} ({request.variant!r} data)",
        )


def finetune_donor(request: DonorRequest, check_memory: bool = True, quiet: bool = False) -> Path:
    """Finetune ``request``'s donor (resumed if interrupted, returned as is if finished);
    return its folder. ``check_memory``: refuse a plan that does not fit the device's free
    memory first, before the model loads.

    Raises:
        MemoryPlanError: the plan does not fit (with the setting that makes it fit).
    """
    if check_memory:
        check_fits(plan_donor_job(request), device_memory(request.device))
    home = Workspace.at(request.workspace)
    donor = home.locate_donor(
        request.model,
        request.dataset,
        request.variant,
        request.config,
        n_facts=request.n_facts,
        data_seed=request.data_seed,
        shuffle=request.shuffle,
        device=request.device,
    )
    # donor.config has the generic corpus fixed: the folder an experiment looks in
    return finetune(
        request.model,
        donor.dataset_dir,
        donor.path if request.out is None else request.out,
        donor.config,
        train_set=donor.train_set,
        device=request.device,
        quiet=quiet,
        lock_dir=home.lock_dir,
        corpus_dir=home.corpus_dir,
    )
