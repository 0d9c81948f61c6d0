"""Finetuning a base model on a fact dataset (the paper's SFT donor), with resumable runs.

A dataset folder (from :func:`graft.study.data.generate_dataset`) holds ``train.jsonl`` (one JSON
object per line with at least ``text`` and ``set``), ``test_prompts.jsonl`` and
``manifest.json``. :func:`finetune` trains with the HF ``Trainer``
(AdamW, linear schedule) on a seeded 80/20 split *of the texts* (every fact has several
renderings, so each fact is still trained on), keeps the checkpoint with the best validation
loss, and writes into the output folder:

- the model (safetensors) and tokenizer;
- ``finetune_config.json``: resolved config, model and dataset provenance, seed, versions;
- ``data_manifest.json``: copy of the dataset's manifest;
- ``train_log.json``: Trainer log history, best checkpoint, wall time;
- ``eval.json``: top-k accuracy of the target per test template and direction, for the
  finetuned (``sft``) and the pretrained (``pre``) model.

Training happens in ``<out>.partial/`` (checkpoints live there, so an interrupted run
resumes); the finished folder is renamed into place at the end and never redone.

:func:`find_or_finetune` finds (or makes) the finetune of (model, dataset, variant, preset)
under a workspace folder, so experiments need not know where it lives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import shutil
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm

from graft.errors import FinetuneError
from graft.models import (
    DEFAULT_MODEL,
    HUB_MODELS,
    LoadedModel,
    context_length,
    load_model,
    resolve_device,
    resolve_model_name,
)
from graft.results.folder import package_versions
from graft.study import data as graft_data

EVAL_KS = (1, 5, 10, 50)


@dataclass(frozen=True)
class FinetuneConfig:
    """Hyper-parameters of one finetune. Presets: :data:`PRESETS`.

    Args:
        name: preset name this config came from (kept when fields are overridden).
        learning_rate: peak AdamW learning rate (linear decay to 0 after warmup).
        weight_decay: AdamW weight decay.
        batch_size: texts per optimisation step (per device).
        epochs: passes over the training texts.
        warmup_steps: linear warmup steps.
        val_fraction: fraction of the fact texts held out for validation (best checkpoint).
        fp16_on_cuda: mixed precision (fp16) when training on CUDA; CPU always trains in float32.
        generic_ratio: generic-text passages added to the training set per fact text (0 = none).
        generic_corpus: file of generic passages (one per line, or JSONL with ``text``);
            ``None`` = the shipped ``graft/resources/generic_text.txt``.
        max_length: texts are truncated to this many tokens.
        max_steps: stop after this many optimisation steps (-1 = run all epochs).
        seed: seed of the split, the generic-text sample, data order and initialisation.
    """

    name: str
    learning_rate: float
    weight_decay: float
    batch_size: int
    epochs: float
    warmup_steps: int = 0
    val_fraction: float = 0.2
    fp16_on_cuda: bool = False
    generic_ratio: float = 0.0
    generic_corpus: str | None = None
    max_length: int = 128
    max_steps: int = -1
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def key(self) -> str:
        """Folder name: the preset name, plus a short hash when fields differ from the preset."""
        base = PRESETS.get(self.name)
        if base == self:
            return self.name
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return f"{self.name}-{hashlib.sha256(blob).hexdigest()[:8]}"


#: The paper's settings (Appendix: lr 2e-5, weight decay 0.01, batch 4, 10 epochs, fp16).
PAPER = FinetuneConfig(
    name="paper", learning_rate=2e-5, weight_decay=0.01, batch_size=4, epochs=10, fp16_on_cuda=True
)
#: The paper's "gentle" finetuning (C.4): lr 2e-6, no weight decay, generic text mixed in.
GENTLE = FinetuneConfig(
    name="gentle",
    learning_rate=2e-6,
    weight_decay=0.0,
    batch_size=4,
    epochs=10,
    fp16_on_cuda=True,
    generic_ratio=1.0,
)
#: For the embedded models on a small CPU: memorises the default dataset (50 facts) in ~20 min.
CPU = FinetuneConfig(name="cpu", learning_rate=1.5e-4, weight_decay=0.0, batch_size=16, epochs=10)

PRESETS: dict[str, FinetuneConfig] = {c.name: c for c in (PAPER, GENTLE, CPU)}


def default_preset(device: str | None = None) -> str:
    """``paper`` when training runs on CUDA (``device``, default: CUDA if available), else ``cpu``."""
    return "paper" if resolve_device(device).type == "cuda" else "cpu"


def resolve_config(preset: str | FinetuneConfig, **overrides: Any) -> FinetuneConfig:
    """A preset (by name) with the non-``None`` ``overrides`` applied."""
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise FinetuneError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        preset = PRESETS[preset]
    changes = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(changes) - {f.name for f in dataclasses.fields(FinetuneConfig)}
    if unknown:
        raise FinetuneError(f"unknown finetune setting(s): {', '.join(sorted(unknown))}")
    cfg = dataclasses.replace(preset, **changes)
    if cfg.learning_rate <= 0 or cfg.batch_size < 1 or cfg.epochs <= 0:
        raise FinetuneError("learning_rate, batch_size and epochs must be positive")
    if not 0 < cfg.val_fraction < 1:
        raise FinetuneError(f"val_fraction must be in (0, 1), got {cfg.val_fraction}")
    if cfg.max_steps != -1 and cfg.max_steps < 1:
        raise FinetuneError(
            f"max_steps must be at least 1 (or -1 to train all epochs), got {cfg.max_steps}"
        )
    return cfg


# ----------------------------------------------------------------------------- data


@dataclass
class FactDataset:
    """A dataset folder's training texts and manifest, checked.

    Args:
        path: the folder.
        train: rows of ``train.jsonl`` kept for training (each has ``text``).
        train_set: the fact set trained on: ``"all"`` (unsplit), ``"A"`` or ``"B"``.
        manifest: ``manifest.json`` (empty dict when the folder has none).
    """

    path: Path
    train: list[dict[str, Any]]
    train_set: str
    manifest: dict[str, Any]


def load_fact_dataset(path: str | Path, train_set: str | None = None) -> FactDataset:
    """Read and check a dataset folder; :class:`FinetuneError` names what is wrong.

    Args:
        path: folder with ``train.jsonl`` and ``test_prompts.jsonl``.
        train_set: ``"A"`` or ``"B"`` for a split dataset (task / relation model); must be
            ``None`` (or ``"all"``) for an unsplit one.
    """
    try:
        path = graft_data.check_dataset_folder(path, ["train.jsonl", "test_prompts.jsonl"])
        rows = graft_data.read_jsonl(path / "train.jsonl")
    except graft_data.DatasetError as err:
        raise FinetuneError(str(err)) from None
    bad = [i for i, r in enumerate(rows, 1) if not isinstance(r.get("text"), str)]
    if bad:
        raise FinetuneError(f"{path / 'train.jsonl'}: line {bad[0]} has no text")
    sets = sorted({str(r.get("set", "all")) for r in rows})
    if train_set in (None, "all"):
        if sets not in ([], ["all"]):
            raise FinetuneError(
                f"dataset {path} is split into sets {'/'.join(sets)}; choose the set to train on "
                "(A = task model, B = relation model)"
            )
        train_set = "all"
    else:
        if train_set not in sets:
            raise FinetuneError(
                f"dataset {path} has no fact set {train_set!r} (it has {', '.join(sets) or 'none'})"
            )
        rows = [r for r in rows if r.get("set") == train_set]
    if len(rows) < 2:
        raise FinetuneError(f"{path / 'train.jsonl'} needs at least 2 texts, has {len(rows)}")
    manifest_path = path / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    return FactDataset(path, rows, train_set, manifest)


def split_texts(
    texts: Sequence[str], val_fraction: float, seed: int
) -> tuple[list[str], list[str]]:
    """Seeded split of texts (not facts) into (train, validation); both non-empty."""
    order = list(texts)
    random.Random(seed).shuffle(order)
    n_val = min(max(1, round(len(order) * val_fraction)), len(order) - 1)
    return order[n_val:], order[:n_val]


def load_generic_texts(corpus: str | Path | None = None) -> list[str]:
    """Generic passages for gentle finetuning: ``corpus``, else the shipped corpus."""
    path = Path(corpus) if corpus is not None else graft_data.RESOURCES / "generic_text.txt"
    if not path.is_file():
        raise FinetuneError(f"generic text corpus {path} does not exist")
    try:
        texts = graft_data.load_generic_corpus(path)
    except graft_data.DatasetError as err:
        raise FinetuneError(str(err)) from None
    if not texts:
        raise FinetuneError(f"generic text corpus {path} is empty")
    return texts


class _TokenisedTexts(torch.utils.data.Dataset):
    def __init__(self, texts: Sequence[str], tokenizer, max_length: int):
        self.items = [
            tokenizer(t, truncation=True, max_length=max_length)["input_ids"] for t in texts
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return {"input_ids": self.items[i]}


@dataclass
class _CausalCollator:
    pad_id: int

    def __call__(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, : len(r["input_ids"])] = 1
        # Masked by attention, not by pad id: the pad token may double as EOS.
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


# ----------------------------------------------------------------------------- evaluation


def _stats(rows: list[tuple[int, float]], ks: Sequence[int]) -> dict[str, float]:
    n = len(rows)
    out: dict[str, float] = {"n": n}
    if n:
        for k in ks:
            out[f"top{k}"] = sum(r < k for r, _ in rows) / n
        out["mean_rank"] = sum(r for r, _ in rows) / n
        out["mean_prob"] = sum(q for _, q in rows) / n
    return out


@torch.no_grad()
def evaluate_examples(
    model: transformers.PreTrainedModel,
    examples: Sequence[graft_data.TestExample],
    *,
    pad_id: int,
    ks: Sequence[int] = EVAL_KS,
    batch_size: int = 16,
    desc: str = "eval",
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Top-k accuracy, mean rank and mean probability of each example's target token.

    Logits are read at the last prompt token. Returns, per direction present
    (``"forward"``, ``"reverse"``), ``{"per_template": {template: stats}, "overall": stats}``;
    stats has ``n``, ``top{k}`` for each k, ``mean_rank`` (0 = top) and ``mean_prob``.
    Prompts longer than a model's learned positions (``n_positions``, e.g. the tiny GPT-2)
    keep their last tokens; the overall stats then count them under ``truncated``.
    ``progress=False`` hides the progress bar.
    """
    model.eval()
    device = next(model.parameters()).device
    window = getattr(model.config, "n_positions", None)
    rows: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    truncated: dict[str, int] = defaultdict(int)
    batches = range(0, len(examples), batch_size)
    for start in tqdm(batches, desc=desc, leave=False, disable=not progress):
        batch = examples[start : start + batch_size]
        prompts = [e.input_ids[-window:] if window else e.input_ids for e in batch]
        for e, p in zip(batch, prompts, strict=True):
            truncated[e.direction] += len(p) < len(e.input_ids)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(
            prompts
        ):  # right padding: positions stay those of the unpadded prompt
            ids[i, : len(p)] = torch.tensor(p)
            mask[i, : len(p)] = 1
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        last = torch.tensor([len(p) - 1 for p in prompts], device=device)
        lo = logits[torch.arange(len(batch), device=device), last].float()
        tgt = torch.tensor([e.target_id for e in batch], device=device)[:, None]
        ranks = (lo > lo.gather(1, tgt)).sum(1).tolist()
        probs = lo.softmax(-1).gather(1, tgt)[:, 0].tolist()
        for e, r, q in zip(batch, ranks, probs, strict=True):
            rows[e.direction][e.template].append((r, q))
    result: dict[str, dict[str, Any]] = {}
    for direction, per in rows.items():
        overall = _stats([x for r in per.values() for x in r], ks)
        if truncated[direction]:
            overall["truncated"] = truncated[direction]
        result[direction] = {
            "per_template": {t: _stats(r, ks) for t, r in per.items()},
            "overall": overall,
        }
    return result


