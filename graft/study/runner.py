"""Run a set of grafts over a dataset's test prompts: the pipeline every experiment shares.

An experiment is a base model, named donor models, a list of named grafts and the prompts
(templates, direction, how many). :func:`run_experiment` loads or finetunes the models,
tokenizes and samples the prompts, runs every (prompt, graft) row through the one-pass
engine batch by batch, and writes per-example metrics, a summary with bootstrap CIs and the
drop counts into a resumable run folder (:class:`graft.results.folder.RunFolder`): batches already
stored are skipped, so an interrupted run continues where it stopped.

Everything that can fail on bad input is checked before anything is written or finetuned:
the grafts (unique names, donors given), the device, the run folder (writable, graft's own),
the remote host, the test prompts of the chosen templates, and every (prompt, graft) row's
spec against the model. ``config.json`` is written only when the first batch is about to
run, so a failed start leaves the run folder as it was.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import torch

from graft.core.arch import architecture_of, check_compatible
from graft.core.engine import GraftRow, resolve_rows
from graft.core.spans import ALIASES
from graft.core.spec import GraftSpec, SpecError
from graft.errors import ExperimentError
from graft.models import DEFAULT_MODEL, LoadedModel, context_length, load_model, resolve_device
from graft.results.folder import RunFolder
from graft.results.metrics import example_metrics, summarize
from graft.study import data as graft_data
from graft.study import finetune as ft

EXAMPLES_TABLE = "examples"
#: Rough finetune speed for the announcement before a run (measured: smollm2-135m, batch 16,
#: 3.3 s/step on a 2-core CPU; tiny models ~0.08 s/step). CUDA is assumed ~30x faster.
_STEP_OVERHEAD_S = 0.05
_STEP_S_PER_PARAM_TEXT = 1.5e-9
_CUDA_SPEEDUP = 30.0


@dataclass(frozen=True)
class ModelSource:
    """Where a model of an experiment comes from.

    Args:
        variant: ``"pretrained"`` for the model itself, else a finetune data variant
            (``one``, ``both``, ``task``, ``relation``; see ``graft.study.finetune.parse_variant``).
        path: an explicit model folder (or name) that overrides ``variant``.
    """

    variant: str = "pretrained"
    path: str | None = None


@dataclass
class ExperimentConfig:
    """Options every experiment command shares.

    Args:
        experiment: experiment name (position, component, ...), recorded in the run folder.
        model: registry name, hub id or local folder of the pretrained model.
        dataset: a data kind (generated into the workspace) or a dataset folder.
        split: whether the dataset has disjoint fact sets A and B (hybrid experiment).
        n_facts: facts per set when the dataset is generated.
        data_seed: seed of the generated dataset.
        preset: finetune preset of donors that must be finetuned first (None: paper on
            CUDA, else cpu).
        finetune_max_steps: cap on finetune steps (quick runs and tests); None = the preset's.
        templates: test templates to use (None = all the dataset has).
        directions: test prompt directions (``forward``; ``reverse`` for reversal).
        n: examples per template (sampled with ``seed``); None = all.
        batch_size: (prompt, graft) rows per forward pass.
        device: ``cpu``, ``cuda`` ... (default: CUDA if available).
        dtype: model dtype (default float32 on CPU, bfloat16 on CUDA).
        seed: sampling and bootstrap seed.
        out: run folder (default ``runs/<experiment>/<model>-<dataset>-...``).
        head_policy: default head policy of the grafts (base, donor, paper).
        workspace: where datasets and finetuned models live.
        overwrite: discard a previous run in ``out`` instead of resuming it.
        n_boot: bootstrap resamples for the confidence intervals.
        remote: a ``graft.remote.client.RemoteConfig`` or None for local execution.
        progress: show progress bars.
    """

    experiment: str
    model: str = DEFAULT_MODEL
    dataset: str = "fake_movies_real_actors"
    split: bool = False
    n_facts: int | None = None
    data_seed: int = 0
    preset: str | None = None
    finetune_max_steps: int | None = None
    templates: tuple[str, ...] | None = None
    directions: tuple[str, ...] = ("forward",)
    n: int | None = None
    batch_size: int = 32
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    out: str | None = None
    head_policy: str = "base"
    workspace: str | None = None
    overwrite: bool = False
    n_boot: int = 1000
    remote: Any = None
    progress: bool = True


@dataclass
class Graft:
    """A named graft of an experiment.

    Args:
        name: label in tables and plots (e.g. ``FE+LT``, ``PRE``).
        spec: the graft spec.
        group: optional extra grouping (e.g. the donor pair of a component experiment).
    """

    name: str
    spec: GraftSpec
    group: str = ""


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


# ----------------------------------------------------------------------------- inputs


def dataset_dir(cfg: ExperimentConfig, direction: str = "one") -> Path:
    """The dataset folder of ``cfg`` (generated into the workspace when ``dataset`` is a kind)."""
    if Path(cfg.dataset).is_dir():
        return Path(cfg.dataset)
    if cfg.dataset not in graft_data.KINDS or cfg.dataset == "custom":
        kinds = ", ".join(k for k in graft_data.KINDS if k != "custom")
        raise ExperimentError(
            f"--dataset {cfg.dataset!r} is neither a dataset folder nor a data kind ({kinds})"
        )
    try:
        return ft.workspace_dataset(
            cfg.dataset,
            direction,
            cfg.split,
            n_facts=cfg.n_facts,
            seed=cfg.data_seed,
            workspace=cfg.workspace,
        )
    except ft.FinetuneError as err:
        raise ExperimentError(str(err)) from None
    except OSError as err:
        raise _workspace_error(cfg, err, "generate the dataset") from None


def _workspace_error(cfg: ExperimentConfig, err: OSError, what: str) -> ExperimentError:
    workspace = cfg.workspace or ft.default_workspace()
    where = f" ({err.filename})" if err.filename else ""
    return ExperimentError(
        f"cannot {what} in the workspace {workspace}: {err.strerror or err}{where}; "
        "choose a writable workspace"
    )


def needs_finetune(source: ModelSource) -> bool:
    """Whether ``source`` is a finetune variant (found in, or finetuned into, the workspace)."""
    return not source.path and source.variant != "pretrained"


def _finetune_inputs(
    cfg: ExperimentConfig, source: ModelSource
) -> tuple[str | Path, ft.FinetuneConfig]:
    """The dataset (a kind or a folder) and the finetune config of a variant ``source``."""
    preset_name = cfg.preset or ft.default_preset(cfg.device)
    preset = ft.resolve_config(preset_name, max_steps=cfg.finetune_max_steps)
    dataset: str | Path = cfg.dataset
    if not Path(cfg.dataset).is_dir() and (cfg.split or source.variant in ("task", "relation")):
        direction, _ = ft.parse_variant(source.variant)
        dataset = ft.workspace_dataset(
            cfg.dataset,
            direction,
            True,
            n_facts=cfg.n_facts,
            seed=cfg.data_seed,
            workspace=cfg.workspace,
        )
    return dataset, preset


def resolve_model_path(cfg: ExperimentConfig, source: ModelSource) -> str:
    """Model name or folder for ``source``, finetuning it first when it is missing."""
    if source.path:
        return source.path
    if source.variant == "pretrained":
        return cfg.model
    try:
        dataset, preset = _finetune_inputs(cfg, source)
        return str(
            ft.find_or_finetune(
                cfg.model,
                dataset,
                source.variant,
                preset,
                cfg.workspace,
                n_facts=cfg.n_facts,
                data_seed=cfg.data_seed,
                device=cfg.device,
                quiet=not cfg.progress,
            )
        )
    except OSError as err:
        raise _workspace_error(cfg, err, f"finetune the {source.variant!r} model") from None


def pending_finetune(cfg: ExperimentConfig, source: ModelSource, n_params: int) -> str | None:
    """A line announcing the finetune ``source`` needs first (steps and a rough duration),
    or None when it needs none (pretrained, an explicit path, or already finetuned)."""
    if not needs_finetune(source):
        return None
    try:
        dataset, preset = _finetune_inputs(cfg, source)
        direction, train_set = ft.parse_variant(source.variant)
        data_dir = (
            Path(dataset)
            if Path(dataset).is_dir()
            else ft.workspace_dataset(
                str(dataset),
                direction,
                train_set is not None,
                n_facts=cfg.n_facts,
                seed=cfg.data_seed,
                workspace=cfg.workspace,
            )
        )
        out = ft.finetuned_dir(cfg.model, data_dir, train_set, preset, cfg.workspace)
        if ft.is_finished(out):
            return None
        texts = [r["text"] for r in ft.load_fact_dataset(data_dir, train_set).train]
    except ft.FinetuneError as err:
        raise ExperimentError(str(err)) from None
    except OSError as err:
        raise _workspace_error(cfg, err, "generate the dataset") from None
    train, _ = ft.split_texts(texts, preset.val_fraction, preset.seed)
    n_texts = len(train) + (round(preset.generic_ratio * len(train)) if preset.generic_ratio else 0)
    steps = math.ceil(preset.epochs * max(1, math.ceil(n_texts / preset.batch_size)))
    if preset.max_steps >= 0:
        steps = min(steps, preset.max_steps)
    device = resolve_device(cfg.device).type
    per_step = _STEP_S_PER_PARAM_TEXT * n_params * preset.batch_size
    per_step = _STEP_OVERHEAD_S + per_step / (_CUDA_SPEEDUP if device == "cuda" else 1.0)
    return (
        f"graft: the {source.variant!r} model of {cfg.model} is not in the workspace yet; it "
        f"is finetuned first: {steps} steps ({preset.name} preset), roughly "
        f"{_duration(steps * per_step)} of training on {device} (an estimate)"
    )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def sample_examples(
    examples: Sequence[graft_data.TestExample], n: int | None, seed: int
) -> list[graft_data.TestExample]:
    """Up to ``n`` examples per template, sampled with ``seed`` (input order kept)."""
    if n is None:
        return list(examples)
    keep: list[int] = []
    by_template: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        by_template.setdefault(ex.template, []).append(i)
    for template, idx in sorted(by_template.items()):
        rng = random.Random(f"{seed}:{template}")
        keep += idx if len(idx) <= n else rng.sample(idx, n)
    return [examples[i] for i in sorted(keep)]


def _fingerprint(path: str) -> str | None:
    """A short hash of a local model folder's config and weight-file sizes (cheap, stable)."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    h = hashlib.sha256()
    for file in sorted(folder.glob("*")):
        if file.is_file() and file.suffix in (".json", ".safetensors"):
            h.update(file.name.encode())
            h.update(str(file.stat().st_size).encode())
            if file.suffix == ".json":
                h.update(file.read_bytes())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------- run


