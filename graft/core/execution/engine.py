"""The one execution loop: rows in, final-position logits out, batch by batch.

:func:`run_grafts` resolves every row's spec (bad input fails before any compute), sorts the
rows by length, plans each batch (:mod:`graft.core.planning.plan`), hands the plans to an *executor*
and scatters the logits it returns back into input order. The executor decides where a plan
runs: :class:`LocalExecutor` runs each in one nnsight trace on this machine; a remote
executor (``graft.remote.executor.RemoteExecutor``) packs plans into requests to an NDIF
server. Both run the same trace code (:mod:`graft.core.execution.trace`), so they give the same
numbers (:mod:`graft.core.execution.executor`). :func:`graft.core.api.texts.graft_texts` is the
notebook entry point on text prompts; :mod:`graft.core.execution.inputs` says what models and rows
it accepts.

Locally each (position, module) cell is computed once, with the weights it uses (the routing
is :mod:`graft.core.execution.routing`):

- a row runs on its *carrier* (:mod:`graft.core.planning.carrier`), the model that supplies most of
  its work, with the other models' modules grafted at the remaining cells: a complement
  such as ``LT^C:all:all`` is a donor forward with the base's modules at the last token,
  and a donor's whole forward (``ALL:all:all; head=donor``) is that plain forward;
- rows of one prompt that graft the same cells before its last token (nothing, for rows
  that graft only their last token; the first entity, for FE and FE+LT) share that prefix
  (:mod:`graft.core.planning.prefix`): it runs once with a key/value cache and each row runs only
  its last token, in a trace;
- a batch that grafts nothing runs without a trace.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, cast

import torch
from torch import nn

from graft.core.execution.executor import Executor, LocalExecutor
from graft.core.execution.head import DeferredLogits, HeadProducts
from graft.core.execution.inputs import (
    as_donors,
    as_list,
    check_donors,
    check_lengths,
    is_loaded,
    model_of,
)
from graft.core.execution.module_tables import donor_modules
from graft.core.execution.routing import engine_path, route_rows
from graft.core.execution.trace import unpack_row_metrics
from graft.core.families.arch import Architecture, architecture_of
from graft.core.families.wrapping import unwrap
from graft.core.language.spec import ResolvedGraft
from graft.core.planning.carrier import BASE
from graft.core.planning.plan import (
    BatchPlan,
    GraftRow,
    LayoutCache,
    check_targets,
    default_pad_id,
    plan_batch,
    resolve_rows,
)
from graft.core.planning.plan_cache import layouts_for
from graft.core.planning.prefix import prefix_plans

__all__ = [
    "BatchPlan",
    "Executor",
    "GraftRow",
    "LocalExecutor",
    "as_donors",
    "as_list",
    "donor_modules",
    "engine_path",
    "is_loaded",
    "run_grafts",
    "score_grafts",
]


def _plans(
    arch: Architecture,
    rows: Sequence[GraftRow],
    resolved: Sequence[ResolvedGraft],
    batches: Sequence[list[int]],
    *,
    pad_id: int,
    padding_side: str,
    skip: set[str],
    targets: torch.Tensor | None = None,
    top_k: int = 0,
    layouts: LayoutCache | None = None,
) -> Iterator[BatchPlan]:
    """One plan per batch of row indices. Donors in ``skip`` are the base itself: they
    compute what the base computes, so nothing is replaced (and calling the base's own
    module inside its trace would recurse). ``targets`` (one id per row) go to each plan.
    ``layouts``: row layouts kept from earlier calls (:mod:`graft.core.planning.plan_cache`)."""
    layouts = LayoutCache() if layouts is None else layouts
    for idx in batches:
        plan = plan_batch(
            arch,
            [rows[i] for i in idx],
            pad_id=pad_id,
            padding_side=padding_side,
            resolved=[resolved[i] for i in idx],
            layouts=layouts,
        )
        plan.patches = [p for p in plan.patches if p.donor not in skip]
        if targets is not None:
            plan.targets, plan.top_k = targets[torch.tensor(idx, dtype=torch.long)], top_k
        yield plan


def _batches(
    rows: Sequence[GraftRow],
    batch_size: int,
    sort_by_length: bool,
    indices: Sequence[int] | None = None,
) -> list[list[int]]:
    """Row indices (all, or ``indices``) cut into batches, sorted by length if asked."""
    order = list(range(len(rows))) if indices is None else list(indices)
    if sort_by_length:
        order.sort(key=lambda i: len(rows[i].input_ids))
    n_batches = math.ceil(len(order) / batch_size) if order else 0
    return [order[b * batch_size : (b + 1) * batch_size] for b in range(n_batches)]


def _progress_bar(progress: bool | str, total: int):
    if not progress:
        return None
    from tqdm.auto import tqdm

    desc = progress if isinstance(progress, str) else "grafting"
    return tqdm(total=total, desc=desc, unit="row")


def _scatter(
    batches: Sequence[list[int]],
    results: Iterable[torch.Tensor | DeferredLogits],
    n_rows: int,
    bar,
) -> torch.Tensor:
    """Per-batch logits into one [n_rows, vocab] CPU tensor in input order (float32, or
    float64 for a float64 model); the logits of batches that kept their head's inputs
    (:class:`graft.core.execution.head.DeferredLogits`) computed into the head's kept buffer
    (:class:`graft.core.execution.head.HeadProducts`) and copied into it."""
    out: torch.Tensor | None = None
    products = HeadProducts()
    try:
        for idx, logits in zip(batches, results, strict=True):
            if isinstance(logits, DeferredLogits):
                logits = products(logits)  # valid until the next batch's: copied below
            if logits.dtype != torch.float64:
                logits = logits.float()
            logits = logits.cpu()
            if out is None:
                out = torch.empty((n_rows, logits.shape[-1]), dtype=logits.dtype)
            out[torch.tensor(idx)] = logits
            del logits  # not held while the next batch runs
            if bar is not None:
                bar.update(len(idx))
    finally:
        products.close()
    return out if out is not None else torch.empty((0, 0))


Job = tuple[list[list[int]], Iterator[torch.Tensor | DeferredLogits]]


def _step_layouts(
    kept: Callable[[Hashable], LayoutCache], carrier: str | None, model: str
) -> LayoutCache:
    """The kept layouts of steps on ``carrier``'s prefixes that ``model`` runs."""
    return kept(("step", carrier, model))


