"""The rows of an experiment: its test prompts (selected, tokenized, sampled) times its grafts,
each checked before anything runs."""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from graft.core.families.arch import architecture_of
from graft.core.language.spans import ALIASES
from graft.core.planning.plan import GraftRow, resolve_rows
from graft.errors import ExperimentError, SpecError
from graft.study.data.datasets import check_dataset_folder
from graft.study.data.files import read_jsonl
from graft.study.data.prompts import TestExample, load_test_prompts
from graft.study.specs.grafts import NamedGraft
from graft.study.specs.run import DataSpec

logger = logging.getLogger(__name__)


def sample_examples(examples: Sequence[TestExample], n: int | None, seed: int) -> list[TestExample]:
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


def load_examples(
    data_path: Path, tokenizer: Any, data: DataSpec, max_length: int | None = None
) -> tuple[list[TestExample], dict[str, dict[str, int]]]:
    """Test examples of the selected templates and ``template -> drop reason -> count``;
    prompts longer than ``max_length`` tokens (with ``data.score_full_name``: prompt and target
    but its last token) are dropped as ``too_long``."""
    check_dataset_folder(data_path, ["test_prompts.jsonl"])
    records = read_jsonl(data_path / "test_prompts.jsonl")
    available = sorted({r["template"] for r in records})
    templates = list(dict.fromkeys(data.templates)) if data.templates else available
    unknown = [t for t in templates if t not in available]
    if unknown:
        raise ExperimentError(
            f"templates {','.join(unknown)}: not in {data_path}; available: "
            f"{', '.join(available) or 'none (regenerate the dataset)'}",
            param="templates",
        )
    examples: list[TestExample] = []
    drops: dict[str, dict[str, int]] = {}
    for template in templates:
        found, report = load_test_prompts(
            data_path,
            tokenizer,
            [template],
            directions=data.directions,
            max_length=max_length,
            whole_target=data.score_full_name,
        )
        examples += found
        drops[template] = dict(report.dropped)
    if not examples:
        raise ExperimentError(
            f"no usable test prompts for templates {templates} and directions "
            f"{list(data.directions)} in {data_path} (dropped: {drops}); "
            + (
                "its test_prompts.jsonl is empty: regenerate the dataset"
                if not records
                else "choose other templates or directions, or a model with more positions "
                "(too_long) or a dataset this tokenizer can score"
            ),
            param="templates",
        )
    return examples, drops


def check_grafts(grafts: Sequence[NamedGraft], donors: Mapping[str, Any]) -> None:
    """Refuse grafts that would give a wrong or meaningless table: none at all, a nameless
    one, two of one name in one group (their rows would be pooled into one result), or one
    using a donor not in ``donors``."""
    if not grafts:
        raise ExperimentError("no grafts to run")
    seen: dict[tuple[str, str], NamedGraft] = {}
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
            raise ExperimentError(
                f"graft {g.name!r} uses donor(s) {sorted(missing)} not loaded (loaded: "
                f"{sorted(donors)}); write a loaded one after '@' in its spec, or add the "
                "missing one to donors",
                param="donors",
            )


def check_span_names(grafts: Sequence[NamedGraft], data_path: Path) -> None:
    """Fail on a graft naming a span that no template of the dataset has (a typo, not M on
    the headline template, which is skipped there)."""
    known = set(ALIASES)
    for record in read_jsonl(data_path / "test_prompts.jsonl"):
        known |= set(record.get("fields", {}))
    for g in grafts:
        unknown = g.spec.span_names() - known
        if unknown:
            raise ExperimentError(
                f"graft {g.name!r} names span(s) {', '.join(sorted(unknown))} that no test "
                f"prompt has; spans: LT, {', '.join(sorted(known))}"
            )