def default_out(cfg: ExperimentConfig, tag: str = "") -> Path:
    """``runs/<experiment>/<model>-<dataset>[-tag]-seed<seed>``."""
    data = Path(cfg.dataset).name if Path(cfg.dataset).is_dir() else cfg.dataset
    name = f"{ft.model_slug(cfg.model)}-{data}{'-' + tag if tag else ''}-seed{cfg.seed}"
    return Path("runs") / cfg.experiment / name


def run_experiment(
    cfg: ExperimentConfig,
    grafts: Sequence[Graft],
    *,
    base: ModelSource = ModelSource(),  # noqa: B008 - frozen dataclass
    donors: dict[str, ModelSource] | None = None,
    data_direction: str = "one",
    extra_config: dict[str, Any] | None = None,
    out_tag: str = "",
    echo: Callable[[str], None] = print,
) -> ExperimentRun:
    """Run ``grafts`` on the test prompts; resumable. See the module docstring."""
    donors = donors or {}
    check_grafts(grafts, donors)
    resolve_device(cfg.device)
    folder = RunFolder(Path(cfg.out) if cfg.out else default_out(cfg, out_tag))
    folder.check_writable()
    folder.check_owned()
    _check_remote(cfg)
    data_path = dataset_dir(cfg, data_direction)

    # The pretrained model (or the explicit base) stands in for finetunes not made yet: same
    # tokenizer and architecture, so prompts and specs are checked before any finetune.
    probe_path = resolve_model_path(cfg, base if not needs_finetune(base) else ModelSource())
    probe = load_model(probe_path, dtype=cfg.dtype, device=cfg.device)
    examples, drops = load_examples(data_path, probe.tokenizer, cfg, context_length(probe.model))
    examples = sample_examples(examples, cfg.n, cfg.seed)
    _check_span_names(grafts, data_path)
    rows, skipped = _plan_rows(examples, grafts)
    _check_rows(probe.model, examples, grafts, rows, donors)

    n_params = sum(p.numel() for p in probe.model.parameters())
    announced = (pending_finetune(cfg, source, n_params) for source in [base, *donors.values()])
    for line in dict.fromkeys(line for line in announced if line):
        print(line, file=sys.stderr, flush=True)
    base_path = resolve_model_path(cfg, base)
    donor_paths = {name: resolve_model_path(cfg, src) for name, src in donors.items()}
    loaded = {probe_path: probe}
    for path in [base_path, *donor_paths.values()]:
        if path not in loaded:
            loaded[path] = load_model(path, dtype=cfg.dtype, device=cfg.device)
    loaded_base = loaded[base_path]
    loaded_donors = {n: loaded[p] for n, p in donor_paths.items()}
    del probe, loaded  # the pretrained stand-in is freed unless it is a model of the run
    _check_models(cfg, loaded_base, loaded_donors)
    tok = loaded_base.tokenizer

    manifest = graft_data.load_manifest(data_path)
    config = {
        "experiment": cfg.experiment,
        "options": {
            k: v for k, v in asdict(cfg).items() if k not in ("remote", "progress", "overwrite")
        },
        "grafts": [{"name": g.name, "group": g.group, "spec": str(g.spec)} for g in grafts],
        "base": {"path": base_path, "fingerprint": _fingerprint(base_path)},
        "donors": {n: {"path": p, "fingerprint": _fingerprint(p)} for n, p in donor_paths.items()},
        "dataset": {"path": str(data_path), "manifest_sha256": _manifest_hash(manifest)},
        "remote": None if cfg.remote is None else str(cfg.remote),
        **(extra_config or {}),
    }
    key = ["experiment", "grafts", "base", "donors", "dataset"]
    key += [
        f"options.{k}"
        for k in ("templates", "directions", "n", "batch_size", "seed", "dtype", "head_policy")
    ]
    # everything is checked (write_config itself refuses a mismatching stored config before
    # writing): the first batch is about to run
    stored = folder.write_config(config, key=key, overwrite=cfg.overwrite)

    n_batches = (len(rows) + cfg.batch_size - 1) // cfg.batch_size
    done = folder.done_batches(EXAMPLES_TABLE)
    todo = [b for b in range(n_batches) if str(b) not in done]
    echo(
        f"{cfg.experiment}: {len(examples)} prompts x {len(grafts)} grafts = {len(rows)} rows in "
        f"{n_batches} batches ({n_batches - len(todo)} already done) -> {folder.path}"
    )
    bar = None
    if cfg.progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=len(rows),
            initial=(n_batches - len(todo))
            and min(len(rows), (n_batches - len(todo)) * cfg.batch_size),
            desc=cfg.experiment,
            unit="row",
        )
    torch_donors = {n: m.model for n, m in loaded_donors.items()}
    for b in todo:
        chunk = rows[b * cfg.batch_size : (b + 1) * cfg.batch_size]
        graft_rows = [
            GraftRow(examples[ei].input_ids, examples[ei].spans, grafts[gi].spec)
            for ei, gi in chunk
        ]
        logits = _run_rows(cfg, loaded_base, torch_donors, graft_rows)
        targets = torch.tensor([examples[ei].target_id for ei, _ in chunk])
        frame = example_metrics(logits, targets, tok)
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
        folder.append_batch(EXAMPLES_TABLE, pl.concat([meta, frame], how="horizontal"), b)
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()

    table = folder.read(EXAMPLES_TABLE)
    folder.finalize(EXAMPLES_TABLE)
    summary = summarize_run(table, grafts, drops, cfg)
    folder.write_summary(summary)
    folder.write_json("drops.json", {"per_template": drops, "skipped_grafts": skipped})
    return ExperimentRun(folder, table, summary, drops, stored)


