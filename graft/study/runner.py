"""Run a set of grafts over a dataset's test prompts: the pipeline every experiment shares.

An experiment is a base model, named donor models, a list of named grafts and the prompts
(templates, direction, how many). :func:`run_experiment` validates the inputs, finds or
finetunes the models (:class:`graft.study.workspace.Workspace`), tokenizes and samples the
prompts, runs every (prompt, graft) row through the engine batch by batch, and writes
per-example metrics, a summary with confidence intervals, the paired key contrasts
(:func:`graft.results.compare.key_contrasts`) and the drop counts into a resumable run
folder (:class:`graft.results.folder.RunFolder`): batches already stored are skipped, so an
interrupted run continues where it stopped.

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
from dataclasses import asdict, dataclass, field
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
from graft.results.compare import CONTRASTS_STEM, key_contrasts
from graft.results.folder import RunFolder
from graft.results.metrics import example_metrics, row_metrics_frame, summarize
from graft.study.config import ExperimentConfig, ModelSource
from graft.study.datasets import load_manifest
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
    model_fingerprint,
    needs_finetune,
    pending_finetune,
    resolve_model_path,
)
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


@dataclass
class ExperimentRun:
    """What an experiment run produced.

    Args:
        folder: the run folder.
        examples: per-(example, graft) metrics.
        summary: per-(group, template, graft) summary with CIs.
        drops: drop report per template.
        config: the resolved config stored in ``config.json``.
    """

    folder: RunFolder
    examples: pl.DataFrame
    summary: pl.DataFrame
    drops: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


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
    """``runs/<experiment>/<model>-<dataset>[-tag]-seed<seed>``."""
    data = Path(cfg.dataset).name if Path(cfg.dataset).is_dir() else cfg.dataset
    name = f"{model_slug(cfg.model)}-{data}{'-' + tag if tag else ''}-seed{cfg.seed}"
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
    """The loaded models of a run.

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
    folder, data_path = _validate(cfg, grafts, donors, data_direction, out_tag)
    probe_path, probe, prompts = _plan(cfg, grafts, base, donors, data_path)
    models = _load_models(cfg, base, donors, probe_path, probe)
    del probe  # the pretrained stand-in is freed unless it is a model of the run
    config = _run_config(cfg, grafts, models, data_path, extra_config)
    key = ["experiment", "grafts", "base", "donors", "dataset"]
    # everything is checked (write_config itself refuses a mismatching stored config before
    # writing): the first batch is about to run
    stored = folder.write_config(
        config, key=key + [f"options.{k}" for k in _KEY_OPTIONS], overwrite=cfg.overwrite
    )
    _run_batches(cfg, folder, grafts, prompts, models, echo or logger.info)
    table = folder.read(EXAMPLES_TABLE)
    folder.finalize(EXAMPLES_TABLE)
    summary = summarize_run(table, grafts, prompts.drops, cfg)
    folder.write_summary(summary)
    contrasts = key_contrasts(table, n_boot=max(cfg.n_boot, 1), seed=cfg.seed)
    if not contrasts.is_empty():
        folder.write_summary(contrasts, stem=CONTRASTS_STEM)
    folder.write_json(
        "drops.json", {"per_template": prompts.drops, "skipped_grafts": prompts.skipped}
    )
    return ExperimentRun(folder, table, summary, prompts.drops, stored)


def _validate(
    cfg: ExperimentConfig,
    grafts: Sequence[Graft],
    donors: Mapping[str, ModelSource],
    data_direction: str,
    out_tag: str,
) -> tuple[RunFolder, Path]:
    """The checks that need no model: grafts, device, run folder, remote host, dataset."""
    check_grafts(grafts, donors)
    resolve_device(cfg.device)
    folder = RunFolder(Path(cfg.out) if cfg.out else default_out(cfg, out_tag))
    folder.check_writable()
    folder.check_owned()
    _check_remote(cfg)
    return folder, dataset_dir(cfg, data_direction)


