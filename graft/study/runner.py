"""Run a set of grafts over a dataset's test prompts: the pipeline every experiment shares.

An experiment is a base model, named donor models, a list of named grafts and the prompts
(templates, direction, how many). :func:`run_experiment` validates the inputs, finds or
finetunes the models (:class:`graft.study.workspace.Workspace`), tokenizes and samples the
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
the remote host, the test prompts of the chosen templates, and every (prompt, graft) row's
spec against the model. ``config.json`` is written only when the first batch is about to
run, so a failed start leaves the run folder as it was. Progress goes to the ``logging``
logger of this module (and a tqdm bar); a finetune the run needs first is announced as a
warning with an estimate of its duration.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl
import torch
from tqdm.auto import tqdm

from graft.core.arch import check_compatible
from graft.core.plan import GraftRow
from graft.core.spec import SpecError
from graft.errors import ExperimentError
from graft.models import LoadedModel, context_length, load_model, resolve_device
from graft.results.compare import (
    CONTRASTS_STEM,
    CONTROL_SUFFIX,
    NAME_CONTRASTS_STEM,
    control_name,
    key_contrasts,
)
from graft.results.files import atomic_path
from graft.results.folder import RunFolder
from graft.results.locks import exclusive
from graft.results.metrics import (
    REPLICATE_COLUMNS,
    example_metrics,
    format_per_seed,
    row_metrics_frame,
    summarize,
    summarize_over_seeds,
)
from graft.study.config import ExperimentConfig, ModelSource, Replicate
from graft.study.datasets import load_manifest
from graft.study.fullname import name_columns, resume_key
from graft.study.grafts import Graft
from graft.study.prompts import TestExample
from graft.study.rows import (
    check_grafts,
    check_rows,
    check_span_names,
    graft_rows,
    load_examples,
    plan_rows,
    sample_examples,
)
from graft.study.sources import (
    dataset_dir,
    finetune_record,
    model_fingerprint,
    needs_finetune,
    pending_finetune,
    resolve_model_path,
)
from graft.study.timing import StageTimes
from graft.study.workspace import model_slug

logger = logging.getLogger(__name__)

#: What an experiment script needs, importable from here (defined in the modules named).
__all__ = [
    "ExperimentConfig",
    "ExperimentRun",
    "Graft",
    "ModelSource",
    "check_grafts",
    "default_out",
    "load_examples",
    "print_summary",
    "resolve_model_path",
    "run_experiment",
    "sample_examples",
]

EXAMPLES_TABLE = "examples"
#: Options that do not change the results, left out of the stored config.
_UNRECORDED = ("remote", "progress", "overwrite")
#: Options a resumed run must share with the stored config.
_KEY_OPTIONS = ("templates", "directions", "n", "batch_size", "seed", "dtype", "head_policy")
#: Options that make a run of several replicates: recorded (and checked on resume) only then.
_REPLICATE_OPTIONS = ("finetune_seeds", "data_seeds", "control")


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
    """

    folder: RunFolder
    examples: pl.DataFrame
    summary: pl.DataFrame
    drops: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    times: StageTimes = field(default_factory=StageTimes)


def _check_remote(cfg: ExperimentConfig) -> None:
    if cfg.remote is not None:
        from graft.remote.client import check_reachable

        check_reachable(cfg.remote)


def _check_models(
    cfg: ExperimentConfig, base: LoadedModel, donors: Mapping[str, LoadedModel]
) -> None:
    """Donors must match the base's architecture; a remote run needs the base's model key."""
    try:
        for name, donor in donors.items():
            check_compatible(base.model, donor.model, name)
    except SpecError as err:
        raise ExperimentError(str(err)) from None
    if cfg.remote is not None and cfg.remote.mode == "remote":
        cfg.remote.resolved_model_key(base.model)


# ------------------------------------------------------------------------------- run