def check_grafts(grafts: Sequence[Graft], donors: Mapping[str, Any]) -> None:
    """Refuse grafts that would give a wrong or meaningless table: none at all, a nameless
    one, two of one name in one group (their rows would be pooled into one result), or one
    using a donor not in ``donors``."""
    if not grafts:
        raise ExperimentError("no grafts to run")
    seen: dict[tuple[str, str], Graft] = {}
    for g in grafts:
        if not isinstance(g.name, str) or not g.name.strip():
            raise ExperimentError(f"the graft {str(g.spec)!r} has no name; name every graft")
        first = seen.setdefault((g.group, g.name), g)
        if first is not g:
            where = f" in group {g.group!r}" if g.group else ""
            raise ExperimentError(
                f"two grafts are named {g.name!r}{where}: {str(first.spec)!r} and "
                f"{str(g.spec)!r}; their rows would be pooled into one result, so give each "
                "graft its own name (PRE, SFT, TASK and RELATION name the references)"
            )
        missing = g.spec.donors() - set(donors)
        if missing:
            raise ExperimentError(f"graft {g.name!r} uses donor(s) {sorted(missing)} not loaded")


def _check_remote(cfg: ExperimentConfig) -> None:
    if cfg.remote is not None:
        from graft.remote.client import check_reachable

        check_reachable(cfg.remote)


