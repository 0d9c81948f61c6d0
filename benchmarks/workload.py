"""The benchmarks' workload on a real model: headline prompts for real actor names (the first
actor as the FE span), (prompt, graft) rows, and the baseline every ratio divides by: a
plain batched forward of the base over the same rows, in the same batches and padding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from benchmarks._graft_api import (
    GraftRow,
    parse_spec,
)
from graft.errors import GraftError


class BenchmarkError(GraftError):
    """Bad benchmark input; the message is one line naming the problem and the fix."""


@dataclass
class Prompt:
    """One tokenized headline prompt.

    Args:
        text: the prompt text.
        input_ids: its token ids (BOS included when the tokenizer adds one).
        spans: named token positions; ``FE`` is the first actor.
    """

    text: str
    input_ids: list[int]
    spans: dict[str, list[int]]


def headline_prompts(tokenizer, n: int, max_tokens: int) -> list[Prompt]:
    """The first ``n`` headline prompts over the shipped real-actor names that tokenize fully."""
    from graft.core.spans import render, tokenize_with_spans
    from graft.study.data.names import load_real_actors, name_exclusion_reason
    from graft.study.specs.templates import TEST_TEMPLATES

    prompts: list[Prompt] = []
    for actor in load_real_actors():
        if name_exclusion_reason(actor) is not None:
            continue
        fields = {
            "first_actor": actor,
            "relation": "starred",
            "relation_preposition": "in",
            "preposition": "with",
        }
        text, chars = render(TEST_TEMPLATES["headline"], fields)
        tok = tokenize_with_spans(tokenizer, text, chars)
        if "FE" not in tok.spans or len(tok.input_ids) > max_tokens:
            continue
        prompts.append(Prompt(text, tok.input_ids, {"FE": tok.spans["FE"]}))
        if len(prompts) == n:
            return prompts
    raise BenchmarkError(
        f"only {len(prompts)} usable headline prompts for this tokenizer, {n} asked for; "
        "ask for fewer prompts"
    )


def graft_rows(prompts: Sequence[Prompt], grafts: dict[str, str]) -> list[GraftRow]:
    """One row per (prompt, graft), prompt-major."""
    specs = [parse_spec(text, name) for name, text in grafts.items()]
    return [GraftRow(p.input_ids, p.spans, spec) for p in prompts for spec in specs]


def batches_of(rows: Sequence[GraftRow], batch_size: int) -> list[list[int]]:
    """Row indices per batch, sorted by length the way the engine batches them."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].input_ids))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


@torch.no_grad()
def plain_forward(
    model: nn.Module, rows: Sequence[GraftRow], batch_size: int, pad_id: int
) -> torch.Tensor:
    """Last-token logits of the base alone over ``rows``: left padding, the engine's batches."""
    device = next(model.parameters()).device
    out: torch.Tensor | None = None
    for idx in batches_of(rows, batch_size):
        width = max(len(rows[i].input_ids) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        pos = torch.zeros((len(idx), width), dtype=torch.long)
        for j, i in enumerate(idx):
            n = len(rows[i].input_ids)
            ids[j, width - n :] = torch.as_tensor(list(rows[i].input_ids))
            mask[j, width - n :] = 1
            pos[j, width - n :] = torch.arange(n)
        logits = model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=pos.to(device),
            logits_to_keep=1,
        ).logits[:, -1]
        logits = logits.cpu() if logits.dtype == torch.float64 else logits.float().cpu()
        if out is None:
            out = torch.empty((len(rows), logits.shape[-1]), dtype=logits.dtype)
        out[torch.tensor(idx)] = logits
    assert out is not None
    return out
