"""Executors: where planned batches run. :class:`LocalExecutor` runs each plan in one nnsight
trace on this machine (a step on shared prefixes first fills, or reuses, the prefixes'
key/value cache; a plan that grafts nothing runs the model's own forward); a remote executor
(``graft.remote.executor.RemoteExecutor``) packs plans into requests to an NDIF server.
Both run the same trace code (:mod:`graft.core.execution.trace`), so they give the same numbers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch import nn

from graft.core.execution import windows
from graft.core.execution.depth_share import SharedDepth, expanding_from, shared_depth
from graft.core.execution.head import (
    DeferredLogits,
    HeadOutputChanged,
    deferrable_head,
    note_head_changed,
)
from graft.core.execution.hooked import run_hooked
from graft.core.execution.module_tables import (
    ModuleTable,
    donor_modules,
    module_table,
    tables_once,
)
from graft.core.execution.prompt_values import PromptValues
from graft.core.execution.split import split_modules
from graft.core.execution.trace import (
    graft_batch,
    last_logits,
    model_device,
    row_metrics,
    trace_batch,
)
from graft.core.families.arch import family_of
from graft.core.families.wrapping import unwrap, wrap
from graft.core.planning.kv_cache import (
    cache_argument,
    concat_caches,
    gathers_per_layer,
    new_cache,
    prefix_cache,
    select_rows,
)
from graft.core.planning.plan import BatchPlan, SharedPrefix, SitePatch
from graft.core.planning.prefix import slice_rows


class Executor(Protocol):
    """Runs planned batches somewhere; yields float logits [batch, vocab] per plan, in order
    (for a plan with ``targets``: its rows' metrics,
    :func:`graft.core.execution.trace.row_metrics`).

    ``donors`` maps each donor name to its model, or to ``None`` where the executor needs no
    weights (a server that holds the donors). A :class:`LocalExecutor` yields a grafted
    plan's head inputs (:class:`graft.core.execution.head.DeferredLogits`) instead of logits, inside
    its :meth:`LocalExecutor.deferring_head` block only.
    """

    def run(
        self, base, donors: Mapping[str, nn.Module | None], plans: Iterable[BatchPlan]
    ) -> Iterator[torch.Tensor | DeferredLogits]: ...


@dataclass
class TraceParts:
    """What a user's grafted trace (:func:`graft.core.api.grafted_trace.trace`) runs on, from
    an executor's ``trace_parts``.

    Args:
        model: the nnsight envoy of the base the trace is opened on.
        device: where the batch's inputs go.
        donor_modules: ``"donor:path"`` -> the donor module there (or a hosted pair's
            envoy path of it).
        backend: the nnsight backend that runs the trace; None runs it here.
    """

    model: Any
    device: torch.device
    donor_modules: Mapping[str, Any]
    backend: Any = None


class LocalExecutor:
    """Runs each planned batch in one nnsight trace on this machine.

    With ``shortcuts`` (the default) every cell is computed once: :func:`run_grafts` routes
    rows to their carriers and onto shared prefixes (see the module docstring), a step on
    shared prefixes (a plan with ``prefix``, :mod:`graft.core.planning.prefix`) first runs its
    prefixes without a trace, keeping their key/value cache for the next steps on the same
    prefixes, and grafted matrix products run their own weights only on the cells no donor
    takes (:func:`~graft.core.execution.split.split_modules`). Without, every row is grafted whole
    on the base exactly as a remote executor does it, giving a remote run's numbers bit for bit.

    With ``hooks`` (the default, with shortcuts) a batch runs as one plain forward of the
    model with the grafted modules' forwards replaced for it (:mod:`graft.core.execution.hooked`),
    not in an nnsight trace: the same code at each grafted module, the same numbers bit for bit,
    without the trace's per-module host work. Without shortcuts every batch runs in an nnsight
    trace, as on a server.

    Args:
        shortcuts: compute each cell once (exact to rounding); False: the plain one-pass graft.
        hooks: run batches as plain forwards with grafted module forwards (with shortcuts
            only); False: in an nnsight trace.
        share_depth: a step's rows that are identical up to their first grafted layer run
            the layers below it once (:mod:`graft.core.execution.depth_share`; hooked path only).
        resume_layers: a whole-prompt batch's rows run from their first grafted layer on,
            the layers below it once per distinct prompt (:mod:`graft.core.execution.resume`;
            hooked path only; for sweeps of one-layer grafts).
    """

    def __init__(
        self,
        shortcuts: bool = True,
        hooks: bool = True,
        share_depth: bool = True,
        resume_layers: bool = False,
    ) -> None:
        self.shortcuts = shortcuts
        self.hooks = hooks
        self.share_depth = share_depth
        self.resume_layers = resume_layers
        #: (prefix plan, carrier, its key/value cache): the last step's prefixes
        self._kept_prefix: tuple[BatchPlan, nn.Module, Any] | None = None
        #: the models' :func:`~graft.core.execution.module_tables.module_table` lookup (:func:`~graft.core.execution.module_tables.tables_once`), while :meth:`run` runs
        self._tables: Callable[[nn.Module], ModuleTable] | None = None
        #: grafted batches yield their head's inputs (:meth:`deferring_head`)
        self._defer_head = False
        #: each prompt's layer inputs, kept across batches while :meth:`run` runs
        self._prompt_values = PromptValues()

    def run(
        self, base, donors: Mapping[str, nn.Module | None], plans: Iterable[BatchPlan]
    ) -> Iterator[torch.Tensor | DeferredLogits]:
        self._tables = tables_once()  # each model's tree walked once per run, not per batch
        try:
            for plan in plans:
                yield self.run_plan(base, donors, plan)
        finally:
            self._kept_prefix = None  # the last prefixes' cache
            self._tables = None
            self.prompt_values().clear()

    def prompt_values(self) -> PromptValues:
        """Per-prompt values kept across this run's batches (:mod:`graft.core.execution.resume`)."""
        kept = getattr(self, "_prompt_values", None)  # subclasses may skip __init__
        if kept is None:
            kept = self._prompt_values = PromptValues()
        return kept

    @contextlib.contextmanager
    def deferring_head(self) -> Iterator[None]:
        """Within the block, a grafted plan whose head can be computed after it
        (:mod:`graft.core.execution.head`) yields its rows' head inputs (:class:`DeferredLogits`)
        instead of logits: for a consumer that computes them, as :func:`run_grafts` does."""
        before = getattr(self, "_defer_head", False)
        self._defer_head = True
        try:
            yield
        finally:
            self._defer_head = before

    @contextlib.contextmanager
    def walking_once(self) -> Iterator[None]:
        """Within the block, each model's module tree is walked once (as within :meth:`run`),
        for calls of :meth:`run_on_cache`."""
        before = getattr(self, "_tables", None)
        self._tables = before or tables_once()
        try:
            yield
        finally:
            self._tables = before

    def _table(self, model: nn.Module) -> ModuleTable:
        """``model``'s :func:`~graft.core.execution.module_tables.module_table`, kept while :meth:`run` runs."""
        tables = getattr(self, "_tables", None)  # subclasses may skip __init__
        return module_table(model) if tables is None else tables(model)

    def run_plan(self, base, donors: Mapping[str, nn.Module | None], plan: BatchPlan):
        """Logits [batch, vocab] at each row's last token, on the base's device. A step with a
        ``step_model`` runs on that model of ``donors`` over the prefixes ``base`` computed."""
        runner = base if plan.step_model is None else donors[plan.step_model]
        torch_model = unwrap(runner)
        device = model_device(torch_model)
        batch = trace_batch(plan, torch_model, device)
        sharing: contextlib.AbstractContextManager = contextlib.nullcontext()
        if plan.prefix is not None:  # the prefixes are the base's, whoever runs the step
            cache = self._prefix_cache(base, donors, plan.prefix, device)
            index = plan.prefix.prompt_index.to(device)
            shared = self._shared_depth(torch_model, plan, batch, cache)
            below = None
            if shared is not None:  # the rows' first layers once per distinct row
                share, layers = shared
                distinct = share.distinct.to(device)
                below = (share.layer, index.index_select(0, distinct))
                for name in ("input_ids", "attention_mask", "position_ids"):
                    batch.inputs[name] = batch.inputs[name].index_select(0, distinct)
                sharing = expanding_from(layers, share)
            batch.inputs[cache_argument(torch_model)] = select_rows(cache, index, below)
            batch.inputs["use_cache"] = True
        if not plan.patches:  # nothing grafted: the model's own forward, no trace
            return _plain_forward(torch_model, batch)
        if plan.prefix is None and self._resumes():
            out = self._resumed(runner, donors, batch)
            if out is not None:
                return out
        head = self._head_after(torch_model, batch)
        try:
            with sharing:
                out = self._traced(runner, donors, batch, head)
        except HeadOutputChanged:
            note_head_changed(torch_model)
            return self.run_plan(base, donors, plan)  # now per batch, on fresh inputs
        if head is None:
            return out
        return DeferredLogits(out.clone(), head)  # not a view of the whole batch

    def run_on_cache(
        self, base, donors: Mapping[str, nn.Module | None], plan: BatchPlan, cache
    ) -> torch.Tensor:
        """Logits [batch, vocab] at the last column of ``plan``, a window of each row's newest
        columns (:func:`graft.core.planning.prefix.columns_from`) whose earlier columns'
        keys and values ``cache`` holds; the window's are appended to ``cache``. Grafted as
        :meth:`run_plan` grafts (a window that grafts nothing runs the model's own forward)."""
        torch_model = unwrap(base)
        batch = trace_batch(plan, torch_model, model_device(torch_model))
        name = cache_argument(torch_model)
        if name is None:
            raise ValueError("this model takes no key/value cache")  # programming error
        batch.inputs[name] = cache
        batch.inputs["use_cache"] = True
        if not plan.patches:
            return _plain_forward(torch_model, batch)
        return self._traced(base, donors, batch)

    def _resumes(self) -> bool:
        """Whether whole-prompt batches run from their rows' first grafted layers."""
        return bool(
            getattr(self, "resume_layers", False)
            and getattr(self, "shortcuts", True)
            and getattr(self, "hooks", True)
        )

    def _resumed(
        self, runner, donors: Mapping[str, nn.Module | None], batch
    ) -> torch.Tensor | None:
        """``batch`` run from each row's first grafted layer (:mod:`graft.core.execution.resume`)
        and column (:mod:`graft.core.execution.windows`), or None where that does not pay."""
        torch_model = unwrap(runner)
        family = family_of(torch_model)
        layers = cast(Sequence[nn.Module], self._table(torch_model)[family.layers_path])
        after = (family.final_norm_path, family.unembed_path)
        return windows.run_resumed(
            batch,
            torch_model,
            layers,
            (family.layers_path, after),
            self.prompt_values(),
            lambda run, _: self._traced(runner, donors, run),
        )

    def _shared_depth(
        self, torch_model: nn.Module, plan: BatchPlan, batch, cache
    ) -> tuple[SharedDepth, Sequence[nn.Module]] | None:
        """How ``plan``'s step shares its first layers (:mod:`graft.core.execution.depth_share`) and
        the model's decoder layers, on the hooked path with a cache gathered per layer; else
        None."""
        if not plan.patches or not (
            getattr(self, "shortcuts", True) and getattr(self, "hooks", True)
        ):
            return None
        if not getattr(self, "share_depth", True) or not gathers_per_layer(cache):
            return None
        if batch.inputs["input_ids"].shape[1] != 1:
            return None
        assert plan.prefix is not None
        key = torch.stack(
            [
                plan.prefix.prompt_index.cpu(),
                plan.input_ids[:, -1].cpu(),
                plan.position_ids[:, -1].cpu(),
            ],
            dim=1,
        )
        family = family_of(torch_model)
        layers = cast(Sequence[nn.Module], self._table(torch_model)[family.layers_path])
        after = (family.final_norm_path, family.unembed_path)
        paths = [p.path for p in plan.patches]
        share = shared_depth(key, paths, family.layers_path, len(layers), after)
        return None if share is None else (share, layers)

    def _head_after(self, torch_model: nn.Module, batch) -> nn.Linear | None:
        """The head of ``torch_model`` when ``batch``'s logits are computed after the batches
        (in :meth:`deferring_head`; the hooked path; logits, not metrics; the last position
        only; a head the batch does not graft): else None."""
        if not getattr(self, "_defer_head", False) or batch.targets is not None:
            return None
        if "logits_to_keep" not in batch.inputs:  # the model's head sees every position
            return None
        if not (getattr(self, "shortcuts", True) and getattr(self, "hooks", True)):
            return None
        head = deferrable_head(torch_model)
        if head is None:
            return None
        table = self._table(torch_model)
        return None if any(table.get(p.path) is head for p in batch.patches) else head

    def trace_parts(
        self, base, donors: Mapping[str, nn.Module | None], patches: Sequence[SitePatch]
    ) -> TraceParts:
        """A user's grafted trace here: the base's envoy, its device, the donors' modules
        (the shortcuts do not apply to a user's trace)."""
        return TraceParts(wrap(base), model_device(unwrap(base)), donor_modules(donors, patches))

    def _traced(
        self, base, donors: Mapping[str, nn.Module | None], batch, head: nn.Module | None = None
    ) -> torch.Tensor:
        """``batch`` (:func:`graft.core.execution.trace.trace_batch`) in one trace of ``base``, or
        with ``hooks`` in one plain forward with grafted module forwards (``head``: the rows' input
        to it instead of logits, :func:`graft.core.execution.hooked.run_hooked`; hooked path
        only)."""
        mods = donor_modules(donors, batch.patches, self._table)
        split = None
        torch_model = unwrap(base)
        if getattr(self, "shortcuts", True):
            table = self._table(torch_model)
            split = split_modules(torch_model, batch, table)
            interned = _MaskInterner()
            for patch in batch.patches:  # flat indices: gathers that need no mask scan
                patch.rows, patch.cells = interned(patch.rows)
            for path, (module, keep, _) in split.items():
                split[path] = (module, *interned(keep))
        if split is not None and getattr(self, "hooks", True):
            return run_hooked(torch_model, batch, mods, split, table, head)
        model = wrap(base)
        with torch.no_grad(), model.trace(**batch.inputs):
            logits = graft_batch(model, batch, mods, split).save()  # type: ignore[attr-defined]  # nnsight's
        return logits

    def _prefix_cache(self, base, donors, shared: SharedPrefix, device: torch.device):
        """The cache of ``shared``'s prefixes on ``base`` (the carrier): the one kept from the
        last step when it continued the same prefixes, else a new one (which replaces it),
        computed one forward per row range of ``shared.parts``."""
        torch_model, prefix = unwrap(base), shared.plan
        kept = getattr(self, "_kept_prefix", None)  # subclasses may skip __init__
        if kept is None or kept[0] is not prefix or kept[1] is not torch_model:
            self._kept_prefix = kept = None  # free the last cache before filling a new one
            ranges = shared.parts or [(0, len(prefix.input_ids))]
            parts = [slice_rows(prefix, a, b) for a, b in ranges]
            cache = concat_caches([self._one_cache(base, donors, p, device) for p in parts])
            if cache is None:  # a cache kind that cannot be joined: all rows at once
                cache = self._one_cache(base, donors, prefix, device)
            self._kept_prefix = kept = (prefix, torch_model, cache)
        return kept[2]

    def _one_cache(self, base, donors, prefix: BatchPlan, device: torch.device):
        """The cache of ``prefix`` on ``base``: in a trace where it grafts, else without."""
        torch_model = unwrap(base)
        if not prefix.patches:
            return prefix_cache(torch_model, prefix, device)
        cache = new_cache(torch_model)
        batch = trace_batch(prefix, torch_model, device)
        batch.inputs[cache_argument(torch_model)] = cache
        batch.inputs["use_cache"] = True
        self._traced(base, donors, batch)  # its logits are not needed
        return cache


class _MaskInterner:
    """One tensor (and its flat indices) per distinct mask of a batch, so that the trace
    gathers a module input once for the sites that share input and mask (q/k/v, gate/up)."""

    def __init__(self) -> None:
        self._seen: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._by_id: dict[int, tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]] = {}

    def __call__(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        known = self._by_id.get(id(mask))  # the plan already shares equal masks mostly
        if known is not None:
            return known[1]
        key = (tuple(mask.shape), mask.device, mask.cpu().numpy().tobytes())
        if key not in self._seen:
            self._seen[key] = (mask, mask.flatten().nonzero().squeeze(1))
        self._by_id[id(mask)] = (mask, self._seen[key])  # holds mask: its id stays its own
        return self._seen[key]


def _plain_forward(torch_model: nn.Module, batch) -> torch.Tensor:
    """What :func:`graft_batch` returns for a batch with no patches, without a trace."""
    with torch.no_grad():
        picked = last_logits(torch_model(**batch.inputs).logits, batch)
    if batch.targets is None:
        return picked
    return row_metrics(picked, batch.targets, batch.top_k)