def default_out(cfg: ExperimentConfig, tag: str = "") -> Path:
    """``runs/<experiment>/<model>-<dataset>[-tag][-replicates]-seed<seed>``; the replicate
    part names several finetune seeds (``-fseeds0-1-2``), several data seeds
    (``-dseeds0-1``) and control models (``-control``)."""
    data = Path(cfg.dataset).name if Path(cfg.dataset).is_dir() else cfg.dataset
    tags = [tag] if tag else []
    if (cfg.finetune_seeds or (0,)) != (0,):
        tags.append("fseeds" + "-".join(map(str, cfg.finetune_seeds or ())))
    if len(cfg.data_seeds or ()) > 1:
        tags.append("dseeds" + "-".join(map(str, cfg.data_seeds or ())))
    if cfg.control:
        tags.append("control")
    name = f"{model_slug(cfg.model)}-{data}{''.join('-' + t for t in tags)}-seed{cfg.seed}"
    return Path("runs") / cfg.experiment / name


@dataclass
class _Prompts:
    """The rows of a run.

    Args:
        examples: the sampled test examples.
        drops: template -> drop reason -> count.
        rows: (example index, graft index), shortest prompts first.
        skipped: graft name -> examples lacking one of its spans.
    """

    examples: list[TestExample]
    drops: dict[str, dict[str, int]]
    rows: list[tuple[int, int]]
    skipped: dict[str, int]


@dataclass
class _Models:
    """The loaded models of one replicate.

    Args:
        base: the base model.
        donors: donor name -> model.
        base_path: where the base came from.
        donor_paths: donor name -> where it came from.
    """

    base: LoadedModel
    donors: dict[str, LoadedModel]
    base_path: str
    donor_paths: dict[str, str]


@dataclass
class _Paths:
    """Where the models of one replicate are.

    Args:
        base: the base model's name or folder.
        donors: donor name -> name or folder.
    """

    base: str
    donors: dict[str, str]

    def all(self) -> list[str]:
        return [self.base, *self.donors.values()]


def run_experiment(
    cfg: ExperimentConfig,
    grafts: Sequence[Graft],
    *,
    base: ModelSource = ModelSource(),  # noqa: B008 - frozen dataclass
    donors: dict[str, ModelSource] | None = None,
    data_direction: str = "one",
    extra_config: dict[str, Any] | None = None,
    out_tag: str = "",
    echo: Callable[[str], None] | None = None,
) -> ExperimentRun:
    """Run ``grafts`` on the test prompts; resumable. See the module docstring.

    With several replicates (``cfg.finetune_seeds``, ``cfg.data_seeds``, ``cfg.control``;
    :attr:`ExperimentConfig.replicates`) every graft runs once per replicate, on that
    replicate's models and its data seed's prompts (control replicates run the grafts that
    read a finetuned model, renamed ``<graft> [control]``); every row records its
    ``data_seed`` and ``finetune_seed``, and the summary adds the mean over replicates.

    Args:
        cfg: the shared options.
        grafts: the named grafts (unique names within a group).
        base: where the base model comes from (default: the pretrained ``cfg.model``).
        donors: donor name (as the specs name it, e.g. ``sft``) -> where it comes from.
        data_direction: direction of the generated dataset (``one`` or ``both``).
        extra_config: more entries for the stored ``config.json``.
        out_tag: part of the default run folder name.
        echo: where the one-line plan of the run goes (default: this module's logger).
    """
    donors = donors or {}
    times = StageTimes()
    with times.stage("data and checks"):
        folder, data_paths = _validate(cfg, grafts, base, donors, data_direction, out_tag)
    # one process runs a folder at a time: a second command on the same --out waits, then
    # resumes (finding the batches done)
    with exclusive(folder.path, f"running {cfg.experiment} into {folder.path}"):
        return _run_validated(
            cfg, grafts, base, donors, folder, data_paths, extra_config, echo, times
        )