def _plan(
    cfg: ExperimentConfig,
    grafts: Sequence[Graft],
    base: ModelSource,
    donors: Mapping[str, ModelSource],
    data_path: Path,
) -> tuple[str, LoadedModel, _Prompts]:
    """The prompts and rows of the run, checked on a stand-in model before any finetune.

    The pretrained model (or the explicit base) stands in for finetunes not made yet: same
    tokenizer and architecture, so prompts and specs are checked before any finetune.
    """
    probe_path = resolve_model_path(cfg, base if not needs_finetune(base) else ModelSource())
    probe = load_model(probe_path, dtype=cfg.dtype, device=cfg.device)
    examples, drops = load_examples(data_path, probe.tokenizer, cfg, context_length(probe.model))
    examples = sample_examples(examples, cfg.n, cfg.seed)
    check_span_names(grafts, data_path)
    rows, skipped = plan_rows(examples, grafts)
    check_rows(probe.model, examples, grafts, rows, donors)
    return probe_path, probe, _Prompts(examples, drops, rows, skipped)


def _load_models(
    cfg: ExperimentConfig,
    base: ModelSource,
    donors: Mapping[str, ModelSource],
    probe_path: str,
    probe: LoadedModel,
) -> _Models:
    """Announce and make the finetunes the run needs, then load every model once."""
    n_params = sum(p.numel() for p in probe.model.parameters())
    announced = (pending_finetune(cfg, source, n_params) for source in [base, *donors.values()])
    for line in dict.fromkeys(line for line in announced if line):
        logger.warning("%s", line)
    base_path = resolve_model_path(cfg, base)
    donor_paths = {name: resolve_model_path(cfg, src) for name, src in donors.items()}
    loaded = {probe_path: probe}
    for path in [base_path, *donor_paths.values()]:
        if path not in loaded:
            loaded[path] = load_model(path, dtype=cfg.dtype, device=cfg.device)
    models = _Models(
        loaded[base_path], {n: loaded[p] for n, p in donor_paths.items()}, base_path, donor_paths
    )
    _check_models(cfg, models.base, models.donors)
    return models


def _run_config(
    cfg: ExperimentConfig,
    grafts: Sequence[Graft],
    models: _Models,
    data_path: Path,
    extra_config: dict[str, Any] | None,
) -> dict[str, Any]:
    """The ``config.json`` of the run: what produced its numbers."""
    from graft.remote.client import server_versions

    manifest = load_manifest(data_path)
    manifest_hash = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    return {
        "experiment": cfg.experiment,
        "options": {k: v for k, v in asdict(cfg).items() if k not in _UNRECORDED},
        "grafts": [{"name": g.name, "group": g.group, "spec": str(g.spec)} for g in grafts],
        "base": {"path": models.base_path, "fingerprint": model_fingerprint(models.base_path)},
        "donors": {
            n: {"path": p, "fingerprint": model_fingerprint(p)}
            for n, p in models.donor_paths.items()
        },
        "dataset": {"path": str(data_path), "manifest_sha256": manifest_hash[:16]},
        "remote": None if cfg.remote is None else str(cfg.remote),
        "remote_server": None if cfg.remote is None else server_versions(cfg.remote),
        **(extra_config or {}),
    }


def _run_batches(
    cfg: ExperimentConfig,
    folder: RunFolder,
    grafts: Sequence[Graft],
    prompts: _Prompts,
    models: _Models,
    echo: Callable[[str], None],
) -> None:
    """Run and store every batch the run folder does not hold yet."""
    rows, size = prompts.rows, cfg.batch_size
    n_batches = (len(rows) + size - 1) // size
    done = folder.done_batches(EXAMPLES_TABLE)
    todo = [b for b in range(n_batches) if str(b) not in done]
    echo(
        f"{cfg.experiment}: {len(prompts.examples)} prompts x {len(grafts)} grafts = {len(rows)} "
        f"rows in {n_batches} batches ({n_batches - len(todo)} already done) -> {folder.path}"
    )
    initial = min(len(rows), (n_batches - len(todo)) * size)
    bar = tqdm(
        total=len(rows), initial=initial, desc=cfg.experiment, unit="row", disable=not cfg.progress
    )
    torch_donors = {n: m.model for n, m in models.donors.items()}
    for b in todo:
        chunk = rows[b * size : (b + 1) * size]
        targets = [prompts.examples[ei].target_id for ei, _ in chunk]
        scores = _run_rows(
            cfg, models.base, torch_donors, graft_rows(prompts.examples, grafts, chunk), targets
        )
        frame = _batch_frame(scores, chunk, prompts.examples, grafts, models.base.tokenizer)
        folder.append_batch(EXAMPLES_TABLE, frame, b)
        bar.update(len(chunk))
    bar.close()


