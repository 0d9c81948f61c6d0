"""One donor finetuned on its own, as ``graft-exp finetune`` trains it: the plan of a
:class:`~graft.study.specs.donor.DonorRequest` (nothing written), and its finetune into the
folder the experiments look in."""

from __future__ import annotations

from pathlib import Path

from graft.models import resolve_device
from graft.study.planning.device_memory import device_memory
from graft.study.planning.finetune_plan import (
    FinetunePlan,
    check_family,
    finetune_lines,
    plan_donor,
    scratch_workspace,
)
from graft.study.planning.run_plan import check_fits
from graft.study.specs.donor import DonorRequest
from graft.study.training.finetune import finetune
from graft.study.training.workspace import Workspace


def plan_donor_job(
    request: DonorRequest, workspace: str | None = None, out: Path | None = None
) -> FinetunePlan:
    """The plan of ``request``'s donor in ``workspace`` (None: the default one; its dataset
    generated into a scratch folder if the workspace lacks it; nothing written there), into
    ``out`` (None: the workspace's folder)."""
    with scratch_workspace(workspace) as ws:
        what = f"{request.model} ({request.variant!r} data)"
        return plan_donor(request, workspace=ws, out=out, what=what)


def donor_job_lines(
    request: DonorRequest, workspace: str | None = None, out: Path | None = None
) -> list[str]:
    """What ``--dry-run`` prints of ``request``: its plan against the device's free
    memory (the memory :func:`run_donor_job` checks it against)."""
    plan = plan_donor_job(request, workspace, out)
    return finetune_lines(plan, device_memory(request.device))


def run_donor_job(
    request: DonorRequest,
    workspace: str | None = None,
    out: Path | None = None,
    check_memory: bool = True,
    quiet: bool = False,
) -> Path:
    """Finetune ``request``'s donor (resumed if interrupted, returned as is if finished)
    into ``out`` (None: ``workspace``'s folder, where the experiments look); return its
    folder. ``check_memory``: refuse a plan that does not fit the device's free memory
    first, before the model loads.

    Raises:
        MemoryPlanError: the plan does not fit (with the setting that makes it fit).
        DeviceError: this machine has no such device (before anything is written).
    """
    resolve_device(request.device)
    check_family(request.model)  # also where the memory plan is skipped
    if check_memory:
        check_fits(plan_donor_job(request, workspace, out), device_memory(request.device))
    home = Workspace.at(workspace)
    donor = home.locate_donor(request)
    # donor.config has the generic corpus fixed: the folder an experiment looks in
    return finetune(
        request.model,
        donor.dataset_dir,
        donor.path if out is None else out,
        donor.config,
        train_set=donor.train_set,
        device=request.device,
        quiet=quiet,
        lock_dir=home.lock_dir,
        corpus_dir=home.corpus_dir,
    )