def _run_validated(
    cfg: ExperimentConfig,
    grafts: Sequence[Graft],
    base: ModelSource,
    donors: dict[str, ModelSource],
    folder: RunFolder,
    data_paths: dict[int, Path],
    extra_config: dict[str, Any] | None,
    echo: Callable[[str], None] | None,
    times: StageTimes,
) -> ExperimentRun:
    """:func:`run_experiment` once its inputs are checked and its run folder is locked."""
    with times.stage("data and checks"):
        probe_path, probe, prompts = _plan(cfg, grafts, base, donors, data_paths)
        arms = _arms(cfg, grafts, base, donors)
    with times.stage("finetuning"):
        paths = _model_paths(cfg, base, donors, probe)
    loaded = {probe_path: probe}
    with times.stage("loading"):  # checked before anything is written
        first = _load_models(cfg, paths[cfg.replicates[0]], loaded)
    del probe  # the pretrained stand-in is freed unless it is a model of the run
    all_grafts = _graft_order(grafts, arms)
    config = _run_config(cfg, all_grafts, paths, data_paths, extra_config)
    config["engine"] = _engine_entry(cfg, first)
    del first
    key = ["experiment", "grafts", "base", "donors", "dataset"]
    # everything is checked (write_config itself refuses a mismatching stored config before
    # writing): the first batch is about to run
    key += [f"options.{k}" for k in _KEY_OPTIONS + _REPLICATE_OPTIONS]
    key += ["replicates"] if cfg.replicated else []
    key += resume_key(cfg, None if cfg.overwrite else folder.read_config())
    stored = folder.write_config(config, key=key, overwrite=cfg.overwrite)
    loading = times.seconds["loading"]
    with times.stage("grafting"):
        _run_batches(cfg, folder, arms, prompts, paths, loaded, echo or logger.info, times)
    # later replicates' models load inside: count that as loading, not grafting
    times.seconds["grafting"] -= times.seconds["loading"] - loading
    loaded.clear()
    with times.stage("summaries"):
        table, summary = _write_summaries(cfg, folder, all_grafts, prompts)
    return ExperimentRun(folder, table, summary, prompts[cfg.data_seed].drops, stored, times)


