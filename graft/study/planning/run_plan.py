"""The plan of a command before anything heavy is loaded: models and dtypes, the finetunes
it needs (texts, steps, a rough duration, their memory), its rows and batches, the grafting
memory, the device's free memory, whether it fits, and the setting that makes it fit. A
remote run's plan says what stays here (its finetunes, its models loaded, no grafting pass)
and what the server runs and is sent (:mod:`graft.study.planning.remote_plan`).

``graft-exp <command> --dry-run`` prints it (:meth:`ExperimentPlan.lines`; a lone
finetune's, :func:`graft.study.planning.finetune_plan.finetune_lines`);
:func:`graft.study.running.runner.run_experiment` checks it before loading anything
(:func:`check_fits`) unless ``skip_memory_check``. Nothing here writes to the workspace: a
dataset not generated yet is generated into a temporary folder, read and removed; the
donors' folders are only looked at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from graft.errors import MemoryPlanError
from graft.models import resolve_dtype
from graft.models.configs import FoundConfig, local_tokenizer
from graft.models.hub import hub_reachable
from graft.models.registry import resolve_model_name
from graft.study.data import rows as checked_rows
from graft.study.planning.device_memory import DeviceMemory, device_memory, needed_bytes, verdict
from graft.study.planning.finetune_plan import (
    FinetunePlan,
    Lengths,
    PlanWorkspace,
    finetune_fix,
    fixes_of,
    found_config,
    plan_donor,
    scratch_workspace,
    verdict_lines,
)
from graft.study.planning.memory import (
    MemoryPlan,
    count_text,
    describe,
    estimate_grafting_bytes,
    gib,
)
from graft.study.planning.model_size import DTYPE_BYTES, model_size, precision_name
from graft.study.planning.remote_plan import (
    RemotePlan,
    plan_remote,
    planned_model_key,
)
from graft.study.planning.row_counts import count_rows
from graft.study.specs.config import ModelSource, Replicate
from graft.study.specs.request import RunRequest
from graft.study.specs.run import RunSpecs
from graft.study.training.sources import donor_request, needs_finetune


@dataclass
class ExperimentPlan:
    """What an experiment run will do and need.

    Args:
        experiment: its name.
        model: the base model and where its config came from.
        device: the device's memory.
        dtype: the dtype the models run in.
        prompts: test prompts of the first replicate.
        grafts: grafts per replicate.
        rows: (prompt, graft) rows of all replicates.
        batches: stored batches of all replicates.
        batch_size: rows per forward pass.
        replicates: replicates (seed pairs, control models).
        length: the longest prompt.
        finetunes: the finetunes it needs first (finished ones included).
        grafting: the grafting run's memory (None when the grafts run on a server).
        n_donors: donor models held while grafting.
        counted: rows counted on the tokenized prompts (else on the stored fields).
        model_here: the model is on this machine (not only its published config).
        fixes: what makes it fit when it does not, in parameter words.
        remote: the server's part of a remote run (None: every pass runs here).
        held: a remote run's models loaded here (base and donors' weights), in bytes.
        skipped: why the first replicate's rows are fewer than prompts x grafts
            (:func:`~graft.study.data.rows.skipped_note`; ``""`` when none is skipped).
        folder: what the run does to its run folder (new, resumed, overwritten) or why it
            would stop there (:func:`~graft.study.running.runner.folder_line`; ``""``: none).
    """

    experiment: str
    model: str
    device: DeviceMemory
    dtype: str
    prompts: int
    grafts: int
    rows: int
    batches: int
    batch_size: int
    replicates: int
    length: Lengths
    finetunes: list[FinetunePlan]
    grafting: MemoryPlan | None
    n_donors: int
    counted: bool
    model_here: bool = True
    fixes: list[str] = field(default_factory=list)
    remote: RemotePlan | None = None
    held: int = 0
    skipped: str = ""
    folder: str = ""

    @property
    def pending(self) -> list[FinetunePlan]:
        return [f for f in self.finetunes if not f.finished]

    @property
    def needed(self) -> int:
        """The most it needs at once: a finetune (with the model held meanwhile) or grafting."""
        parts = [f.needed for f in self.pending]
        if self.grafting is not None:
            parts.append(needed_bytes(self.grafting, self.device.device.split(":")[0]))
        return max([*parts, self.held], default=0)

    @property
    def verdict(self) -> str:
        return verdict(self.needed, self.device)

    def lines(self) -> list[str]:
        about = "" if self.counted else "about "
        out = [
            f"plan of {self.experiment} (nothing loaded, nothing written):",
            f"model: {self.model}, {self.dtype} on {self.device.device}",
            f"rows: {about}{self.prompts} prompts x {self.grafts} grafts"
            + (f" x {self.replicates} replicates" if self.replicates > 1 else "")
            + f" = {about}{self.rows} rows{self.skipped} in {self.batches} batches of "
            f"{self.batch_size}; longest prompt {self.length.words()}",
        ]
        if self.folder:
            out.append(self.folder)
        if self.remote is not None:
            out.append(self._here_line())
        for plan in self.finetunes:
            out += plan.lines()
        if self.remote is not None:
            out += self.remote.lines()
        elif self.grafting is not None:
            out.append(
                f"grafting (base + {count_text(self.n_donors, 'donor')}): {describe(self.grafting)}"
            )
        out.append(f"device: {self.device.describe()}")
        return out + verdict_lines(self.needed, self.device, self.fixes)

    def _here_line(self) -> str:
        """What a remote run does on this machine."""
        first = f"{count_text(len(self.pending), 'finetune')} (below), then "
        donors = count_text(self.n_donors, "donor")
        why = "to plan the batches and send the donor modules"
        if self.remote is not None and self.remote.donor_mode == "hosted":
            why = "to plan the batches (hosted mode loads the donors too; only names travel)"
        return (
            f"on this machine: {first if self.pending else ''}the base and {donors} loaded "
            f"({gib(self.held)} of {self.dtype} weights) {why}; no grafting pass runs here"
        )


def check_fits(plan: ExperimentPlan | FinetunePlan, memory: DeviceMemory | None = None) -> None:
    """Raise :class:`~graft.errors.MemoryPlanError` when ``plan`` does not fit the device
    (an unreadable free memory, or a tight fit, passes; so does a model that is neither on
    this machine nor downloadable now: loading it says so, the more useful error).

    Raises:
        MemoryPlanError: one line with the need, the free memory, the fix and the override.
    """
    memory = memory or (plan.device if isinstance(plan, ExperimentPlan) else None)
    if isinstance(plan, FinetunePlan) and plan.finished:
        return  # nothing to train
    if memory is None or not (plan.model_here or hub_reachable()):
        return
    needed = plan.needed
    if verdict(needed, memory) != "does not fit":
        return
    fixes = plan.fixes if isinstance(plan, ExperimentPlan) else fixes_of(plan, memory)
    raise MemoryPlanError(
        f"this run needs about {gib(needed)} but {memory.describe()}; {'; '.join(fixes)}; "
        "or skip_memory_check to try anyway"
    )


def plan_experiment(
    request: RunRequest, *, data: Mapping[int, Path] | None = None
) -> ExperimentPlan:
    """The plan of :func:`graft.study.running.runner.run_experiment` of ``request``, without
    loading a model; ``data``: the test prompts' dataset folder of each data seed, where the
    run has them."""
    run, grafts, base = request.specs, request.grafts, request.base
    donors, data_direction = dict(request.donors), request.data_direction
    checked_rows.check_grafts(grafts, donors)  # what the run refuses first, the plan too
    device = device_memory(run.execution.device)
    dtype = str(resolve_dtype(run.execution.dtype, run.execution.device)).removeprefix("torch.")
    found = found_config(run.donors.model)
    tokenizer = local_tokenizer(run.donors.model)
    with scratch_workspace(run.execution.workspace) as ws:
        counts = count_rows(run, grafts, data_direction, data or {}, ws, tokenizer, found)
        weights = model_size(found.config).n_params * DTYPE_BYTES[precision_name(dtype)]
        finetunes = _finetunes(run, base, donors, ws, weights)
    n_donors = len({*donors.values()} - {base})
    grafting, remote, held = None, None, 0
    server = run.execution.remote_run
    if server is not None and server.mode == "remote":
        remote = plan_remote(
            server,
            found.config,
            dtype,
            grafts,
            counts.shapes,
            counts.length.tokens,
            planned_model_key(server, _hub_id(run, base), _base_words(run, base)),
        )
        if run.analysis.score_full_name:
            remote.notes.append(
                "score_full_name adds requests of its own (a row per name token after the "
                "first), not counted here"
            )
        held = (1 + n_donors) * weights
    else:  # a simulated remote run runs its passes here, as a local one
        grafting = estimate_grafting_bytes(
            found.config,
            dtype=dtype,
            batch_size=min(run.execution.batch_size, counts.rows or 1),
            seq_len=counts.length.tokens,
            n_donors=n_donors,
        )
    plan = ExperimentPlan(
        experiment=run.experiment,
        model=f"{run.donors.model} ({found.origin})",
        device=device,
        dtype=dtype,
        prompts=counts.prompts,
        grafts=len(grafts),
        rows=counts.all_rows,
        batches=counts.batches,
        batch_size=run.execution.batch_size,
        replicates=len(run.replicates),
        length=counts.length,
        finetunes=finetunes,
        grafting=grafting,
        n_donors=n_donors,
        counted=tokenizer is not None,
        model_here=found.local,
        remote=remote,
        held=held,
        skipped=counts.skipped,
    )
    plan.fixes = _experiment_fixes(plan, run, found)
    return plan


def _hub_id(run: RunSpecs, base: ModelSource) -> str | None:
    """The base's hub id, as a remote run derives its model key from it; None when the run
    loads the base from a folder (a finetune, a path, an embedded or tiny model)."""
    if base.path or needs_finetune(base):
        return None
    source, location = resolve_model_name(run.donors.model)
    return location if source == "hub" else None


def _base_words(run: RunSpecs, base: ModelSource) -> str:
    if base.path:
        return f"the folder {base.path}"
    if needs_finetune(base):
        return f"the {base.variant!r} finetune's folder"
    return repr(run.donors.model)


def _finetunes(
    run: RunSpecs,
    base: ModelSource,
    donors: Mapping[str, ModelSource],
    ws: PlanWorkspace,
    held: int,
) -> list[FinetunePlan]:
    """The finetunes of every replicate's finetune variants (as the run locates them)."""
    out = []
    for rep in run.replicates:
        for source in dict.fromkeys([base, *donors.values()]):
            if needs_finetune(source):
                out.append(_donor_plan(run, source, rep, ws, held))
    return out