def graft_rows(
    examples: Sequence[TestExample], grafts: Sequence[NamedGraft], rows: Sequence[tuple[int, int]]
) -> list[GraftRow]:
    """The engine rows of (example index, graft index) pairs."""
    return [
        GraftRow(examples[ei].input_ids, examples[ei].spans, grafts[gi].spec) for ei, gi in rows
    ]


def check_rows(
    model: nn.Module,
    examples: Sequence[TestExample],
    grafts: Sequence[NamedGraft],
    rows: Sequence[tuple[int, int]],
    donors: Collection[str],
) -> None:
    """Resolve every row's spec on the model (layers in range, spans not empty)."""
    try:
        resolve_rows(architecture_of(model), graft_rows(examples, grafts, rows), donors)
    except SpecError as err:
        raise ExperimentError(str(err)) from None


def plan_rows(
    examples: Sequence[TestExample], grafts: Sequence[NamedGraft]
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


def warn_empty_grafts(
    examples: Sequence[TestExample], grafts: Sequence[NamedGraft], skipped: Mapping[str, int]
) -> list[str]:
    """Warn of each graft that runs on none of ``examples`` (``skipped``: per graft the
    examples without its spans, :func:`plan_rows`): it would be missing from every table
    without a word but the skipped-pairs note. Returns their names."""
    empty = [g for g in grafts if examples and skipped.get(g.name, 0) == len(examples)]
    for g in empty:
        spans = ", ".join(sorted(g.spec.span_names()))
        templates = ", ".join(sorted({ex.template for ex in examples}))
        logger.warning(
            "graft %r runs on none of the %d test prompts (templates %s): none has its "
            "span(s) %s, so it is in no table; give templates that have them, or drop it",
            g.name,
            len(examples),
            templates,
            spans,
        )
    return [g.name for g in empty]


def skipped_note(examples: Sequence[TestExample], grafts: Sequence[NamedGraft]) -> str:
    """Why a run has fewer rows than prompts x grafts: a graft runs only on the prompts that
    have the spans it names; `` (27 pairs skipped: M, FE+M, M+LT on 6 prompts without M
    (headline, qa); ...)``, or ``""`` when none is skipped."""
    groups: dict[tuple[str, ...], list[str]] = {}
    lacking: dict[tuple[str, ...], list[TestExample]] = {}
    total = 0
    for g in grafts:
        needs = g.spec.span_names()
        without = [ex for ex in examples if not needs <= set(ex.spans)]
        if not without:
            continue
        missing = tuple(sorted(set().union(*(needs - set(ex.spans) for ex in without))))
        groups.setdefault(missing, []).append(g.name)
        lacking[missing] = without
        total += len(without)
    if not groups:
        return ""
    parts = []
    for missing, names in groups.items():
        templates = ", ".join(sorted({ex.template for ex in lacking[missing]}))
        parts.append(
            f"{', '.join(names)} on {len(lacking[missing])} prompts without "
            f"{' or '.join(missing)} ({templates})"
        )
    return f" ({total} prompt-graft pairs skipped: {'; '.join(parts)})"


def check_row_keys(
    examples: Sequence[TestExample], grafts: Sequence[NamedGraft], rows: Sequence[tuple[int, int]]
) -> None:
    """Raise unless every planned row has a key of its own: (group, graft, template,
    prompt_id), what the summary and the paired contrasts match prompts on (two rows of one
    key were found only after every row ran)."""
    counts = Counter(
        (grafts[gi].group, grafts[gi].name, examples[ei].template, examples[ei].prompt_id)
        for ei, gi in rows
    )
    repeated = [key for key, n in counts.items() if n > 1]
    if not repeated:
        return
    ids = list(dict.fromkeys(f"{t}/{p}" for _, _, t, p in repeated))
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    n_rows = sum(counts[key] for key in repeated)
    raise ExperimentError(
        f"{n_rows} planned rows repeat a (group, graft, template, prompt_id) key: the test "
        f"prompts repeat the ids {shown} (template/prompt_id); give every test prompt an id "
        "of its own (fix or regenerate the dataset)"
    )