def _usable_test_prompts(
    dataset: Path, loaded: LoadedModel
) -> tuple[list[graft_data.TestExample], graft_data.DropReport]:
    """The dataset's test prompts (both directions) for ``loaded``; none usable is an error,
    found before any training."""
    try:
        examples, drops = graft_data.load_test_prompts(
            dataset, loaded.tokenizer, directions=None, max_length=context_length(loaded.model)
        )
    except graft_data.DatasetError as err:
        raise FinetuneError(str(err)) from None
    if not examples:
        raise FinetuneError(
            f"no test prompt of {dataset} is usable with {loaded.name} ({drops.summary()}); "
            "use another dataset or model"
        )
    return examples, drops


def format_eval(evaluation: dict[str, Any], k: int = 5) -> str:
    """Table of top-k accuracy per template, SFT vs PRE, from an ``eval.json`` dict."""
    lines = [f"{'direction':9s} {'template':10s} {'n':>4s} {f'SFT top{k}':>9s} {f'PRE top{k}':>9s}"]
    for direction, sft in evaluation["sft"].items():
        pre = evaluation["pre"].get(direction, {"per_template": {}, "overall": {}})
        items = [*sft["per_template"].items(), ("overall", sft["overall"])]
        for template, s in items:
            p = pre["overall"] if template == "overall" else pre["per_template"].get(template, {})
            lines.append(
                f"{direction:9s} {template:10s} {s['n']:4d} {s.get(f'top{k}', float('nan')):9.3f} "
                f"{p.get(f'top{k}', float('nan')):9.3f}"
            )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- finetuning

