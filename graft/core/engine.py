"""The one execution loop: rows in, final-position logits out, batch by batch.

:func:`run_grafts` resolves every row's spec (bad input fails before any compute), sorts the
rows by length, plans each batch (:mod:`graft.core.plan`), hands the plans to an *executor*
and scatters the logits it returns back into input order. Locally, a row whose graft is a
donor's own forward (every cell and the head from one donor: ``ALL:all:all; head=donor``)
runs as that plain forward, and a batch that grafts nothing runs without a trace. The executor decides where a plan
runs: :class:`LocalExecutor` runs each in one nnsight trace on this machine; a remote
executor (``graft.remote.executor.RemoteExecutor``) packs plans into requests to an NDIF
server. Both run the same trace code (:mod:`graft.core.trace`), so they give the same
numbers. :func:`graft.core.texts.graft_texts` is the notebook entry point on text prompts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

import torch
from torch import nn

from graft.core.arch import Architecture, architecture_of, check_compatible, context_length
from graft.core.plan import (
    BatchPlan,
    GraftRow,
    LayoutCache,
    SitePatch,
    check_targets,
    default_pad_id,
    plan_batch,
    resolve_rows,
)
from graft.core.spec import EMBEDDING_COMPONENTS, ResolvedGraft
from graft.core.trace import (
    graft_batch,
    model_device,
    row_metrics,
    trace_batch,
    unpack_row_metrics,
)
from graft.core.wrapping import unwrap, wrap
from graft.errors import SpecError

__all__ = [
    "BatchPlan",
    "Executor",
    "GraftRow",
    "LocalExecutor",
    "run_grafts",
]


class Executor(Protocol):
    """Runs planned batches somewhere; yields float logits [batch, vocab] per plan, in order
    (for a plan with ``targets``: its rows' metrics, :func:`graft.core.trace.row_metrics`).

    ``donors`` maps each donor name to its model, or to ``None`` where the executor needs no
    weights (a server that holds the donors).
    """

    def run(
        self, base, donors: Mapping[str, nn.Module | None], plans: Iterable[BatchPlan]
    ) -> Iterator[torch.Tensor]: ...


def donor_modules(
    donors: Mapping[str, nn.Module | None], patches: Sequence[SitePatch]
) -> dict[str, nn.Module]:
    """``{"donor:path": the donor's module at path}`` for every patch."""
    mods = {}
    for p in patches:
        key = f"{p.donor}:{p.path}"
        if key not in mods:
            if donors.get(p.donor) is None:
                raise SpecError(
                    f"the graft uses donor {p.donor!r} but its weights were not given; pass "
                    "the model in donors={...}"
                )
            mods[key] = unwrap(donors[p.donor]).get_submodule(p.path)
    return mods


class LocalExecutor:
    """Runs each planned batch in one nnsight trace on this machine."""

    def run(
        self, base, donors: Mapping[str, nn.Module | None], plans: Iterable[BatchPlan]
    ) -> Iterator[torch.Tensor]:
        for plan in plans:
            yield self.run_plan(base, donors, plan)

    def run_plan(self, base, donors: Mapping[str, nn.Module | None], plan: BatchPlan):
        """Logits [batch, vocab] at each row's last token, on the base's device."""
        torch_model = unwrap(base)
        batch = trace_batch(plan, torch_model, model_device(torch_model))
        if not plan.patches:  # nothing grafted: the model's own forward, no trace
            return _plain_forward(torch_model, batch)
        model, mods = wrap(base), donor_modules(donors, plan.patches)
        with torch.no_grad(), model.trace(**batch.inputs):
            logits = graft_batch(model, batch, mods).save()
        return logits


def _plain_forward(torch_model: nn.Module, batch) -> torch.Tensor:
    """What :func:`graft_batch` returns for a batch with no patches, without a trace."""
    with torch.no_grad():
        full = torch_model(**batch.inputs).logits
    picked = full[batch.rows.to(full.device), batch.pick.to(full.device)]
    if batch.targets is None:
        return picked
    return row_metrics(picked, batch.targets, batch.top_k)


def is_loaded(model) -> bool:
    """Whether ``model`` is a loaded-model record (``.model`` module and ``.tokenizer``)."""
    return (
        not isinstance(model, nn.Module)
        and isinstance(getattr(model, "model", None), nn.Module)
        and hasattr(model, "tokenizer")
    )


def _model_of(model):
    """The model itself when given a loaded model (``graft.models.LoadedModel``)."""
    return model.model if is_loaded(model) else model


def as_donors(donors) -> dict:
    """``{name: model}`` from a mapping, one model (named ``"sft"``), ``None`` (no donors)
    or donor names (``{name: None}``: weights held elsewhere, e.g. by a server); loaded
    models (``graft.models.LoadedModel``) are unwrapped."""
    if donors is None:
        return {}
    if isinstance(donors, nn.Module) or is_loaded(donors) or hasattr(donors, "trace"):
        donors = {"sft": donors}
    elif isinstance(donors, str):
        donors = {donors: None}
    elif not isinstance(donors, Mapping):
        names = as_list(donors)
        if not names or not all(isinstance(n, str) for n in names):
            raise SpecError(
                f"donors must be a model, a {{name: model}} mapping or donor names, not "
                f"{type(donors).__name__}"
            )
        donors = dict.fromkeys(names)
    return {name: _model_of(d) for name, d in donors.items()}


def _check_lengths(model: nn.Module, rows: Sequence[GraftRow]) -> None:
    """Refuse prompts longer than the positions the model was built for (GPT-2's learned
    positions would fail mid-run with an IndexError)."""
    limit = context_length(model)
    for i, row in enumerate(rows):
        if limit is not None and len(row.input_ids) > limit:
            raise SpecError(
                f"prompt {i} has {len(row.input_ids)} tokens but the model has only {limit} "
                "positions; shorten the prompt"
            )


def _check_donors(torch_base: nn.Module, donors: Mapping[str, nn.Module | None]) -> set[str]:
    """Every donor with weights fits the base. Returns the names of donors that ARE the base."""
    same = set()
    for name, donor in donors.items():
        if donor is None:
            continue
        if unwrap(donor) is torch_base:
            same.add(name)
        check_compatible(torch_base, unwrap(donor), name)
    return same


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
) -> Iterator[BatchPlan]:
    """One plan per batch of row indices. Donors in ``skip`` are the base itself: they
    compute what the base computes, so nothing is replaced (and calling the base's own
    module inside its trace would recurse). ``targets`` (one id per row) go to each plan."""
    layouts = LayoutCache()
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


def _every_cell(arch: Architecture) -> set[tuple[int, str]]:
    """Every (layer, component) cell key of ``arch``; layer -1 holds the embeddings."""
    cells = {(-1, c) for c in arch.components if c in EMBEDDING_COMPONENTS}
    layer_components = [c for c in arch.components if c not in EMBEDDING_COMPONENTS]
    return cells | {(layer, c) for layer in range(arch.n_layers) for c in layer_components}


def direct_donor(res: ResolvedGraft, length: int, every: set[tuple[int, str]]) -> str | None:
    """The donor whose own forward the graft ``res`` (on a prompt of ``length`` tokens)
    equals: every cell in ``every`` (:func:`_every_cell`) at every position from that one
    donor, its final norm and unembedding too (``ALL:all:all; head=donor``). Else None."""
    donor = res.final_norm_donor
    if donor is None or res.unembed_donor != donor or res.cells.keys() != every:
        return None
    positions = set(range(length))
    for cell in res.cells.values():
        if cell.keys() != positions or any(d != donor for d in cell.values()):
            return None
    return donor


def _direct_rows(
    arch: Architecture,
    rows: Sequence[GraftRow],
    resolved: Sequence[ResolvedGraft],
    donors: Mapping[str, nn.Module | None],
    same: set[str],
) -> dict[str, list[int]]:
    """Indices of the rows that are a donor's own forward, by donor (weights given, and not
    the base itself: those rows already graft nothing)."""
    every, direct = _every_cell(arch), {}
    for i, (row, res) in enumerate(zip(rows, resolved, strict=True)):
        donor = direct_donor(res, len(row.input_ids), every)
        if donor is not None and donor not in same and donors.get(donor) is not None:
            direct.setdefault(donor, []).append(i)
    return direct


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
    batches: Sequence[list[int]], results: Iterable[torch.Tensor], n_rows: int, bar
) -> torch.Tensor:
    """Per-batch logits into one [n_rows, vocab] CPU tensor in input order (float32, or
    float64 for a float64 model)."""
    out: torch.Tensor | None = None
    for idx, logits in zip(batches, results, strict=True):
        if logits.dtype != torch.float64:
            logits = logits.float()
        logits = logits.cpu()
        if out is None:
            out = torch.empty((n_rows, logits.shape[-1]), dtype=logits.dtype)
        out[torch.tensor(idx)] = logits
        if bar is not None:
            bar.update(len(idx))
    return out if out is not None else torch.empty((0, 0))


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
    targets: Sequence[int] | torch.Tensor | None = None,
    top_k: int = 5,
) -> torch.Tensor | dict[str, torch.Tensor]:
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
        targets: one target token id per row: return per-row metrics instead of logits,
            computed inside the trace (remotely: on the server, so a request returns
            ``2 + 2 * top_k`` numbers per row rather than a vocabulary of logits).
        top_k: how many most probable tokens the metrics list (with ``targets``).

    Returns:
        tensor [len(rows), vocab] on CPU: float32 (float64 if the model is float64). With
        ``targets``: the dict of :func:`graft.core.trace.unpack_row_metrics`
        (``target_logprob``, ``target_rank``, ``top_ids``, ``top_logprobs``).
    """
    base, donors = _model_of(base), as_donors(donors)
    torch_base = unwrap(base)
    arch = architecture_of(torch_base)
    _check_lengths(torch_base, rows)
    same = _check_donors(torch_base, donors)
    if pad_id is None:
        pad_id = default_pad_id(torch_base.config)
    resolved = resolve_rows(arch, rows, donors)  # bad specs fail before any compute
    if targets is not None:
        targets = check_targets(targets, len(rows), top_k, torch_base.config.vocab_size)
    # Locally, a row that is a donor's own forward runs as one (a remote executor grafts it).
    local = executor is None or isinstance(executor, LocalExecutor)
    direct = _direct_rows(arch, rows, resolved, donors, same) if local else {}
    is_direct = {i for idx in direct.values() for i in idx}
    grafted = [i for i in range(len(rows)) if i not in is_direct]
    planning = dict(pad_id=pad_id, padding_side=padding_side, targets=targets, top_k=top_k)
    batches = _batches(rows, batch_size, sort_by_length, grafted)
    plans = _plans(arch, rows, resolved, batches, skip=same, **planning)
    results, all_batches = [(executor or LocalExecutor()).run(base, donors, plans)], batches[:]
    bare_rows = [GraftRow(r.input_ids) for r in rows] if direct else []
    bare = [ResolvedGraft({})] * len(bare_rows)
    for name, idx in direct.items():
        donor_batches = _batches(rows, batch_size, sort_by_length, idx)
        donor_plans = _plans(arch, bare_rows, bare, donor_batches, skip=set(), **planning)
        results.append(LocalExecutor().run(donors[name], {}, donor_plans))
        all_batches += donor_batches
    bar = _progress_bar(progress, len(rows))
    try:
        out = _scatter(all_batches, itertools.chain(*results), len(rows), bar)
    finally:
        if bar is not None:
            bar.close()
    if targets is not None:
        return unpack_row_metrics(out, top_k)
    return torch.log_softmax(out, dim=-1) if log_probs and out.numel() else out


def as_list(items) -> list | None:
    """``list(items)``, or ``None`` for something that is not iterable."""
    try:
        return list(items)
    except TypeError:
        return None