def _write_summaries(
    cfg: ExperimentConfig, folder: RunFolder, grafts: Sequence[Graft], prompts: dict
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Write ``examples.parquet``, the summary, the key contrasts (on whole names too when
    scored) and the drop report; return the examples and the summary."""
    table = _finalize_examples(cfg, folder)
    summary = summarize_run(table, grafts, {d: p.drops for d, p in prompts.items()}, cfg)
    folder.write_summary(summary)
    measures = [("hit@5", "target_logprob", CONTRASTS_STEM)]
    if "name_exact" in table.columns:
        measures.append(("name_exact", "name_logprob", NAME_CONTRASTS_STEM))
    for hit, score, stem in measures:
        contrasts = key_contrasts(table, hit, score, n_boot=max(cfg.n_boot, 1), seed=cfg.seed)
        if not contrasts.is_empty():
            folder.write_summary(contrasts, stem=stem)
    folder.write_json("drops.json", _drops_report(cfg, prompts))
    return table, summary


def _finalize_examples(cfg: ExperimentConfig, folder: RunFolder) -> pl.DataFrame:
    """Combine the stored batches into ``examples.parquet`` and return the table. Batches
    stored before rows recorded their replicate (a run of one, resumed) get its seeds."""
    path = folder.finalize(EXAMPLES_TABLE)
    table = folder.read(EXAMPLES_TABLE)
    if table.is_empty() or cfg.replicated:
        return table
    seeds = {"data_seed": cfg.data_seed, "finetune_seed": 0}
    filled = table.with_columns(
        pl.col(c).fill_null(v) if c in table.columns else pl.lit(v, dtype=pl.Int64).alias(c)
        for c, v in seeds.items()
    )
    if not filled.equals(table):
        with atomic_path(path) as tmp:
            filled.write_parquet(tmp)
    return filled


def _drops_report(cfg: ExperimentConfig, prompts: Mapping[int, _Prompts]) -> dict[str, Any]:
    """``drops.json``: the first data seed's drops, and every data seed's when there are
    several."""
    first = prompts[cfg.data_seed]
    report: dict[str, Any] = {"per_template": first.drops, "skipped_grafts": first.skipped}
    if len(prompts) > 1:
        report["per_data_seed"] = {
            str(d): {"per_template": p.drops, "skipped_grafts": p.skipped}
            for d, p in prompts.items()
        }
    return report


def _validate(
    cfg: ExperimentConfig,
    grafts: Sequence[Graft],
    base: ModelSource,
    donors: Mapping[str, ModelSource],
    data_direction: str,
    out_tag: str,
) -> tuple[RunFolder, dict[int, Path]]:
    """The checks that need no model: grafts, replicates, device, run folder, remote host,
    datasets (data seed -> dataset folder)."""
    check_grafts(grafts, donors)
    _check_replicates(cfg, grafts, base, donors)
    resolve_device(cfg.device)
    folder = RunFolder(Path(cfg.out) if cfg.out else default_out(cfg, out_tag))
    folder.check_writable()
    folder.check_owned()
    _check_remote(cfg)
    seeds = dict.fromkeys(r.data_seed for r in cfg.replicates)
    return folder, {d: dataset_dir(cfg, data_direction, d) for d in seeds}


def _check_replicates(
    cfg: ExperimentConfig,
    grafts: Sequence[Graft],
    base: ModelSource,
    donors: Mapping[str, ModelSource],
) -> None:
    """Finetune seeds and control models need a model the run finetunes; data seeds and
    control models need a generated dataset (a data kind, not a folder); control twins need
    their names free."""
    finetuned = any(needs_finetune(s) for s in [base, *donors.values()])
    if not finetuned and (len(cfg.finetune_seeds or ()) > 1 or cfg.control):
        raise ExperimentError(
            "finetune_seeds and control replace the run's finetuned models, but every model "
            "of this run is pretrained or an explicit folder; give a finetune variant "
            "(ModelSource('one'), ...) or drop them"
        )
    taken = [g.name for g in grafts if g.name.endswith(CONTROL_SUFFIX)] if cfg.control else []
    if taken:
        raise ExperimentError(
            f"graft {taken[0]!r} ends in {CONTROL_SUFFIX.strip()!r}, the mark of the control "
            "twins control adds; rename it"
        )
    several_data = len(cfg.data_seeds or ()) > 1
    if Path(cfg.dataset).is_dir() and (several_data or cfg.control):
        raise ExperimentError(
            f"data_seeds and control generate datasets of other data seeds, but the dataset "
            f"{cfg.dataset} is a folder; give a data kind as the dataset"
        )


def _plan(
    cfg: ExperimentConfig,
    grafts: Sequence[Graft],
    base: ModelSource,
    donors: Mapping[str, ModelSource],
    data_paths: Mapping[int, Path],
) -> tuple[str, LoadedModel, dict[int, _Prompts]]:
    """The prompts and rows of the run per data seed, checked on a stand-in model before any
    finetune.

    The pretrained model (or the explicit base) stands in for finetunes not made yet: same
    tokenizer and architecture, so prompts and specs are checked before any finetune.
    """
    probe_path = resolve_model_path(cfg, base if not needs_finetune(base) else ModelSource())
    probe = load_model(probe_path, dtype=cfg.dtype, device=cfg.device)
    prompts = {}
    for data_seed, data_path in data_paths.items():
        examples, drops = load_examples(
            data_path, probe.tokenizer, cfg, context_length(probe.model)
        )
        examples = sample_examples(examples, cfg.n, cfg.seed)
        check_span_names(grafts, data_path)
        rows, skipped = plan_rows(examples, grafts)
        check_rows(probe.model, examples, grafts, rows, donors)
        prompts[data_seed] = _Prompts(examples, drops, rows, skipped)
    return probe_path, probe, prompts


def control_twins(
    grafts: Sequence[Graft], base: ModelSource, donors: Mapping[str, ModelSource]
) -> list[Graft]:
    """The grafts that read a finetuned model (the base, or a donor the spec names), renamed
    ``<name> [control]``: what a control replicate runs (the others would repeat the real
    replicate's rows, e.g. PRE)."""
    if needs_finetune(base):
        uses = list(grafts)
    else:
        finetuned = {n for n, s in donors.items() if needs_finetune(s)}
        uses = [g for g in grafts if g.spec.donors() & finetuned]
    return [replace(g, name=control_name(g.name)) for g in uses]


def _arms(
    cfg: ExperimentConfig,
    grafts: Sequence[Graft],
    base: ModelSource,
    donors: Mapping[str, ModelSource],
) -> dict[Replicate, list[Graft]]:
    """Replicate -> the grafts it runs (the control twins for a control replicate)."""
    twins = control_twins(grafts, base, donors) if cfg.control else []
    return {r: twins if r.control else list(grafts) for r in cfg.replicates}


def _graft_order(grafts: Sequence[Graft], arms: Mapping[Replicate, list[Graft]]) -> list[Graft]:
    """Every graft the run has, each control twin right after its graft."""
    twins = {(g.group, g.name): g for r, gs in arms.items() if r.control for g in gs}
    order = []
    for g in grafts:
        order.append(g)
        twin = twins.get((g.group, control_name(g.name)))
        if twin is not None:
            order.append(twin)
    return order


def _model_paths(
    cfg: ExperimentConfig,
    base: ModelSource,
    donors: Mapping[str, ModelSource],
    probe: LoadedModel,
) -> dict[Replicate, _Paths]:
    """Announce every finetune the run needs, make them, and say where each replicate's
    models are."""
    n_params = sum(p.numel() for p in probe.model.parameters())
    sources = [base, *donors.values()]
    announced = (
        pending_finetune(cfg, source, n_params, rep) for rep in cfg.replicates for source in sources
    )
    for line in dict.fromkeys(line for line in announced if line):
        logger.warning("%s", line)
    return {
        rep: _Paths(
            resolve_model_path(cfg, base, rep),
            {name: resolve_model_path(cfg, src, rep) for name, src in donors.items()},
        )
        for rep in cfg.replicates
    }


def _load_models(cfg: ExperimentConfig, paths: _Paths, loaded: dict[str, LoadedModel]) -> _Models:
    """The models of one replicate, each loaded once: ``loaded`` (path -> model) keeps what
    the replicate shares with the previous one and drops the rest."""
    for path in [p for p in loaded if p not in paths.all()]:
        del loaded[path]
    for path in paths.all():
        if path not in loaded:
            loaded[path] = load_model(path, dtype=cfg.dtype, device=cfg.device)
    models = _Models(
        loaded[paths.base],
        {n: loaded[p] for n, p in paths.donors.items()},
        paths.base,
        dict(paths.donors),
    )
    _check_models(cfg, models.base, models.donors)
    return models


def _engine_entry(cfg: ExperimentConfig, models: _Models) -> dict[str, Any]:
    """How the engine computes this run's rows (:func:`graft.core.engine.engine_path`), and
    how many stored batches each engine call runs together."""
    from graft.core.engine import engine_path

    remote = cfg.remote is not None and cfg.remote.enabled
    donors = {n: m.model for n, m in models.donors.items()}
    path = engine_path(models.base.model, donors, remote=remote)
    return path | {"group_batches": group_batches(cfg)}


def _model_entry(path: str) -> dict[str, Any]:
    return {"path": path, "fingerprint": model_fingerprint(path)}


def _dataset_entry(data_path: Path) -> dict[str, Any]:
    manifest = load_manifest(data_path)
    manifest_hash = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    return {"path": str(data_path), "manifest_sha256": manifest_hash[:16]}


def _options(cfg: ExperimentConfig) -> dict[str, Any]:
    """The recorded options; the replicate options only when the run has several replicates
    (a run of one is recorded as runs were before they existed, and resumes them)."""
    options = {k: v for k, v in asdict(cfg).items() if k not in _UNRECORDED}
    if not cfg.replicated:
        for name in _REPLICATE_OPTIONS:
            options.pop(name, None)
    return options


def _run_config(
    cfg: ExperimentConfig,
    grafts: Sequence[Graft],
    paths: Mapping[Replicate, _Paths],
    data_paths: Mapping[int, Path],
    extra_config: dict[str, Any] | None,
) -> dict[str, Any]:
    """The ``config.json`` of the run: what produced its numbers. ``base``, ``donors`` and
    ``dataset`` are the first replicate's; ``replicates`` lists every replicate's (when
    there are several); ``finetuned_models`` holds the ``finetune_config.json`` of every
    finetuned model used (preset, seed, data, machine, package versions)."""
    from graft.remote.client import server_versions

    first = paths[cfg.replicates[0]]
    config = {
        "experiment": cfg.experiment,
        "options": _options(cfg),
        "grafts": [{"name": g.name, "group": g.group, "spec": str(g.spec)} for g in grafts],
        "base": _model_entry(first.base),
        "donors": {n: _model_entry(p) for n, p in first.donors.items()},
        "dataset": _dataset_entry(data_paths[cfg.data_seed]),
        "remote": None if cfg.remote is None else str(cfg.remote),
        "remote_server": None if cfg.remote is None else server_versions(cfg.remote),
    }
    if cfg.replicated:
        config["replicates"] = [
            {
                "label": rep.label,
                "data_seed": rep.data_seed,
                "finetune_seed": rep.finetune_seed,
                "control": rep.control,
                "train_data_seed": rep.train_data_seed,
                "dataset": _dataset_entry(data_paths[rep.data_seed]),
                "base": _model_entry(p.base),
                "donors": {n: _model_entry(d) for n, d in p.donors.items()},
            }
            for rep, p in paths.items()
        ]
    records = {path: finetune_record(path) for p in paths.values() for path in p.all()}
    config["finetuned_models"] = {path: r for path, r in records.items() if r is not None}
    return config | (extra_config or {})


def batch_id(cfg: ExperimentConfig, replicate: Replicate, batch: int) -> str:
    """The stored id of batch ``batch`` of ``replicate``: the number alone in a run of one
    replicate (as before replicates existed), ``<replicate label>-<batch>`` otherwise."""
    return f"{replicate.label}-{batch}" if cfg.replicated else str(batch)


def _run_batches(
    cfg: ExperimentConfig,
    folder: RunFolder,
    arms: Mapping[Replicate, list[Graft]],
    prompts: Mapping[int, _Prompts],
    paths: Mapping[Replicate, _Paths],
    loaded: dict[str, LoadedModel],
    echo: Callable[[str], None],
    times: StageTimes,
) -> None:
    """Run and store every batch the run folder does not hold yet, replicate by replicate
    (each replicate's models loaded once, timed as ``times``' loading stage)."""
    size = cfg.batch_size
    done = folder.done_batches(EXAMPLES_TABLE)
    plans = []
    for rep, grafts in arms.items():
        examples = prompts[rep.data_seed].examples
        rows = plan_rows(examples, grafts)[0] if rep.control else prompts[rep.data_seed].rows
        n_batches = (len(rows) + size - 1) // size
        missing = {b for b in range(n_batches) if batch_id(cfg, rep, b) not in done}
        plans.append((rep, grafts, examples, rows, missing))
    n_rows = sum(len(p[3]) for p in plans)
    n_batches = sum((len(p[3]) + size - 1) // size for p in plans)
    n_todo = sum(len(p[4]) for p in plans)
    echo(_plan_line(cfg, arms, prompts, n_rows, n_batches, n_todo, folder))
    todo_rows = sum(len(p[3][b * size : (b + 1) * size]) for p in plans for b in p[4])
    bar = tqdm(
        total=n_rows,
        initial=n_rows - todo_rows,
        desc=cfg.experiment,
        unit="row",
        disable=not cfg.progress,
    )
    for rep, grafts, examples, rows, missing in plans:
        if not missing:
            continue
        with times.stage("loading"):
            models = _load_models(cfg, paths[rep], loaded)
        torch_donors = {n: m.model for n, m in models.donors.items()}
        for group in _groups(cfg, (len(rows) + size - 1) // size):
            if not missing.intersection(group):
                continue
            # the whole group runs, stored batches included: a row's floats may depend on
            # the rows it is batched with, so a resumed run batches exactly as a whole one
            chunks = [rows[b * size : (b + 1) * size] for b in group]
            flat = [row for chunk in chunks for row in chunk]
            targets = [examples[ei].target_id for ei, _ in flat]
            group_rows = graft_rows(examples, grafts, flat)
            group_scores = _run_rows(cfg, models.base, torch_donors, group_rows, targets, size)
            start = 0
            for b, chunk in zip(group, chunks, strict=True):
                end = start + len(chunk)
                batch_rows, scores = group_rows[start:end], _slice_scores(group_scores, start, end)
                start = end
                if b not in missing:
                    continue
                frame = _batch_frame(scores, chunk, examples, grafts, models.base.tokenizer, rep)
                if cfg.score_full_name:
                    chosen = [examples[ei] for ei, _ in chunk]
                    names = name_columns(cfg, models.base, torch_donors, batch_rows, chosen, frame)
                    frame = pl.concat([frame, names], how="horizontal")
                folder.append_batch(EXAMPLES_TABLE, frame, batch_id(cfg, rep, b))
                bar.update(len(chunk))
    bar.close()


#: Stored batches handed to the engine at once: the engine routes rows to the model that does
#: most of their work and shares prompt prefixes, which fills forwards only across many rows.
GROUP_BATCHES = 8


def _groups(cfg: ExperimentConfig, n_batches: int) -> list[list[int]]:
    """The stored batches ``0 .. n_batches - 1`` in the groups that one engine call each runs:
    fixed by the plan (not by what is left to do), so that an interrupted run resumed computes
    every row in the same company as an uninterrupted one (one batch each for remote runs,
    whose requests are sized per stored batch)."""
    n = group_batches(cfg)
    return [list(range(i, min(i + n, n_batches))) for i in range(0, n_batches, n)]


def group_batches(cfg: ExperimentConfig) -> int:
    """Stored batches per engine call of ``cfg``'s run (:data:`GROUP_BATCHES`, 1 remotely)."""
    return 1 if cfg.remote is not None and cfg.remote.enabled else GROUP_BATCHES


def _slice_scores(scores, start: int, end: int):
    """Rows ``start:end`` of logits or of a dict of per-row metrics."""
    if isinstance(scores, dict):
        return {name: value[start:end] for name, value in scores.items()}
    return scores[start:end]


def _plan_line(
    cfg: ExperimentConfig,
    arms: Mapping[Replicate, list[Graft]],
    prompts: Mapping[int, _Prompts],
    n_rows: int,
    n_batches: int,
    n_todo: int,
    folder: RunFolder,
) -> str:
    """The one-line plan of a run: prompts x grafts (x replicates) = rows in batches."""
    first = prompts[cfg.data_seed]
    n_grafts = len(arms[cfg.replicates[0]])
    what = f"{len(first.examples)} prompts x {n_grafts} grafts"
    if cfg.replicated:
        seeds = ",".join(map(str, cfg.finetune_seeds or (0,)))
        data = ",".join(str(d) for d in prompts)
        control = " + control models" if cfg.control else ""
        what += f" x {len(arms)} replicates (finetune seeds {seeds}, data seeds {data}{control})"
    return (
        f"{cfg.experiment}: {what} = {n_rows} rows in {n_batches} batches "
        f"({n_batches - n_todo} already done) -> {folder.path}"
    )


def _batch_frame(
    scores: torch.Tensor | dict[str, torch.Tensor],
    chunk: Sequence[tuple[int, int]],
    examples: Sequence[TestExample],
    grafts: Sequence[Graft],
    tokenizer: Any,
    replicate: Replicate | None = None,
) -> pl.DataFrame:
    """One stored batch: which (prompt, graft, replicate) each row is, and its metrics (from
    logits, or from the metrics a remote run computed inside its trace)."""
    replicate = replicate or Replicate()
    targets = torch.tensor([examples[ei].target_id for ei, _ in chunk])
    meta = pl.DataFrame(
        {
            "graft": [grafts[gi].name for _, gi in chunk],
            "group": [grafts[gi].group for _, gi in chunk],
            "spec": [str(grafts[gi].spec) for _, gi in chunk],
            "template": [examples[ei].template for ei, _ in chunk],
            "direction": [examples[ei].direction for ei, _ in chunk],
            "prompt_id": [examples[ei].prompt_id for ei, _ in chunk],
            "fact_id": [examples[ei].fact_id for ei, _ in chunk],
            "text": [examples[ei].text for ei, _ in chunk],
            "data_seed": pl.Series([replicate.data_seed] * len(chunk), dtype=pl.Int64),
            "finetune_seed": pl.Series([replicate.finetune_seed] * len(chunk), dtype=pl.Int64),
        }
    )
    metrics = (
        row_metrics_frame(targets, scores, tokenizer)
        if isinstance(scores, dict)
        else example_metrics(scores, targets, tokenizer)
    )
    return pl.concat([meta, metrics], how="horizontal")


def summarize_run(
    table: pl.DataFrame,
    grafts: Sequence[Graft],
    drops: Mapping[int, Mapping[str, Mapping[str, int]]],
    cfg: ExperimentConfig,
) -> pl.DataFrame:
    """Summary per (group, template, graft) in the experiment's graft order, with CIs: one
    row per replicate (``data_seed``, ``finetune_seed``), then, where a graft ran in several
    replicates, a row of the mean over them with a between-replicate interval
    (:func:`graft.results.metrics.summarize_over_seeds`; its seed columns are null).

    Args:
        table: the run's examples.
        grafts: every graft of the run, in plot order.
        drops: data seed -> template -> drop reason -> count.
        cfg: the run's options (bootstrap resamples and seed).
    """
    if table.is_empty():
        return table
    by = ["group", "template", "graft", *REPLICATE_COLUMNS]
    parts = table.partition_by("data_seed", as_dict=True, maintain_order=True)
    per_seed = pl.concat(
        [
            summarize(
                part,
                by=by,
                n_boot=cfg.n_boot,
                seed=cfg.seed,
                drops={t: drops.get(d, {}).get(t, {}) for t in part["template"].unique()},
                drops_by="template",
            )
            for (d,), part in parts.items()
        ],
        how="diagonal_relaxed",
    )
    summary = summarize_over_seeds(per_seed, ["group", "template", "graft"], REPLICATE_COLUMNS)
    order = {g.name: i for i, g in enumerate(grafts)}
    return summary.sort(
        by=[
            pl.col("group"),
            pl.col("template"),
            pl.col("graft").replace_strict(order, default=len(order)),
            pl.col("finetune_seed").is_not_null(),  # the mean over replicates first
            *REPLICATE_COLUMNS,
        ],
        maintain_order=True,
    )


#: top tokens a remote run returns per row (the examples table lists the top 10)
REMOTE_TOP_K = 10


def _run_rows(
    cfg: ExperimentConfig,
    base: LoadedModel,
    donors,
    rows: list[GraftRow],
    targets: list[int],
    batch_size: int | None = None,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Last-position logits of ``rows`` locally; remotely, the per-row metrics of ``targets``
    computed on the server (a few numbers per row instead of a vocabulary of logits). Rows per
    forward: ``batch_size`` (default all)."""
    from graft.core.engine import run_grafts
    from graft.errors import RemoteError
    from graft.remote.executor import RemoteExecutor

    remote = cfg.remote is not None and cfg.remote.enabled
    try:
        return run_grafts(
            base.model,
            donors,
            rows,
            batch_size=batch_size or len(rows),
            pad_id=base.tokenizer.pad_token_id,
            executor=RemoteExecutor(cfg.remote) if remote else None,
            targets=targets if remote else None,
            top_k=REMOTE_TOP_K,
        )
    except (SpecError, RemoteError) as err:
        raise ExperimentError(str(err)) from None


def format_summary(summary: pl.DataFrame, metric: str = "acc@5") -> str:
    """A compact table: one line per graft and template, the metric and its CI; for a run of
    several replicates, their mean with the between-replicate interval and each replicate's
    value (``<metric>_per_seed``, in the order of ``per_seed_of``)."""
    if summary.is_empty():
        return "(no results)"
    cols = ["group", "graft", "template", metric, f"{metric}_lo", f"{metric}_hi", "n"]
    head = ""
    if f"{metric}_per_seed" in summary.columns:
        means = summary.filter(pl.col("n_seeds") > 1)
        summary = means.with_columns(format_per_seed(means[f"{metric}_per_seed"]))
        cols[-1:] = [f"{metric}_per_seed", "n"]
        head = (
            f"{metric}: mean over replicates ({means['per_seed_of'][0]}), "
            f"{means[f'{metric}_ci_method'][0]}; then each replicate's value; n prompts "
            "per replicate\n"
        )
    with pl.Config(tbl_rows=200, tbl_cols=20, tbl_hide_dataframe_shape=True, fmt_str_lengths=40):
        return head + str(summary.select([c for c in cols if c in summary.columns]))


def print_summary(
    summary: pl.DataFrame, metric: str = "acc@5", echo: Callable[[str], None] | None = None
) -> None:
    """Send :func:`format_summary` to ``echo`` (default: this module's logger)."""
    (echo or logger.info)(format_summary(summary, metric))