def _local_jobs(
    executor: LocalExecutor,
    base,
    donors: Mapping[str, nn.Module | None],
    arch: Architecture,
    rows: Sequence[GraftRow],
    resolved: Sequence[ResolvedGraft],
    same: set[str],
    batch_size: int,
    sort_by_length: bool,
    planning: dict,
) -> list[Job]:
    """(row batches, their results) per way of running (:func:`route_rows`), on this machine."""

    def kept(scope: Hashable) -> LayoutCache:
        return layouts_for(unwrap(base), arch, donors, scope)

    routes = route_rows(
        arch,
        unwrap(base),
        rows,
        resolved,
        donors,
        same,
        batch_size,
        kept=kept,
    )
    on_donor = {**donors, BASE: base}  # a donor's run grafts the base's modules too

    def carried_by(carrier: str | None) -> tuple[Any, Mapping[str, Any]]:
        return (base, donors) if carrier is None else (donors[carrier], on_donor)

    jobs: list[Job] = []
    for carrier, idx in routes.traced.items():
        batches = _batches(rows, batch_size, sort_by_length, idx)
        plans = _plans(
            arch,
            rows,
            routes.resolved,
            batches,
            skip=set(),
            layouts=kept(("traced", carrier)),
            **planning,
        )
        jobs.append((batches, executor.run(*carried_by(carrier), plans)))
    bare_rows = [GraftRow(r.input_ids) for r in rows] if routes.plain else []
    bare = [ResolvedGraft({})] * len(bare_rows)
    for name, idx in routes.plain.items():
        batches = _batches(rows, batch_size, sort_by_length, idx)
        plans = _plans(arch, bare_rows, bare, batches, skip=set(), **planning)
        jobs.append((batches, executor.run(donors[name], {}, plans)))
    for carrier, idx in routes.prefix.items():
        steps = prefix_plans(
            arch,
            rows,
            routes.resolved,
            idx,
            batch_size,
            pad_id=planning["pad_id"],
            targets=planning["targets"],
            top_k=planning["top_k"],
            kept=(kept(("step", carrier)), kept(("prefix", carrier))),
            steps_on=routes.steps,
            step_layouts=partial(_step_layouts, kept, carrier),
        )
        batches = [step_rows for step_rows, _ in steps]
        plans = (plan for _, plan in steps)
        # every model by name: a step may run on another model than the prefixes' carrier
        jobs.append((batches, executor.run(carried_by(carrier)[0], on_donor, plans)))
    return jobs


def checked_inputs(
    base, donors, rows: Sequence[GraftRow], pad_id: int | None
) -> tuple[Any, dict[str, Any], Architecture, set[str], int, list[ResolvedGraft]]:
    """What every run checks and resolves before any compute: ``(base, donors, arch, same,
    pad_id, resolved)``, the base and donors as models (:func:`model_of`,
    :func:`as_donors`), the base's architecture, the donors that are the base itself, the
    pad id (default: the config's) and every row's spec resolved (bad specs fail here)."""
    base, donors = model_of(base), as_donors(donors)
    torch_base = unwrap(base)
    arch = architecture_of(torch_base)
    check_lengths(torch_base, rows)
    same = check_donors(torch_base, donors)
    if pad_id is None:
        pad_id = default_pad_id(torch_base.config)
    return base, donors, arch, same, pad_id, resolve_rows(arch, rows, donors)