#: Packages whose versions a finetune records.
FINETUNE_PACKAGES = ("torch", "transformers", "nnsight", "graft", "tokenizers", "accelerate")


def is_finished(out: str | Path) -> bool:
    """Whether ``out`` holds a finished finetune (it is only ever renamed into place whole)."""
    return (Path(out) / "eval.json").is_file() and (Path(out) / "finetune_config.json").is_file()


def partial_dir(out: str | Path) -> Path:
    """Where an unfinished finetune of ``out`` keeps its checkpoints."""
    return Path(out).with_name(Path(out).name + ".partial")


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


@contextlib.contextmanager
def _transformers_quiet(quiet: bool):
    """Inside: no transformers progress bars (checkpoint writing) and errors-only logging."""
    logging = transformers.utils.logging
    bars, verbosity = logging.is_progress_bar_enabled(), logging.get_verbosity()
    if quiet:
        logging.disable_progress_bar()
        logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def finetune(
    model: str,
    dataset: str | Path,
    out: str | Path,
    config: FinetuneConfig | str = "cpu",
    *,
    train_set: str | None = None,
    device: str | None = None,
    callbacks: Sequence[transformers.TrainerCallback] = (),
    quiet: bool = False,
) -> Path:
    """Finetune ``model`` on the dataset folder ``dataset`` into ``out``; return ``out``.

    A finished ``out`` is returned as is. An interrupted run resumes from the last checkpoint
    in ``<out>.partial``; that folder is refused if it was started with other settings.

    Args:
        model: registry name, hub id or local model folder (see :func:`graft.models.load_model`).
        dataset: dataset folder (``train.jsonl``, ``test_prompts.jsonl``, ``manifest.json``).
        out: output folder for the finished model.
        config: a :class:`FinetuneConfig` or a preset name.
        train_set: ``"A"``/``"B"`` to train on one set of a split dataset.
        device: ``"cpu"``/``"cuda"``; default CUDA when available.
        callbacks: extra ``TrainerCallback`` objects (tests use one to interrupt a run).
        quiet: no progress bars.

    Raises:
        FinetuneError: bad dataset, config or output folder, or no usable test prompt
            (nothing is written).
        graft.models.ModelNotFoundError: unknown model.
        graft.models.DeviceError: unknown device, or one this machine does not have.
    """
    with _transformers_quiet(quiet):
        return _run_finetune(
            model, dataset, out, config, train_set=train_set, device=device,
            callbacks=callbacks, quiet=quiet,
        )  # fmt: skip


