"""What a run will compute, counted before anything loads: its prompts, (prompt, graft) rows
and batches per replicate, the longest prompt and the stored batches' shapes, on the
tokenized prompts as the run makes them when the tokenizer is here, else on the stored
prompts' fields."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graft.core.language.spans import ALIASES
from graft.models.configs import FoundConfig
from graft.study.data import rows as checked_rows
from graft.study.data.files import read_jsonl
from graft.study.data.rows import load_examples, plan_rows, sample_examples, skipped_note
from graft.study.planning.finetune_plan import Lengths, PlanWorkspace, longest
from graft.study.planning.remote_plan import BatchShape
from graft.study.specs.grafts import NamedGraft
from graft.study.specs.run import RunSpecs


@dataclass(frozen=True)
class RowCounts:
    """The rows of a run, as :func:`count_rows` counts them.

    Args:
        prompts: test prompts of the first replicate.
        rows: its (prompt, graft) rows.
        length: its longest prompt.
        skipped: why rows are skipped (:func:`~graft.study.data.rows.skipped_note`; ``""``
            when none is).
        all_rows: rows of every replicate.
        batches: batches of every replicate.
        shapes: each batch's shape, every replicate's in order (a remote plan's requests).
    """

    prompts: int
    rows: int
    length: Lengths
    skipped: str
    all_rows: int
    batches: int
    shapes: list[BatchShape]


def count_rows(
    run: RunSpecs,
    grafts: Sequence[NamedGraft],
    direction: str,
    data: Mapping[int, Path],
    ws: PlanWorkspace,
    tokenizer: Any,
    found: FoundConfig,
) -> RowCounts:
    """Prompts, rows and batches of every replicate, the longest prompt and the stored
    batches' shapes (:class:`BatchShape`): on the tokenized prompts as the run makes them
    when the tokenizer is here, else on the stored prompts' fields."""
    seeds: dict[int, tuple[int, int, Lengths, list[tuple[int, int]] | None, str]] = {}
    for seed in dict.fromkeys(r.data_seed for r in run.replicates):
        read = data.get(seed) or ws.dataset(run.data.where(direction, seed))[1]
        seeds[seed] = _prompt_rows(run, grafts, read, tokenizer, found)
    # a control replicate runs only the grafts that read a finetuned model: counted as all
    per_replicate = [seeds[r.data_seed][1] for r in run.replicates]
    size = run.execution.batch_size
    shapes = []
    for rep in run.replicates:
        n, order = seeds[rep.data_seed][1], seeds[rep.data_seed][3]
        for start in range(0, n, size):
            if order is None:
                shapes.append(BatchShape(min(size, n - start), None))
                continue
            chunk = order[start : start + size]
            grafts_in, tokens = frozenset(g for g, _ in chunk), max(t for _, t in chunk)
            shapes.append(BatchShape(len(chunk), grafts_in, tokens))
    prompts, rows, length, _, skipped = seeds[run.replicates[0].data_seed]
    return RowCounts(
        prompts=prompts,
        rows=rows,
        length=length,
        skipped=skipped,
        all_rows=sum(per_replicate),
        batches=sum(math.ceil(n / size) for n in per_replicate),
        shapes=shapes,
    )


def _prompt_rows(
    run: RunSpecs,
    grafts: Sequence[NamedGraft],
    dataset: Path,
    tokenizer: Any,
    found: FoundConfig,
) -> tuple[int, int, Lengths, list[tuple[int, int]] | None, str]:
    """Prompts, rows, the longest prompt, each row's (graft index, tokens) in the run's
    order (None without the tokenizer: the order is the tokenized lengths') and why rows are
    skipped (:func:`skipped_note`)."""
    if tokenizer is not None:
        limit = getattr(found.config, "n_positions", None) or getattr(
            found.config, "max_position_embeddings", None
        )
        examples, _ = load_examples(dataset, tokenizer, run.data, limit)  # the folder checked
        checked_rows.check_span_names(grafts, dataset)
        examples = sample_examples(examples, run.data.n, run.data.sample_seed)
        rows, _ = plan_rows(examples, grafts)
        most = max((len(e.input_ids) for e in examples), default=1)
        order = [(gi, len(examples[ei].input_ids)) for ei, gi in rows]
        note = skipped_note(examples, grafts)
        return len(examples), len(rows), Lengths(most, True), order, note
    records = [
        r
        for r in read_jsonl(dataset / "test_prompts.jsonl")
        if (not run.data.templates or r["template"] in run.data.templates)
        and r["direction"] in run.data.directions
    ]
    checked_rows.check_span_names(grafts, dataset)
    per_template: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        per_template.setdefault(r["template"], []).append(r)
    kept = [r for rs in per_template.values() for r in rs[: run.data.n or len(rs)]]
    n_rows = sum(1 for r in kept for g in grafts if g.spec.span_names() <= _span_names(r))
    n_skipped = len(kept) * len(grafts) - n_rows
    note = (
        f" ({n_skipped} prompt-graft pairs skipped: a graft runs only on the prompts that "
        "have the spans it names)"
        if n_skipped
        else ""
    )
    return len(kept), n_rows, longest([r["text"] for r in kept], None, 10**6), None, note


def _span_names(record: Mapping[str, Any]) -> set[str]:
    fields = set(record.get("fields", {}))
    return fields | {alias for alias, parts in ALIASES.items() if set(parts) <= fields}
