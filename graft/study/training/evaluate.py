"""How well a model recalls a dataset's facts: the numbers of a donor's ``eval.json``.

The model reads each test prompt (right-padded, so positions stay those of the unpadded
prompt); the logits at the last prompt token go through :func:`graft.results.metrics.example_metrics`
and :func:`graft.results.summary.summarize`, the same metrics the experiments report.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import polars as pl
import torch
import transformers
from tqdm.auto import tqdm

from graft.results.metrics import DEFAULT_KS, example_metrics
from graft.results.summary import summarize
from graft.study.data.prompts import TestExample

logger = logging.getLogger(__name__)

#: The k of the top-k accuracies in ``eval.json``.
EVAL_KS = DEFAULT_KS


def _batches(
    model: transformers.PreTrainedModel, examples: Sequence[TestExample], pad_id: int, size: int
) -> Iterator[tuple[Sequence[TestExample], list[list[int]], torch.Tensor]]:
    """(examples, prompts as read, last-token logits) per batch. Prompts longer than the
    model's learned positions (``n_positions``, e.g. the tiny GPT-2) keep their last tokens."""
    device = next(model.parameters()).device
    window = getattr(model.config, "n_positions", None)
    for start in range(0, len(examples), size):
        batch = examples[start : start + size]
        prompts = [e.input_ids[-window:] if window else e.input_ids for e in batch]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p)
            mask[i, : len(p)] = 1
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        last = torch.tensor([len(p) - 1 for p in prompts], device=device)
        yield batch, prompts, logits[torch.arange(len(batch), device=device), last]


def _stats(row: dict[str, Any], ks: Sequence[int]) -> dict[str, float]:
    """One ``summarize`` row as ``eval.json`` stats: n, top{k}, mean_rank, mean_prob."""
    out: dict[str, float] = {"n": row["n"]}
    out |= {f"top{k}": row[f"acc@{k}"] for k in ks}
    return out | {"mean_rank": row["mean_rank"], "mean_prob": row["mean_prob"]}


@torch.no_grad()
def evaluate_examples(
    model: transformers.PreTrainedModel,
    examples: Sequence[TestExample],
    *,
    pad_id: int,
    ks: Sequence[int] = EVAL_KS,
    batch_size: int = 16,
    desc: str = "eval",
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Top-k accuracy, mean rank and mean probability of each example's target token.

    Returns, per direction present (``"forward"``, ``"reverse"``),
    ``{"per_template": {template: stats}, "overall": stats}``; stats has ``n``, ``top{k}``
    for each k, ``mean_rank`` (0 = top) and ``mean_prob``. Prompts cut to the model's
    learned positions are counted under ``truncated`` in the overall stats.
    ``progress=False`` hides the progress bar.
    """
    model.eval()
    frames = []
    n_batches = -(-len(examples) // batch_size)
    batches = _batches(model, examples, pad_id, batch_size)
    bar = tqdm(batches, desc=desc, total=n_batches, leave=False, disable=not progress)
    for batch, prompts, logits in bar:
        metrics = example_metrics(logits, [e.target_id for e in batch], ks=ks)
        info = {
            "direction": [e.direction for e in batch],
            "template": [e.template for e in batch],
            "truncated": [len(p) < len(e.input_ids) for e, p in zip(batch, prompts, strict=True)],
        }
        frames.append(pl.concat([pl.DataFrame(info), metrics], how="horizontal"))
    result: dict[str, dict[str, Any]] = {}
    if not frames:
        return result
    table = pl.concat(frames)
    for (direction,), rows in table.partition_by(
        "direction", maintain_order=True, as_dict=True
    ).items():
        per = summarize(rows, by=["template"], ks=ks, n_boot=0).to_dicts()
        overall = _stats(summarize(rows, by=[], ks=ks, n_boot=0).row(0, named=True), ks)
        if rows["truncated"].any():
            overall["truncated"] = int(rows["truncated"].sum())
        result[direction] = {
            "per_template": {r["template"]: _stats(r, ks) for r in per},
            "overall": overall,
        }
    return result


def donor_evaluation(
    sft: dict[str, Any], pre: dict[str, Any], drops_summary: str, dropped: dict[str, int]
) -> dict[str, Any]:
    """The ``eval.json`` of a finetune: its and the pretrained model's evaluation."""
    return {
        "target": "first token of ' ' + second_actor after the prompt; logits at the last prompt token",
        "ks": list(EVAL_KS),
        "test_prompts": drops_summary,
        "dropped": dropped,
        "sft": sft,
        "pre": pre,
    }


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