def _run_finetune(
    model: str,
    dataset: str | Path,
    out: str | Path,
    config: FinetuneConfig | str = "cpu",
    *,
    train_set: str | None = None,
    device: str | None = None,
    callbacks: Sequence[transformers.TrainerCallback] = (),
    quiet: bool = False,
) -> Path:
    out = Path(out)
    cfg = resolve_config(config)  # checks a given FinetuneConfig's ranges too
    if is_finished(out):
        print(f"graft: finetune already done: {out}")
        return out
    if out.exists():
        raise FinetuneError(f"output folder {out} exists but is not a finished finetune; remove it")
    resolve_model_name(model)
    dev = resolve_device(device)
    data = load_fact_dataset(dataset, train_set)
    generic = load_generic_texts(cfg.generic_corpus) if cfg.generic_ratio > 0 else []
    # Float32 master weights; fp16 (when asked for on CUDA) is autocast by the Trainer.
    loaded: LoadedModel = load_model(model, dtype=torch.float32, device=dev)
    tok = loaded.tokenizer
    examples, drops = _usable_test_prompts(data.path, loaded)

    run_info = {
        "model": loaded.describe(),
        "dataset": str(data.path.resolve()),
        "train_set": data.train_set,
        "config": cfg.to_dict(),
    }
    partial = partial_dir(out)
    run_path = partial / "run.json"
    if run_path.is_file() and json.loads(run_path.read_text()) != run_info:
        raise FinetuneError(
            f"{partial} holds an unfinished finetune with other settings; remove it or rerun "
            "with the same model, dataset and config"
        )
    partial.mkdir(parents=True, exist_ok=True)
    _write_json(partial / "run.json", run_info)

    transformers.set_seed(cfg.seed)
    train_texts, val_texts = split_texts(
        [r["text"] for r in data.train], cfg.val_fraction, cfg.seed
    )
    n_generic = round(cfg.generic_ratio * len(train_texts)) if generic else 0
    if n_generic:
        picked = [generic[i % len(generic)] for i in range(n_generic)]
        random.Random(cfg.seed + 1).shuffle(picked)
        train_texts = train_texts + picked

    pre_path = partial / "eval_pre.json"
    if pre_path.is_file():
        pre_eval = json.loads(pre_path.read_text())
    else:
        pre_eval = evaluate_examples(
            loaded.model, examples, pad_id=tok.pad_token_id, desc="eval PRE", progress=not quiet
        )
        _write_json(pre_path, pre_eval)

    positions = getattr(loaded.model.config, "n_positions", None)  # GPT-2's learned positions
    max_length = min(cfg.max_length, positions) if positions else cfg.max_length
    train_ds = _TokenisedTexts(train_texts, tok, max_length)
    val_ds = _TokenisedTexts(val_texts, tok, max_length)
    ckpt_dir = partial / "checkpoints"
    steps_per_epoch = max(1, -(-len(train_ds) // cfg.batch_size))
    args = transformers.TrainingArguments(
        output_dir=str(ckpt_dir),
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        warmup_steps=cfg.warmup_steps,
        lr_scheduler_type="linear",
        optim="adamw_torch",
        eval_strategy="epoch",
        save_strategy="epoch",
        save_total_limit=1,  # plus the best one, which the Trainer always keeps
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        greater_is_better=False,
        logging_strategy="steps",
        logging_steps=max(1, steps_per_epoch // 4),
        seed=cfg.seed,
        data_seed=cfg.seed,
        fp16=cfg.fp16_on_cuda and dev.type == "cuda",
        use_cpu=dev.type == "cpu",
        report_to="none",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        disable_tqdm=quiet,
        log_level="error" if quiet else "passive",
    )
    trainer = transformers.Trainer(
        model=loaded.model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=val_ds,
        data_collator=_CausalCollator(tok.pad_token_id),
        processing_class=tok,
        callbacks=list(callbacks),
    )
    if quiet:  # without tqdm the Trainer prints every log dict instead
        trainer.remove_callback(transformers.PrinterCallback)
    resume = None
    if ckpt_dir.is_dir():
        resume = transformers.trainer_utils.get_last_checkpoint(str(ckpt_dir))
    if resume:
        print(f"graft: resuming finetune from {resume}")
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume)
    wall = time.perf_counter() - t0

    result = partial / "result"
    if result.exists():
        shutil.rmtree(result)
    trainer.save_model(str(result))
    tok.save_pretrained(str(result))
    evaluation = {
        "target": "first token of ' ' + second_actor after the prompt; logits at the last prompt token",
        "ks": list(EVAL_KS),
        "test_prompts": drops.summary(),
        "dropped": drops.dropped,
        "sft": evaluate_examples(
            trainer.model, examples, pad_id=tok.pad_token_id, desc="eval SFT", progress=not quiet
        ),
        "pre": pre_eval,
    }
    state = trainer.state
    best = state.best_model_checkpoint
    _write_json(
        result / "finetune_config.json",
        {
            **run_info,
            "seed": cfg.seed,
            "n_train_texts": len(train_texts),
            "n_val_texts": len(val_texts),
            "n_generic_texts": n_generic,
            "device": dev.type,
            "versions": package_versions(FINETUNE_PACKAGES),
        },
    )
    _write_json(result / "data_manifest.json", data.manifest)
    _write_json(
        result / "train_log.json",
        {
            "best_checkpoint": Path(best).name if best else None,
            "best_val_loss": state.best_metric,
            "global_step": state.global_step,
            "train_seconds_this_session": round(wall, 1),
            "resumed_from": Path(resume).name if resume else None,
            "log_history": state.log_history,
        },
    )
    _write_json(result / "eval.json", evaluation)
    os.rename(result, out)
    shutil.rmtree(partial, ignore_errors=True)
    if not quiet:
        print(format_eval(evaluation))
    print(f"graft: finetuned model saved to {out}")
    return out


# ----------------------------------------------------------------------------- workspace

#: Variant aliases: ``task`` / ``relation`` are the two halves of a split one-direction dataset.
VARIANT_ALIASES = {"task": "one-A", "relation": "one-B"}


def default_workspace() -> Path:
    """``$GRAFT_WORKSPACE``, else ``./workspace``."""
    return Path(os.environ.get("GRAFT_WORKSPACE") or "workspace")


def parse_variant(variant: str) -> tuple[str, str | None]:
    """``"one"``, ``"both"``, ``"<direction>-A"``/``"-B"``, ``"task"``, ``"relation"`` ->
    (direction, train set or ``None`` for an unsplit dataset)."""
    direction, _, train_set = VARIANT_ALIASES.get(variant, variant).partition("-")
    if direction not in graft_data.DIRECTIONS or train_set not in ("", "A", "B"):
        raise FinetuneError(
            f"unknown data variant {variant!r}; use one, both, one-A, one-B, both-A, both-B, "
            "task (= one-A) or relation (= one-B)"
        )
    return direction, train_set or None


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text).strip("-.") or "x"


def model_slug(model: str) -> str:
    """Folder name of a model in the workspace."""
    source, location = resolve_model_name(model)
    if source == "local":
        path = Path(location).resolve()
        return f"{_slug(path.name)}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    if source == "hub" and model not in HUB_MODELS:
        return _slug(location.replace("/", "--"))
    return _slug(model if source != "tiny" else "tiny-" + location)


def dataset_label(dataset_dir: str | Path, workspace: str | Path | None = None) -> str:
    """Folder name of a dataset in the workspace: its own name for datasets generated there,
    else its name plus a hash of its manifest (so two folders of one name never collide)."""
    path = Path(dataset_dir).resolve()
    ws = (Path(workspace) if workspace is not None else default_workspace()).resolve()
    if path.parent == ws / "datasets":
        return path.name
    key = path / ("manifest.json" if (path / "manifest.json").is_file() else "train.jsonl")
    return f"{_slug(path.name)}-{hashlib.sha256(key.read_bytes()).hexdigest()[:8]}"


def workspace_dataset(
    kind: str,
    direction: str = "one",
    split: bool = False,
    *,
    n_facts: int | None = None,
    seed: int = 0,
    workspace: str | Path | None = None,
) -> Path:
    """The dataset folder of this config under ``<workspace>/datasets``, generated if missing."""
    ws = Path(workspace) if workspace is not None else default_workspace()
    config = graft_data.DatasetConfig(
        kind=kind, n_facts=n_facts, seed=seed, direction=direction, split=split
    )
    try:
        graft_data.validate_config(config)
        out = ws / "datasets" / graft_data.default_dataset_name(config)
        return graft_data.generate_dataset(config, out)
    except graft_data.DatasetError as err:
        raise FinetuneError(str(err)) from None


def finetuned_dir(
    model: str,
    dataset_dir: str | Path,
    train_set: str | None,
    config: FinetuneConfig,
    workspace: str | Path | None = None,
) -> Path:
    """``<workspace>/finetuned/<model>/<dataset>/<set>/<config key>``."""
    ws = Path(workspace) if workspace is not None else default_workspace()
    label = dataset_label(dataset_dir, ws)
    return ws / "finetuned" / model_slug(model) / label / (train_set or "all") / config.key()


def find_or_finetune(
    model: str = DEFAULT_MODEL,
    dataset: str | Path = "fake_movies_real_actors",
    variant: str = "one",
    preset: str | FinetuneConfig = "cpu",
    workspace: str | Path | None = None,
    *,
    n_facts: int | None = None,
    data_seed: int = 0,
    device: str | None = None,
    quiet: bool = False,
) -> Path:
    """The finetuned model folder for (model, dataset, variant, preset); finetunes first if missing.

    Args:
        model: registry name, hub id or local model folder.
        dataset: a data kind (:data:`graft.study.data.KINDS`, generated into the workspace) or a
            dataset folder.
        variant: see :func:`parse_variant` (direction, and set A/B of a split dataset). With a
            dataset folder the direction must match its manifest.
        preset: preset name or a :class:`FinetuneConfig`.
        workspace: default ``$GRAFT_WORKSPACE`` or ``./workspace``.
        n_facts: facts per set when generating the dataset (default: the data module's).
        data_seed: seed of the generated dataset.
        device: training device.
        quiet: no progress bars.
    """
    ws = Path(workspace) if workspace is not None else default_workspace()
    cfg = resolve_config(preset)
    direction, train_set = parse_variant(variant)
    resolve_model_name(model)
    if Path(dataset).is_dir():
        dataset_dir = Path(dataset)
        manifest_direction = (
            graft_data.load_manifest(dataset_dir).get("direction")
            if (dataset_dir / "manifest.json").is_file()
            else None
        )
        if manifest_direction not in (None, direction):
            raise FinetuneError(
                f"dataset {dataset_dir} has direction {manifest_direction!r}, variant {variant!r} "
                f"asks for {direction!r}"
            )
        data_args = f"--dataset {dataset_dir}"
    else:
        kind = str(dataset)
        if kind not in graft_data.KINDS or kind == "custom":
            raise FinetuneError(
                f"dataset {kind!r} is neither a dataset folder nor a data kind "
                f"({', '.join(k for k in graft_data.KINDS if k != 'custom')})"
            )
        dataset_dir = workspace_dataset(
            kind, direction, train_set is not None, n_facts=n_facts, seed=data_seed, workspace=ws
        )
        data_args = f"--dataset {kind}"
        if n_facts is not None:
            data_args += f" --n-facts {n_facts}"
        if data_seed:
            data_args += f" --data-seed {data_seed}"
    out = finetuned_dir(model, dataset_dir, train_set, cfg, ws)
    if is_finished(out):
        return out
    if cfg.key() == cfg.name:
        command = (
            f"graft-exp finetune --model {model} {data_args} --variant {variant} "
            f"--preset {cfg.name} --workspace {ws}"
        )
        print(
            f"graft: no finetuned {model} for this data in {ws}; finetuning now (standalone: {command})"
        )
    else:
        print(f"graft: no finetuned {model} for this data in {ws}; finetuning now ({cfg.key()})")
    return finetune(model, dataset_dir, out, cfg, train_set=train_set, device=device, quiet=quiet)