def run_grafts(
    base,
    donors,
    rows: Sequence[GraftRow],
    *,
    batch_size: int = 16,
    padding_side: str = "left",
    pad_id: int | None = None,
    log_probs: bool = False,
    progress: bool | str = False,
    sort_by_length: bool = True,
    executor: Executor | None = None,
) -> torch.Tensor:
    """Final-position logits of every (prompt, graft) row, batched, one trace per batch.

    Args:
        base: the pretrained model (HF causal LM, its nnsight wrapper, or a
            ``graft.models.LoadedModel``). A remote executor uses only its module tree and
            config, so a weightless meta copy will do there.
        donors: ``{name: model}`` (a bare model means ``{"sft": model}``; models may be
            ``LoadedModel`` objects). Donor names alone (``["sft"]``) or ``{name: None}``
            go with an executor whose server holds the donors.
        rows: ``GraftRow``s; each has its own prompt, spans and spec.
        batch_size: rows per forward pass.
        padding_side: ``"left"`` (only the last position's logits are computed) or ``"right"``.
        pad_id: id used for padding (masked out; default: the config's pad/eos id or 0).
        log_probs: return log-softmax instead of logits.
        progress: show a tqdm bar (a string is used as its description).
        sort_by_length: batch rows of similar length together (results keep input order).
        executor: where the batches run (default: :class:`LocalExecutor`, this machine).

    Returns:
        tensor [len(rows), vocab] on CPU: float32 (float64 if the model is float64).
    """
    out = _run_rows(
        base, donors, rows, batch_size, padding_side, pad_id, progress, sort_by_length, executor
    )
    return torch.log_softmax(out, dim=-1) if log_probs and out.numel() else out


def score_grafts(
    base,
    donors,
    rows: Sequence[GraftRow],
    targets: Sequence[int] | torch.Tensor,
    *,
    top_k: int = 5,
    batch_size: int = 16,
    padding_side: str = "left",
    pad_id: int | None = None,
    progress: bool | str = False,
    sort_by_length: bool = True,
    executor: Executor | None = None,
) -> dict[str, torch.Tensor]:
    """Per-row metrics of one target token per row, computed inside the trace (remotely: on
    the server, so a request returns ``2 + 2 * top_k`` numbers per row rather than a
    vocabulary of logits). The other arguments are :func:`run_grafts`'.

    Returns:
        the dict of :func:`graft.core.execution.trace.unpack_row_metrics`: ``target_logprob``
        and ``target_rank`` [rows], ``top_ids`` and ``top_logprobs`` [rows, top_k].
    """
    out = _run_rows(
        base,
        donors,
        rows,
        batch_size,
        padding_side,
        pad_id,
        progress,
        sort_by_length,
        executor,
        targets=targets,
        top_k=top_k,
    )
    return unpack_row_metrics(out, top_k)


def _run_rows(
    base,
    donors,
    rows: Sequence[GraftRow],
    batch_size: int,
    padding_side: str,
    pad_id: int | None,
    progress: bool | str,
    sort_by_length: bool,
    executor: Executor | None,
    targets: Sequence[int] | torch.Tensor | None = None,
    top_k: int = 5,
) -> torch.Tensor:
    """The rows' last-position logits, or with ``targets`` their packed metrics
    (:func:`graft.core.execution.trace.row_metrics`)."""
    base, donors, arch, same, pad_id, resolved = checked_inputs(base, donors, rows, pad_id)
    torch_base = unwrap(base)
    if targets is not None:
        vocab = int(cast(Any, torch_base.config).vocab_size)
        targets = check_targets(targets, len(rows), top_k, vocab)
    planning: dict[str, Any] = dict(
        pad_id=pad_id, padding_side=padding_side, targets=targets, top_k=top_k
    )
    runner: Executor = executor or LocalExecutor()
    if isinstance(runner, LocalExecutor) and getattr(runner, "shortcuts", True):
        jobs = _local_jobs(
            runner, base, donors, arch, rows, resolved, same, batch_size, sort_by_length, planning
        )
    else:  # every row grafted whole on the base, as planned (as a remote executor does)
        batches = _batches(rows, batch_size, sort_by_length)
        plans = _plans(arch, rows, resolved, batches, skip=same, **planning)
        jobs = [(batches, runner.run(base, donors, plans))]
    all_batches = [idx for batches, _ in jobs for idx in batches]
    results = [result for _, result in jobs]
    bar = _progress_bar(progress, len(rows))
    # grafted batches hand over their head's inputs where they can (graft.core.execution.head):
    # their logits are computed into one buffer, not a fresh allocation per batch
    deferring = (
        runner.deferring_head()
        if isinstance(runner, LocalExecutor) and targets is None
        else contextlib.nullcontext()
    )
    try:
        with deferring:
            out = _scatter(all_batches, itertools.chain(*results), len(rows), bar)
    finally:
        if bar is not None:
            bar.close()
    return out
