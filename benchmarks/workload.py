"""The benchmarks' workload on a real model: headline prompts for real actor names (the first
actor as the FE span), (prompt, graft) rows, the E1 position and E3 component mixes with the
base and a perturbed donor they run on (:class:`Workload`), and the baseline every ratio
divides by: a plain batched forward of the base over the same rows, in the same batches and
padding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from benchmarks._graft_api import (
    GraftRow,
    default_pad_id,
    parse_spec,
    perturbed_copy,
    run_grafts,
)
from graft.errors import InputError
from graft.study import COMPONENT_SETS

#: E1: every component in every layer at each position set, plus the two references.
E1_GRAFTS = {
    "PRE": "none",
    "SFT": "ALL:all:all; head=donor",
    "FE": "FE:all:all",
    "LT": "LT:all:all",
    "FE+LT": "FE+LT:all:all",
    "(FE+LT)^C": "(FE+LT)^C:all:all",
    "FE^C": "FE^C:all:all",
    "LT^C": "LT^C:all:all",
}
#: E3: the paper's component sets (ATTN = q,k,v; FFN = gate,up,down) at LT, last quarter.
E3_GRAFTS = {name: f"LT:q4:{components}" for name, components in COMPONENT_SETS.items()}


class BenchmarkError(InputError):
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
    from graft.core import render, tokenize_with_spans
    from graft.study import TEST_TEMPLATES, load_real_actors, name_exclusion_reason

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


@dataclass
class Workload:
    """The models and rows of one benchmark run.

    Args:
        base: the base model.
        donors: ``{"sft": perturbed copy of the base}``.
        prompts: the headline prompts.
        e1: E1 rows (prompt-major, 8 grafts per prompt).
        e3: E3 rows (prompt-major, 8 grafts per prompt).
        fe_lt: one FE+LT row per prompt.
        batch_size: rows per forward pass (engine and plain alike).
        pad_id: padding id (engine and plain alike).
        device: the models' device.
        executor: the engine's executor (None: graft's default, shortcuts on).
    """

    base: nn.Module
    donors: dict[str, nn.Module]
    prompts: list[Prompt]
    e1: list[GraftRow]
    e3: list[GraftRow]
    fe_lt: list[GraftRow]
    batch_size: int
    pad_id: int
    device: torch.device
    executor: object | None = None

    def engine(self, rows: Sequence[GraftRow]) -> torch.Tensor:
        return run_grafts(
            self.base,
            self.donors,
            rows,
            batch_size=self.batch_size,
            pad_id=self.pad_id,
            executor=self.executor,  # type: ignore[arg-type]
        )

    def plain(self, rows: Sequence[GraftRow]) -> torch.Tensor:
        return plain_forward(self.base, rows, self.batch_size, self.pad_id)

    def widest_batch(self, rows: Sequence[GraftRow]) -> list[GraftRow]:
        return [rows[i] for i in batches_of(rows, self.batch_size)[-1]]


def build_workload(
    model: str,
    n_prompts: int,
    batch_size: int,
    *,
    dtype: str | None = None,
    device: str | None = None,
    seed: int = 1,
):
    """(loaded base, workload): the base, a perturbed donor and the E1/E3/FE+LT rows."""
    from graft.models import load_model

    loaded = load_model(model, dtype=dtype, device=device)
    base = loaded.model
    donor = perturbed_copy(base, seed=seed)
    workload = headline_workload(
        base, donor, loaded.tokenizer, n_prompts, batch_size, device=loaded.device
    )
    return loaded, workload


def headline_workload(
    base: nn.Module,
    donor: nn.Module,
    tokenizer,
    n_prompts: int,
    batch_size: int,
    *,
    device: torch.device,
    executor: object | None = None,
) -> Workload:
    """The E1, E3 and FE+LT rows of ``n_prompts`` headline prompts on ``base`` and ``donor``."""
    max_tokens = getattr(base.config, "max_position_embeddings", 10**9)
    prompts = headline_prompts(tokenizer, n_prompts, max_tokens)
    return Workload(
        base=base,
        donors={"sft": donor},
        prompts=prompts,
        e1=graft_rows(prompts, E1_GRAFTS),
        e3=graft_rows(prompts, E3_GRAFTS),
        fe_lt=graft_rows(prompts, {"FE+LT": E1_GRAFTS["FE+LT"]}),
        batch_size=batch_size,
        pad_id=default_pad_id(base.config),
        device=device,
        executor=executor,
    )