def _plan_rows(
    examples: Sequence[graft_data.TestExample], grafts: Sequence[Graft]
) -> tuple[list[tuple[int, int]], dict[str, int]]:
    """Rows (example index, graft index): every example x every graft whose named spans the
    example has, shortest prompts first; and per graft the number of examples skipped."""
    rows: list[tuple[int, int]] = []
    skipped: dict[str, int] = {}
    for ei, ex in enumerate(examples):
        for gi, g in enumerate(grafts):
            if g.spec.span_names() <= set(ex.spans):
                rows.append((ei, gi))
            else:
                skipped[g.name] = skipped.get(g.name, 0) + 1
    rows.sort(key=lambda r: (len(examples[r[0]].input_ids), r[0], r[1]))
    return rows, skipped


def _check_rows(model, examples, grafts, rows, donors) -> None:
    """Resolve every row's spec on the model (layers in range, spans not empty)."""
    graft_rows = [
        GraftRow(examples[ei].input_ids, examples[ei].spans, grafts[gi].spec) for ei, gi in rows
    ]
    try:
        resolve_rows(architecture_of(model), graft_rows, donors)
    except SpecError as err:
        raise ExperimentError(str(err)) from None


def _check_models(
    cfg: ExperimentConfig, base: LoadedModel, donors: Mapping[str, LoadedModel]
) -> None:
    """Donors must match the base's architecture; a remote run needs the base's model key."""
    try:
        for name, donor in donors.items():
            check_compatible(base.model, donor.model, name)
    except SpecError as err:
        raise ExperimentError(str(err)) from None
    if cfg.remote is not None and getattr(cfg.remote, "mode", "local") == "remote":
        cfg.remote.resolved_model_key(base.model)