def _batch_frame(
    scores: torch.Tensor | dict[str, torch.Tensor],
    chunk: Sequence[tuple[int, int]],
    examples: Sequence[TestExample],
    grafts: Sequence[Graft],
    tokenizer: Any,
) -> pl.DataFrame:
    """One stored batch: which (prompt, graft) each row is, and its metrics (from logits, or
    from the metrics a remote run computed inside its trace)."""
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
        }
    )
    metrics = (
        row_metrics_frame(targets, scores, tokenizer)
        if isinstance(scores, dict)
        else example_metrics(scores, targets, tokenizer)
    )
    return pl.concat([meta, metrics], how="horizontal")


def summarize_run(
    table: pl.DataFrame, grafts: Sequence[Graft], drops: dict, cfg: ExperimentConfig
) -> pl.DataFrame:
    """Summary per (group, template, graft) in the experiment's graft order, with CIs."""
    if table.is_empty():
        return table
    templates = sorted(table["template"].unique().to_list())
    summary = summarize(
        table,
        by=["group", "template", "graft"],
        n_boot=cfg.n_boot,
        seed=cfg.seed,
        drops={t: drops.get(t, {}) for t in templates},
        drops_by="template",
    )
    order = {g.name: i for i, g in enumerate(grafts)}
    return summary.sort(
        by=[
            pl.col("group"),
            pl.col("template"),
            pl.col("graft").replace_strict(order, default=len(order)),
        ]
    )


#: top tokens a remote run returns per row (the examples table lists the top 10)
REMOTE_TOP_K = 10


def _run_rows(
    cfg: ExperimentConfig, base: LoadedModel, donors, rows: list[GraftRow], targets: list[int]
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Last-position logits of ``rows`` locally; remotely, the per-row metrics of ``targets``
    computed on the server (a few numbers per row instead of a vocabulary of logits)."""
    from graft.core.engine import run_grafts
    from graft.errors import RemoteError
    from graft.remote.executor import RemoteExecutor

    remote = cfg.remote is not None and cfg.remote.enabled
    try:
        return run_grafts(
            base.model,
            donors,
            rows,
            batch_size=len(rows),
            pad_id=base.tokenizer.pad_token_id,
            executor=RemoteExecutor(cfg.remote) if remote else None,
            targets=targets if remote else None,
            top_k=REMOTE_TOP_K,
        )
    except (SpecError, RemoteError) as err:
        raise ExperimentError(str(err)) from None


def format_summary(summary: pl.DataFrame, metric: str = "acc@5") -> str:
    """A compact table: one line per graft and template, the metric and its CI."""
    if summary.is_empty():
        return "(no results)"
    cols = ["group", "graft", "template", metric, f"{metric}_lo", f"{metric}_hi", "n"]
    with pl.Config(tbl_rows=200, tbl_cols=20, tbl_hide_dataframe_shape=True, fmt_str_lengths=40):
        return str(summary.select([c for c in cols if c in summary.columns]))


def print_summary(
    summary: pl.DataFrame, metric: str = "acc@5", echo: Callable[[str], None] | None = None
) -> None:
    """Send :func:`format_summary` to ``echo`` (default: this module's logger)."""
    (echo or logger.info)(format_summary(summary, metric))
