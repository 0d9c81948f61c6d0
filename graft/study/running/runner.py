"""Run a set of grafts over a dataset's test prompts: the pipeline every experiment shares.

An experiment is a base model, named donor models, a list of named grafts and the prompts
(templates, direction, how many). :func:`run_experiment` validates the inputs, finds or
finetunes the models (:class:`graft.study.training.workspace.Workspace`), tokenizes and samples the
prompts, runs every (prompt, graft) row through the engine batch by batch, and writes
per-example metrics, a summary with confidence intervals, the paired key contrasts
(:func:`graft.results.compare.key_contrasts`) and the drop counts into a resumable run
folder (:class:`graft.results.folder.RunFolder`): batches already stored are skipped, so an
interrupted run continues where it stopped.

A run may have several replicates (:attr:`ExperimentConfig.replicates`: finetune seeds x data
seeds, and control models): each has its own finetuned models (found or made per seed) and
its data seed's prompts, runs every graft (a control replicate: the grafts that read a
finetuned model, renamed ``<graft> [control]``), and stores its batches as
``<replicate label>-<batch>``; the summary adds the mean over replicates.

Everything that can fail on bad input is checked before anything is written or finetuned:
the grafts (unique names, donors given), the device, the run folder (writable, graft's own),
the remote host, the test prompts of the chosen templates, every (prompt, graft) row's spec
against the model, and that no two rows share a (group, graft, template, prompt_id) key.
``config.json`` is written only when the first batch is about to run, and removed again when
a new run stores no batch (its first batch failed), so a failed start leaves the run folder
as it was. Stored batches are checked on resume (:meth:`RunFolder.done_batches`): a damaged
or foreign one is set aside and computed again. Progress goes to the ``logging``
logger of this module (and a tqdm bar); a finetune the run needs first is announced as a
warning with an estimate of its duration. Everything said, with the Trainer's logs, Python's
warnings (each once), the summary and the stage times, also goes to the run folder's
``run.log`` (:mod:`graft.results.run_log`).
Per-batch analyses (``analyses=``, :mod:`graft.study.running.analysis`; the logit lens) run in
the same loop and resume, each storing its frame of every batch, and write their tables last.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from graft.core.families.arch import architecture_of
from graft.core.families.wrapping import unwrap
from graft.errors import ConfigMismatchError, RunFolderError
from graft.models import LoadedModel, context_length, load_model, resolve_device
from graft.results.folder import RunFolder
from graft.results.provenance import machine_info
from graft.results.record import RunRecord
from graft.results.run_log import LOG_NAME, RunLog, echo_and_log, file_only
from graft.storage.failures import resumable
from graft.storage.locks import exclusive, writable_lock_dir
from graft.study.data.dataset_folder import check_facts
from graft.study.data.rows import (
    check_grafts,
    check_row_keys,
    check_rows,
    check_span_names,
    load_examples,
    plan_rows,
    sample_examples,
    warn_empty_grafts,
)
from graft.study.planning.finetune_plan import check_family
from graft.study.planning.run_plan import check_fits, plan_experiment
from graft.study.running.analysis import FinishedRun
from graft.study.running.arms import check_replicates, graft_order, replicate_arms
from graft.study.running.batches import check_analyses, run_batches
from graft.study.running.placement import check_out_placement
from graft.study.running.run_inputs import RunPrompts, load_run_models, planned_paths
from graft.study.running.run_record import (
    check_stored_config,
    engine_entry,
    key_fields,
    run_config,
)
from graft.study.running.summaries import format_summary, print_summary, write_summaries
from graft.study.running.timing import StageTimes
from graft.study.specs.config import ExperimentConfig, ModelSource, Replicate
from graft.study.specs.grafts import NamedGraft
from graft.study.specs.request import RunRequest
from graft.study.specs.run import ExecutionSpec, RunSpecs, default_out
from graft.study.training.recall import check_recall, let_through_line
from graft.study.training.sources import (
    RunPaths,
    dataset_dir,
    needs_finetune,
    pending_finetune,
    replicate_paths,
    resolve_model_path,
)
from graft.study.training.workspace import Workspace

logger = logging.getLogger(__name__)

#: What an experiment script needs, importable from here (defined in the modules named).
__all__ = [
    "ExperimentConfig",
    "ExperimentRun",
    "NamedGraft",
    "RunRequest",
    "ModelSource",
    "check_grafts",
    "check_request",
    "default_out",
    "load_examples",
    "print_summary",
    "resolve_model_path",
    "run_experiment",
    "sample_examples",
]


@dataclass
class ExperimentRun:
    """What an experiment run produced.

    Args:
        folder: the run folder.
        examples: per-(example, graft) metrics.
        summary: per-(group, template, graft) summary with CIs.
        drops: drop report per template.
        config: the resolved config stored in ``config.json``.
        times: wall seconds per stage of this invocation.
        computed: table name (``examples`` and each analysis's) -> the batch ids this
            invocation computed.
        analyses: each analysis's table name -> what its ``finish`` returned.
    """

    folder: RunFolder
    examples: pl.DataFrame
    summary: pl.DataFrame
    drops: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    times: StageTimes = field(default_factory=StageTimes)
    computed: dict[str, list[str]] = field(default_factory=dict)
    analyses: dict[str, Any] = field(default_factory=dict)

    @property
    def record(self) -> RunRecord:
        """``config`` read as the typed record (:class:`graft.results.RunRecord`)."""
        return RunRecord.from_json(self.config)


def _check_remote(execution: ExecutionSpec) -> None:
    if execution.remote is not None:
        from graft.remote.client import check_reachable

        check_reachable(execution.remote)


# ------------------------------------------------------------------------------- run


def run_experiment(
    request: RunRequest, *, echo: Callable[[str], None] | None = None
) -> ExperimentRun:
    """Run ``request``'s grafts on its test prompts; resumable. See the module docstring.

    With several replicates (finetune seeds, data seeds, control models;
    :attr:`ExperimentConfig.replicates`) every graft runs once per replicate, on that
    replicate's models and its data seed's prompts (control replicates run the grafts that
    read a finetuned model, renamed ``<graft> [control]``); every row records its
    ``data_seed`` and ``finetune_seed``, and the summary adds the mean over replicates.

    Args:
        request: the run (:class:`~graft.study.specs.request.RunRequest`: specs, grafts,
            base and donors, analyses, executor).
        echo: where the one-line plan of the run goes (default: this module's logger); it
            goes into the run's ``run.log`` too, with every log line, warning, the summary and
            the stage times (:mod:`graft.results.run_log`).
    """
    run = request.specs  # every default applied once, when the request was made
    times = StageTimes()
    with times.stage("data and checks"):
        check_analyses(request.analyses, run)
        folder, data_paths = _validate(request)
    (echo or logger.info)(folder.state_line(run.execution.overwrite))
    # one process runs a folder at a time: a second command on the same --out waits, then
    # resumes (finding the batches done)
    # a read-only workspace (a store of finished donors) holds no lock: then beside the run
    fallback = folder.path.resolve().parent / ".graft-locks"
    locks = writable_lock_dir(Workspace.at(run.execution.workspace).lock_dir, fallback)
    log = RunLog(folder.path / LOG_NAME)  # held until the folder is started: see run_log
    with (
        log.capture(),
        exclusive(folder.path, f"running {run.experiment} into {folder.path}", locks),
        resumable(),  # a failed write says the rerun resumes
    ):
        return _run_validated(request, folder, data_paths, echo_and_log(echo, logger), times, log)


def _run_validated(
    request: RunRequest,
    folder: RunFolder,
    data_paths: dict[int, Path],
    echo: Callable[[str], None],
    times: StageTimes,
    log: RunLog,
) -> ExperimentRun:
    """:func:`run_experiment` once its inputs are checked and its run folder is locked; the
    run's log written from the moment its folder is started."""
    run, grafts, base = request.specs, request.grafts, request.base
    donors, analyses = dict(request.donors), request.analyses
    with times.stage("data and checks"):
        arms = replicate_arms(run, grafts, base, donors)
        all_grafts = graft_order(grafts, arms)
        # a folder of another configuration is refused before any finetune, by where the
        # models are or will be (the first check, _validate's, had no datasets yet)
        planned = functools.partial(planned_paths, run, base, donors)
        check_stored_config(folder, run, all_grafts, data_paths, planned)
        if not run.execution.skip_memory_check:  # refused before anything loads (run_plan)
            check_fits(plan_experiment(request, data=data_paths))
        probe_path, probe, prompts = _plan(run, grafts, base, donors, data_paths)
    with times.stage("finetuning"):
        paths = _model_paths(run, base, donors, probe)
    # a finetuned model that does not know its facts stops the run before grafting
    recall = check_recall(
        [p for rp in paths.values() for p in rp.all()], run.donors.allow_weak_donor
    )
    for record in recall.values():
        if record["weak"]:
            logger.warning("%s", let_through_line(record))
    loaded = {probe_path: probe}
    with times.stage("loading"):  # checked before anything is written
        first = load_run_models(run.execution, paths[run.replicates[0]], loaded)
    del probe  # the pretrained stand-in is freed unless it is a model of the run
    config = run_config(run, all_grafts, paths, data_paths, dict(request.extra_config))
    config["donor_recall"] = recall
    config["engine"] = engine_entry(run.execution, first)
    config["machine"] = machine_info(resolve_device(run.execution.device))
    arch = architecture_of(unwrap(first.base.model))
    del first
    # everything is checked (write_config itself refuses a mismatching stored config before
    # writing): the first batch is about to run
    old = None if run.execution.overwrite else folder.read_config()
    key = key_fields(run, old)
    existed = folder.path.exists()
    stored = folder.write_config(config, key=key, overwrite=run.execution.overwrite)
    log.start()
    loading = times.seconds["loading"]
    try:
        with times.stage("grafting"):
            computed = run_batches(
                run, folder, arms, prompts, paths, loaded, echo, times, request.executor, analyses
            )
    except BaseException:
        # a new run that stored no batch (say, its remote host failed the first request)
        # leaves the folder as it was, as a start that failed its checks does
        if old is None:
            folder.undo_start(existed)
        raise
    # later replicates' models load inside: count that as loading, not grafting
    times.seconds["grafting"] -= times.seconds["loading"] - loading
    loaded.clear()
    with times.stage("summaries"):
        table, summary = write_summaries(run, folder, all_grafts, prompts)
        done = FinishedRun(run, folder, all_grafts, prompts, arch, computed)
        finished = {a.table: a.finish(done) for a in analyses}
        folder.commit_config()  # a resume's record, once the tables it describes are written
    file_only().info("summary:\n%s", format_summary(summary, digits=None))
    file_only().info("%s", times.line())
    drops = prompts[run.data.data_seed].drops
    return ExperimentRun(folder, table, summary, drops, stored, times, computed, finished)


def folder_line(request: RunRequest) -> str:
    """What the run of ``request`` does to its run folder (new, resumed, overwritten), or why
    :func:`check_request` would stop it there (another configuration's results, a folder
    that is not graft's or cannot be written, one inside the workspace). For a plan: nothing
    is written, and nothing else of ``request`` is checked (a GPU run is planned anywhere)."""
    try:
        folder = _checked_folder(request)
    except (ConfigMismatchError, RunFolderError) as err:
        return f"run folder: the run would stop here: {err}"
    return folder.state_line(request.specs.execution.overwrite)


def check_request(request: RunRequest) -> RunFolder:
    """The checks of ``request`` that need neither a model nor a dataset (grafts,
    replicates, device, run folder, and the folder's stored configuration as far as it is
    known before any work); its run folder. A design checks every run with it before its
    first run starts."""
    run, grafts, base, donors = request.specs, request.grafts, request.base, request.donors
    check_grafts(grafts, donors)
    check_replicates(run, grafts, base, donors)
    resolve_device(run.execution.device)
    return _checked_folder(request)


def _checked_folder(request: RunRequest) -> RunFolder:
    """``request``'s run folder, checked: placed outside the workspace, writable, graft's,
    holding no results of another configuration (as far as known before any work)."""
    run, grafts, base, donors = request.specs, request.grafts, request.base, request.donors
    folder = RunFolder(run.out_folder(request.out_tag))
    check_out_placement(folder.path, Workspace.at(run.execution.workspace).root)
    folder.check_writable()
    folder.check_owned()
    # a folder of another configuration is refused before the datasets are made
    all_grafts = graft_order(grafts, replicate_arms(run, grafts, base, donors))
    planned = dataset_dir(run, request.data_direction, planned=True)
    check_stored_config(folder, run, all_grafts, planned_dataset=planned)
    return folder


def _validate(request: RunRequest) -> tuple[RunFolder, dict[int, Path]]:
    """The checks that need no model (:func:`check_request`, the remote host), and the
    datasets (data seed -> dataset folder)."""
    run = request.specs
    folder = check_request(request)
    _check_remote(run.execution)
    # an architecture graft has no table for is refused before a dataset is generated
    # (also where the memory plan is skipped)
    check_family(run.donors.model)
    seeds = dict.fromkeys(r.data_seed for r in run.replicates)
    return folder, {d: dataset_dir(run, request.data_direction, d) for d in seeds}


def _plan(
    run: RunSpecs,
    grafts: Sequence[NamedGraft],
    base: ModelSource,
    donors: Mapping[str, ModelSource],
    data_paths: Mapping[int, Path],
) -> tuple[str, LoadedModel, dict[int, RunPrompts]]:
    """The prompts and rows of the run per data seed, checked on a stand-in model before any
    finetune.

    The pretrained model (or the explicit base) stands in for finetunes not made yet: same
    tokenizer and architecture, so prompts and specs are checked before any finetune.
    """
    probe_path = resolve_model_path(run, base if not needs_finetune(base) else ModelSource())
    probe = load_model(probe_path, dtype=run.execution.dtype, device=run.execution.device)
    prompts = {}
    for data_seed, data_path in data_paths.items():
        examples, drops = load_examples(
            data_path, probe.tokenizer, run.data, context_length(probe.model)
        )
        examples = sample_examples(examples, run.data.n, run.data.sample_seed)
        check_facts(data_path)  # read by the top-1 kinds after every batch: checked now
        check_span_names(grafts, data_path)
        rows, skipped = plan_rows(examples, grafts)
        warn_empty_grafts(examples, grafts, skipped)
        check_row_keys(examples, grafts, rows)
        check_rows(probe.model, examples, grafts, rows, donors)
        prompts[data_seed] = RunPrompts(examples, drops, rows, skipped)
    return probe_path, probe, prompts


def _model_paths(
    run: RunSpecs,
    base: ModelSource,
    donors: Mapping[str, ModelSource],
    probe: LoadedModel,
) -> dict[Replicate, RunPaths]:
    """Announce every finetune the run needs, make them, and say where each replicate's
    models are."""
    n_params = sum(p.numel() for p in probe.model.parameters())
    sources = [base, *donors.values()]
    announced = (
        pending_finetune(run, source, n_params, rep) for rep in run.replicates for source in sources
    )
    for line in dict.fromkeys(line for line in announced if line):
        logger.warning("%s", line)
    return {rep: replicate_paths(run, base, donors, rep) for rep in run.replicates}