def _check_span_names(grafts: Sequence[Graft], data_path: Path) -> None:
    """Fail on a graft naming a span that no template of the dataset has (a typo, not M on
    the headline template, which is skipped there)."""
    known = set(ALIASES)
    for record in graft_data.read_jsonl(data_path / "test_prompts.jsonl"):
        known |= set(record.get("fields", {}))
    for g in grafts:
        unknown = g.spec.span_names() - known
        if unknown:
            raise ExperimentError(
                f"graft {g.name!r} names span(s) {', '.join(sorted(unknown))} that no test "
                f"prompt has; spans: LT, {', '.join(sorted(known))}"
            )


def _manifest_hash(manifest: dict) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]


def load_examples(
    data_path: Path, tokenizer: Any, cfg: ExperimentConfig, max_length: int | None = None
) -> tuple[list[graft_data.TestExample], dict[str, dict[str, int]]]:
    """Test examples of the selected templates and ``template -> drop reason -> count``;
    prompts longer than ``max_length`` tokens are dropped as ``too_long``."""
    graft_data.check_dataset_folder(data_path, ["test_prompts.jsonl"])
    records = graft_data.read_jsonl(data_path / "test_prompts.jsonl")
    available = sorted({r["template"] for r in records})
    templates = list(dict.fromkeys(cfg.templates)) if cfg.templates else available
    unknown = [t for t in templates if t not in available]
    if unknown:
        raise ExperimentError(
            f"--templates {','.join(unknown)}: not in {data_path}; available: {', '.join(available)}"
        )
    examples: list[graft_data.TestExample] = []
    drops: dict[str, dict[str, int]] = {}
    for template in templates:
        found, report = graft_data.load_test_prompts(
            data_path, tokenizer, [template], directions=cfg.directions, max_length=max_length
        )
        examples += found
        drops[template] = dict(report.dropped)
    if not examples:
        raise ExperimentError(
            f"no usable test prompts for templates {templates} and directions {cfg.directions} "
            f"in {data_path} (dropped: {drops})"
        )
    return examples, drops


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


def _run_rows(
    cfg: ExperimentConfig, base: LoadedModel, donors, rows: list[GraftRow]
) -> torch.Tensor:
    from graft.remote.client import RemoteError, run_rows

    try:
        return run_rows(
            base.model,
            donors,
            rows,
            batch_size=len(rows),
            remote=cfg.remote,
            pad_id=base.tokenizer.pad_token_id,
        )
    except (SpecError, RemoteError) as err:
        raise ExperimentError(str(err)) from None


def print_summary(
    summary: pl.DataFrame, metric: str = "acc@5", echo: Callable[[str], None] = print
) -> None:
    """Echo a compact table: one line per graft, one column per template."""
    if summary.is_empty():
        echo("(no results)")
        return
    cols = ["group", "graft", "template", metric, f"{metric}_lo", f"{metric}_hi", "n"]
    with pl.Config(tbl_rows=200, tbl_cols=20, tbl_hide_dataframe_shape=True, fmt_str_lengths=40):
        echo(str(summary.select([c for c in cols if c in summary.columns])))