def _donor_plan(
    run: RunSpecs, source: ModelSource, rep: Replicate, ws: PlanWorkspace, held: int
) -> FinetunePlan:
    which = f" (finetune seed {rep.finetune_seed}, data seed {rep.train_data_seed})"
    return plan_donor(
        donor_request(run, source, rep),
        workspace=ws,
        held_bytes=held,
        what=f"the {source.variant!r} model" + (which if run.replicated else ""),
    )


def _experiment_fixes(plan: ExperimentPlan, run: RunSpecs, found: FoundConfig) -> list[str]:
    """For each part of ``plan`` that does not fit the device (a finetune, grafting): the
    setting that makes it fit, in parameter words, or that none does."""
    fixes = []
    too_big = [f for f in plan.pending if verdict(f.needed, plan.device) != "fits"]
    if too_big:
        fixes.append(finetune_fix(too_big[0], plan.device, presets_only=True))
    if plan.grafting is not None and verdict(plan.grafting.peak_bytes, plan.device) != "fits":
        fixes.append(_grafting_fix(plan, found))
    if plan.remote is not None and verdict(plan.held, plan.device) != "fits":
        fixes.append(
            f"the models a remote run loads here take about {gib(plan.held)}: a smaller dtype, "
            "or a device with more free memory"
        )
    return fixes


def _grafting_fix(plan: ExperimentPlan, found: FoundConfig) -> str:
    """The first of bfloat16, then smaller batches, that makes grafting fit; or that none
    does."""
    assert plan.grafting is not None
    options = []
    if plan.dtype in ("float32", "float64"):
        options.append(("bfloat16", plan.batch_size))
    size = plan.batch_size // 2
    while size >= 1:
        options.append((plan.dtype, size))
        size //= 2
    for dtype, batch in options:
        memory = estimate_grafting_bytes(
            found.config,
            dtype=dtype,
            batch_size=batch,
            seq_len=plan.length.tokens,
            n_donors=plan.n_donors,
        )
        if verdict(memory.peak_bytes, plan.device) == "fits":
            change = f"dtype={dtype!r}" if dtype != plan.dtype else f"batch_size={batch}"
            return f"to fit grafting: {change} ({gib(memory.peak_bytes)})"
    return (
        f"grafting needs about {gib(plan.grafting.peak_bytes)} and no setting here makes it "
        "fit: use a device with more free memory, or run the grafts remotely"
    )
