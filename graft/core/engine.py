"""The one execution loop: rows in, final-position logits out, batch by batch.

:func:`run_grafts` resolves every row's spec (bad input fails before any compute), sorts the
rows by length, plans each batch (:mod:`graft.core.plan`), hands the plans to an *executor*
and scatters the logits it returns back into input order. The executor decides where a plan
runs: :class:`LocalExecutor` runs each in one nnsight trace on this machine; a remote
executor (``graft.remote.executor.RemoteExecutor``) packs plans into requests to an NDIF
server. Both run the same trace code (:mod:`graft.core.trace`), so they give the same
numbers. :func:`graft.core.texts.graft_texts` is the notebook entry point on text prompts.

Locally each (position, module) cell is computed once, with the weights it uses:

- a row runs on its *carrier* (:mod:`graft.core.carrier`), the model that supplies most of
  its work, with the other models' modules grafted at the remaining cells: a complement
  such as ``LT^C:all:all`` is a donor forward with the base's modules at the last token,
  and a donor's whole forward (``ALL:all:all; head=donor``) is that plain forward;
- rows of one prompt that graft the same cells before its last token (nothing, for rows
  that graft only their last token; the first entity, for FE and FE+LT) share that prefix
  (:mod:`graft.core.prefix`): it runs once with a key/value cache and each row runs only
  its last token, in a trace;
- a batch that grafts nothing runs without a trace.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from graft.core.arch import Architecture, architecture_of, check_compatible, context_length
from graft.core.carrier import (
    BASE,
    can_carry,
    carrier_of,
    cell_costs,
    every_cell,
    is_empty,
    relative_to,
    without,
    work_by_model,
)
from graft.core.plan import (
    BatchPlan,
    GraftRow,
    LayoutCache,
    SharedPrefix,
    SitePatch,
    _layout_key,
    check_targets,
    default_pad_id,
    plan_batch,
    resolve_rows,
)
from graft.core.prefix import (
    CACHE_ARGUMENTS,
    accepts_cache,
    cache_argument,
    concat_caches,
    grafts_last_token_only,
    new_cache,
    prefix_cache,
    prefix_plans,
    prefix_signature,
    select_rows,
    slice_rows,
)
from graft.core.spec import ResolvedGraft
from graft.core.trace import (
    graft_batch,
    last_logits,
    model_device,
    row_metrics,
    trace_batch,
    unpack_row_metrics,
)
from graft.core.wrapping import unwrap, wrap
from graft.errors import SlowPathWarning, SpecError

__all__ = [
    "BatchPlan",
    "Executor",
    "GraftRow",
    "LocalExecutor",
    "engine_path",
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
    """Runs each planned batch in one nnsight trace on this machine.

    With ``shortcuts`` (the default) every cell is computed once: :func:`run_grafts` routes
    rows to their carriers and onto shared prefixes (see the module docstring), a step on
    shared prefixes (a plan with ``prefix``, :mod:`graft.core.prefix`) first runs its
    prefixes without a trace, keeping their key/value cache for the next steps on the same
    prefixes, and grafted matrix products run their own weights only on the cells no donor
    takes (:func:`split_modules`). Without, every row is grafted whole on the base exactly
    as a remote executor does it, giving a remote run's numbers bit for bit.

    Args:
        shortcuts: compute each cell once (exact to rounding); False: the plain one-pass graft.
    """

    def __init__(self, shortcuts: bool = True) -> None:
        self.shortcuts = shortcuts

    def run(
        self, base, donors: Mapping[str, nn.Module | None], plans: Iterable[BatchPlan]
    ) -> Iterator[torch.Tensor]:
        try:
            for plan in plans:
                yield self.run_plan(base, donors, plan)
        finally:
            self._kept_prefix = None  # the last prefixes' cache

    def run_plan(self, base, donors: Mapping[str, nn.Module | None], plan: BatchPlan):
        """Logits [batch, vocab] at each row's last token, on the base's device."""
        torch_model = unwrap(base)
        device = model_device(torch_model)
        batch = trace_batch(plan, torch_model, device)
        if plan.prefix is not None:
            cache = self._prefix_cache(base, donors, plan.prefix, device)
            batch.inputs[cache_argument(torch_model)] = select_rows(
                cache, plan.prefix.prompt_index.to(device)
            )
            batch.inputs["use_cache"] = True
        if not plan.patches:  # nothing grafted: the model's own forward, no trace
            return _plain_forward(torch_model, batch)
        return self._traced(base, donors, batch)

    def _traced(self, base, donors: Mapping[str, nn.Module | None], batch) -> torch.Tensor:
        """``batch`` (:func:`graft.core.trace.trace_batch`) in one trace of ``base``."""
        model, mods = wrap(base), donor_modules(donors, batch.patches)
        split = None
        if getattr(self, "shortcuts", True):
            split = split_modules(unwrap(base), batch)
            interned = _MaskInterner()
            for patch in batch.patches:  # flat indices: gathers that need no mask scan
                patch.rows, patch.cells = interned(patch.rows)
            for path, (module, keep, _) in split.items():
                split[path] = (module, *interned(keep))
        with torch.no_grad(), model.trace(**batch.inputs):
            logits = graft_batch(model, batch, mods, split).save()
        return logits

    def _prefix_cache(self, base, donors, shared: SharedPrefix, device: torch.device):
        """The cache of ``shared``'s prefixes on ``base`` (the carrier): the one kept from the
        last step when it continued the same prefixes, else a new one (which replaces it),
        computed one forward per row range of ``shared.parts``."""
        torch_model, prefix = unwrap(base), shared.plan
        kept = getattr(self, "_kept_prefix", None)
        if kept is None or kept[0] is not prefix or kept[1] is not torch_model:
            self._kept_prefix = kept = None  # free the last cache before filling a new one
            ranges = shared.parts or [(0, len(prefix.input_ids))]
            parts = [slice_rows(prefix, a, b) for a, b in ranges]
            cache = concat_caches([self._one_cache(base, donors, p, device) for p in parts])
            if cache is None:  # a cache kind that cannot be joined: all rows at once
                cache = self._one_cache(base, donors, prefix, device)
            kept = (prefix, torch_model, cache)
            self._kept_prefix = kept
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


#: A module's own computation is restricted to the cells no donor takes when donors take at
#: least this share of the cells it sees (below, copying the rest costs more than it saves).
SPLIT_SHARE = 0.125


def _multiplies(module: nn.Module) -> bool:
    """Whether ``module`` is a matrix product (a linear layer or GPT-2's Conv1D), the kind
    of module whose work is worth restricting to some cells."""
    weight = getattr(module, "weight", None)
    return (
        isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and not isinstance(module, nn.Embedding)
    )


def split_modules(torch_model: nn.Module, batch) -> dict[str, tuple]:
    """``{path: (module, bool [batch, positions] of the cells no patch covers, their flat
    indices)}`` for the grafted matrix products of ``batch`` where donors take at least
    :data:`SPLIT_SHARE` of the cells: the trace skips them and runs them on those cells
    only (:func:`graft.core.trace.graft_trace_body`).
    Fused q/k/v sites grafted in slices keep the whole computation (the base's slices are
    needed at the grafted cells too)."""
    head = torch_model.get_output_embeddings()
    last_only = "logits_to_keep" in batch.inputs
    groups: dict[str, list] = {}
    for patch in batch.patches:
        groups.setdefault(patch.path, []).append(patch)
    split = {}
    kept: dict[int, tuple] = {}  # cells taken by one patch: (that mask, keep, its indices)
    for path, patches in groups.items():
        if any((p.fused and p.slices) or p.seq_dim != 1 for p in patches):
            continue
        module = torch_model.get_submodule(path)
        if not _multiplies(module):
            continue
        taken = patches[0].rows
        for p in patches[1:]:
            taken = taken | p.rows
        if module is head and last_only:
            taken = taken[:, -1:]
        known = kept.get(id(taken))
        if known is None:
            keep = None
            if taken.float().mean() >= SPLIT_SHARE:
                keep = ~taken
                keep = (keep, keep.flatten().nonzero().squeeze(1))
            known = kept[id(taken)] = (taken, keep)
        if known[1] is not None:
            split[path] = (module, *known[1])
    return split


def _plain_forward(torch_model: nn.Module, batch) -> torch.Tensor:
    """What :func:`graft_batch` returns for a batch with no patches, without a trace."""
    with torch.no_grad():
        picked = last_logits(torch_model(**batch.inputs).logits, batch)
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


@dataclass
class _Routes:
    """How each row runs locally. Carrier ``None`` is the base.

    Args:
        resolved: each row's graft on its carrier (cells of donors that are the carrier
            itself dropped).
        traced: carrier -> rows run as whole prompts in traces (on the base, rows that
            graft nothing too: they share its batches).
        plain: donor -> rows that are that donor's plain forward.
        prefix: carrier -> rows run as one-token steps on shared prefixes: rows that
            graft only their last token, and rows of one prompt grafting the same cells
            before it.
    """

    resolved: list[ResolvedGraft]
    traced: dict[str | None, list[int]] = field(default_factory=dict)
    plain: dict[str, list[int]] = field(default_factory=dict)
    prefix: dict[str | None, list[int]] = field(default_factory=dict)


def _carriers(arch: Architecture, torch_base: nn.Module, donors, same: set[str]) -> set[str]:
    """Donors that may carry rows: weights given, not the base, computing what it computes."""
    if BASE in donors:  # the base's own name in a donor's run would be taken
        return set()
    return {
        name
        for name, donor in donors.items()
        if donor is not None and name not in same and can_carry(arch, torch_base, unwrap(donor))
    }


@dataclass
class _Choice:
    """How rows with one spec, length and spans run.

    Args:
        graft: the graft on the base (cells of donors that are the base dropped).
        work: each model's share of the row's work (:func:`graft.core.carrier.work_by_model`).
        carrier: the model that runs it (None: the base).
        kind: ``"traced"``, ``"plain"`` or ``"prefix"`` (see :class:`_Routes`).
        on_carrier: ``graft`` on the carrier.
    """

    graft: ResolvedGraft
    work: dict[str | None, float]
    carrier: str | None = None
    kind: str = "traced"
    on_carrier: ResolvedGraft | None = None


#: What the local engine costs without the shared-prefix shortcut (SmolLM2-135M and a
#: 1.5B model of GPT2-XL's shape on a 2-core CPU, transformers 5.23 vs 5.24 before 5.24's
#: spelling was known: E3's component sets at LT 0.42 -> 0.92 and 0.49 -> 1.00 of a plain
#: forward, E1's position mix 1.14 -> 1.47 and 1.05 -> 1.35).
NO_PREFIX_COST = (
    "rows that graft only the last token (E3's component sets, FE+LT once FE ran) run whole "
    "prompts instead of one-token steps on a shared prefix: the same numbers to rounding, "
    "up to about 2x the time"
)
_warned: set[str] = set()


def engine_path(
    base,
    donors: Mapping[str, nn.Module | None] | None = None,
    *,
    remote: bool = False,
    shortcuts: bool = True,
) -> dict:
    """How :func:`run_grafts` computes rows on these models, for a run's ``config.json``:
    ``executor`` (``local``/``remote``), ``shortcuts`` (each cell computed once, rows routed
    to carriers), ``shared_prefix`` (one-token steps on a shared key/value cache),
    ``cache_argument`` (the base's forward argument taking that cache) and ``fallbacks``
    (why a shortcut is off, and what that costs; warned once per cause). ``remote``: a
    remote executor runs every row whole on the base by design; ``shortcuts``: the
    :class:`LocalExecutor`'s option."""
    if remote:
        return {"executor": "remote", "shortcuts": False, "shared_prefix": False,
                "cache_argument": None, "fallbacks": []}  # fmt: skip
    models = {"base": unwrap(_model_of(base))}
    for name, donor in as_donors(donors or {}).items():
        if donor is not None:
            models[name] = unwrap(_model_of(donor))
    argument = cache_argument(models["base"])
    fallbacks = [no_prefix_reason(m) for m in models.values() if not accepts_cache(m)]
    fallbacks = list(dict.fromkeys(fallbacks))
    for reason in fallbacks:
        warn_slow_path(reason)
    return {
        "executor": "local",
        "shortcuts": shortcuts,
        "shared_prefix": shortcuts and not fallbacks,
        "cache_argument": argument,
        "fallbacks": fallbacks,
    }


def no_prefix_reason(model: nn.Module) -> str:
    """Why ``model`` cannot run the shared-prefix shortcut, and what that costs."""
    import transformers

    return (
        f"no shared-prefix shortcut on {type(model).__name__}: its forward takes none of the "
        f"cache arguments graft knows ({', '.join(CACHE_ARGUMENTS)}; transformers "
        f"{transformers.__version__}); {NO_PREFIX_COST}"
    )


def warn_slow_path(reason: str) -> None:
    """Warn (:class:`graft.errors.SlowPathWarning`) of ``reason``, once per process."""
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(reason, SlowPathWarning, stacklevel=3)


class _Router:
    """Routes rows (:func:`_route`): carriers, grafts on them, and how each row runs."""

    def __init__(self, arch: Architecture, torch_base: nn.Module, donors, same: set[str]):
        self.every, self.same = every_cell(arch), same
        self.carriers = _carriers(arch, torch_base, donors, same)
        self.costs = cell_costs(arch, torch_base) if self.carriers else {}
        self.twins = {  # names whose model IS the carrier: their cells change nothing there
            c: {n for n, d in donors.items() if d is not None and unwrap(d) is unwrap(donors[c])}
            for c in self.carriers
        }
        models = {None: torch_base} | {c: unwrap(donors[c]) for c in self.carriers}
        self.with_cache = {c: accepts_cache(m) for c, m in models.items()}
        for model in {id(m): m for c, m in models.items() if not self.with_cache[c]}.values():
            warn_slow_path(no_prefix_reason(model))

    def on(self, choice: _Choice, carrier: str | None, length: int) -> ResolvedGraft:
        """``choice``'s graft on ``carrier``."""
        if carrier is None:
            return choice.graft
        moved = relative_to(choice.graft, length, carrier, self.every)
        return without(moved, self.twins[carrier])

    def choose(self, res: ResolvedGraft, length: int) -> _Choice:
        graft = without(res, self.same)
        choice = _Choice(graft, work_by_model(graft, length, self.costs))
        choice.carrier = carrier_of(choice.work, self.carriers) if self.carriers else None
        choice.on_carrier = self.on(choice, choice.carrier, length)
        if choice.carrier is not None and is_empty(choice.on_carrier):
            choice.kind = "plain"
        elif self.with_cache[choice.carrier] and grafts_last_token_only(choice.on_carrier, length):
            choice.kind = "prefix"
        return choice


def _route(
    arch: Architecture,
    torch_base: nn.Module,
    rows: Sequence[GraftRow],
    resolved: Sequence[ResolvedGraft],
    donors: Mapping[str, nn.Module | None],
    same: set[str],
    batch_size: int = 16,
) -> _Routes:
    """Each row's carrier, its graft there, and whether it runs whole, plain or on a shared
    prefix. Rows with the same spec, length and spans route alike (computed once)."""
    router = _Router(arch, torch_base, donors, same)
    routes, seen, choices = _Routes([]), {}, []
    for i, (row, res) in enumerate(zip(rows, resolved, strict=True)):
        key = _layout_key(row)
        if key not in seen:
            seen[key] = router.choose(res, len(row.input_ids))
        choice = seen[key]
        choices.append(choice)
        routes.resolved.append(choice.on_carrier)
        getattr(routes, choice.kind).setdefault(choice.carrier, []).append(i)
    _share_grafted_prefixes(router, rows, choices, routes)
    _join_prefixes(rows, routes)
    _fill_batches(router, rows, choices, routes, batch_size)
    return routes


def _fill_batches(
    router: _Router,
    rows: Sequence[GraftRow],
    choices: Sequence[_Choice],
    routes: _Routes,
    batch_size: int,
) -> None:
    """Move rows between the base's and a donor's traced batches when that saves a batch:
    the part-filled last batch of one side goes into the free places of the other's, taking
    the rows that cost least on the other model."""
    for donor in [c for c in routes.traced if c is not None]:
        sides = {None: routes.traced.get(None, []), donor: routes.traced[donor]}
        left = {c: len(idx) % batch_size for c, idx in sides.items()}
        if not all(left.values()) or sum(left.values()) > batch_size:
            continue
        moves = []
        for src, dst in ((None, donor), (donor, None)):
            penalty = sorted(
                (choices[i].work.get(src, 0.0) - choices[i].work.get(dst, 0.0), i)
                for i in sides[src]
            )[: left[src]]
            moves.append((sum(p for p, _ in penalty), src, dst, [i for _, i in penalty]))
        _, src, dst, moving = min(moves, key=lambda m: m[0])
        moved = set(moving)
        routes.traced[src] = [i for i in sides[src] if i not in moved]
        routes.traced.setdefault(dst, []).extend(moving)
        for i in moving:
            routes.resolved[i] = router.on(choices[i], dst, len(rows[i].input_ids))
        if not routes.traced[src]:
            del routes.traced[src]


def _share_grafted_prefixes(
    router: _Router, rows: Sequence[GraftRow], choices: Sequence[_Choice], routes: _Routes
) -> None:
    """Traced rows of one prompt that graft the same cells before its last token (FE and
    FE+LT; FE^C and (FE+LT)^C) compute the same prefix: two or more such rows run as steps
    on one grafted prefix instead of as whole prompts, all on one carrier (the prefix is the
    same computation on any carrier, and split modules compute each cell once on either).
    Groups of the same grafts (FE^C and (FE+LT)^C, on every prompt) share the carrier that
    does most of their summed work, so that they fill the same batches instead of leaving
    part-filled ones on two models."""
    groups: dict[tuple, list[int]] = {}
    signatures: dict[tuple[int, int], tuple] = {}
    for idx in routes.traced.values():
        for i in idx:
            ids, graft = tuple(rows[i].input_ids), choices[i].graft
            if len(ids) < 2 or is_empty(routes.resolved[i]):  # nothing: see _join_prefixes
                continue
            known = (id(graft), len(ids))
            if known not in signatures:
                signatures[known] = prefix_signature(graft, len(ids))
            if signatures[known]:  # grafted before the last token (else already a step)
                groups.setdefault((ids, signatures[known]), []).append(i)
    kinds: dict[tuple, list[int]] = {}  # the grafts of a group -> all its groups' rows
    for group in groups.values():
        if len(group) >= 2:
            kinds.setdefault(tuple(sorted(str(rows[i].spec) for i in group)), []).extend(group)
    moving: dict[int, str | None] = {}
    for members in kinds.values():
        carriers = [c for c in (choices[i].carrier for i in members) if router.with_cache[c]]
        if carriers:
            carrier = max(
                dict.fromkeys(carriers),
                key=lambda c: sum(choices[i].work.get(c, 0.0) for i in members),
            )
            moving |= dict.fromkeys(members, carrier)
    if not moving:
        return
    for carrier in list(routes.traced):
        routes.traced[carrier] = [i for i in routes.traced[carrier] if i not in moving]
        if not routes.traced[carrier]:
            del routes.traced[carrier]
    for i, carrier in moving.items():
        if carrier != choices[i].carrier:
            routes.resolved[i] = router.on(choices[i], carrier, len(rows[i].input_ids))
        routes.prefix.setdefault(carrier, []).append(i)


def _join_prefixes(rows: Sequence[GraftRow], routes: _Routes) -> None:
    """Rows that graft nothing on a carrier whose other rows share their prompt's prefix run
    as a step on that prefix too (no trace): the prefix is computed anyway."""
    for carrier, idx in routes.prefix.items():
        prompts = {tuple(rows[i].input_ids) for i in idx}
        pool = routes.traced if carrier is None else routes.plain
        candidates = pool.get(carrier, [])
        joining = [
            i
            for i in candidates
            if is_empty(routes.resolved[i]) and tuple(rows[i].input_ids) in prompts
        ]
        if joining:
            moved = set(joining)
            pool[carrier] = [i for i in candidates if i not in moved]
            idx.extend(joining)
    for pool in (routes.traced, routes.plain):
        for carrier in [c for c, idx in pool.items() if not idx]:
            del pool[carrier]


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
        del logits  # not held while the next batch runs
        if bar is not None:
            bar.update(len(idx))
    return out if out is not None else torch.empty((0, 0))


Job = tuple[list[list[int]], Iterator[torch.Tensor]]


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
    """(row batches, their results) per way of running (:func:`_route`), on this machine."""
    routes = _route(arch, unwrap(base), rows, resolved, donors, same, batch_size)
    on_donor = {**donors, BASE: base}  # a donor's run grafts the base's modules too

    def carried_by(carrier: str | None):
        return (base, donors) if carrier is None else (donors[carrier], on_donor)

    jobs: list[Job] = []
    for carrier, idx in routes.traced.items():
        batches = _batches(rows, batch_size, sort_by_length, idx)
        plans = _plans(arch, rows, routes.resolved, batches, skip=set(), **planning)
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
        )
        batches = [step_rows for step_rows, _ in steps]
        plans = (plan for _, plan in steps)
        jobs.append((batches, executor.run(*carried_by(carrier), plans)))
    return jobs


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
    planning = dict(pad_id=pad_id, padding_side=padding_side, targets=targets, top_k=top_k)
    executor = executor or LocalExecutor()
    if isinstance(executor, LocalExecutor) and getattr(executor, "shortcuts", True):
        jobs = _local_jobs(
            executor, base, donors, arch, rows, resolved, same, batch_size, sort_by_length, planning
        )
    else:  # every row grafted whole on the base, as planned (as a remote executor does)
        batches = _batches(rows, batch_size, sort_by_length)
        plans = _plans(arch, rows, resolved, batches, skip=same, **planning)
        jobs = [(batches, executor.run(base, donors, plans))]
    all_batches = [idx for batches, _ in jobs for idx in batches]
    results = [result for _, result in jobs]
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
