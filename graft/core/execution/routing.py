"""Routing: which model carries each row, and whether it runs whole in a trace, as a donor's
plain forward, or as a one-token step on a shared prefix.

A row runs on its *carrier* (:mod:`graft.core.planning.carrier`), the model that supplies most of
its work, with the other models' modules grafted at the remaining cells; rows of one prompt that
graft the same cells before its last token share that prefix (:mod:`graft.core.planning.prefix`).
:func:`engine_path` says which of these shortcuts the installed libraries allow (for a run's
``config.json``), and a shortcut that cannot be used is warned of once, never silently off.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from torch import nn

from graft.core.execution.head import deferrable_head
from graft.core.execution.inputs import as_donors, model_of
from graft.core.families.arch import Architecture
from graft.core.families.wrapping import unwrap
from graft.core.language.spec import ResolvedGraft
from graft.core.planning.carrier import (
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
from graft.core.planning.kv_cache import CACHE_ARGUMENTS, accepts_cache, cache_argument
from graft.core.planning.plan import GraftRow, LayoutCache, _layout_key
from graft.core.planning.prefix import grafts_last_token_only, prefix_signature
from graft.errors import SlowPathWarning


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
        steps: row -> (the model that runs its step, by name, the base as ``BASE``; the
            step's graft on that model) for a prefix row whose last token another model
            computes most of (:meth:`_Router.step_on`); other rows step on their carrier.
    """

    resolved: list[ResolvedGraft]
    traced: dict[str | None, list[int]] = field(default_factory=dict)
    plain: dict[str, list[int]] = field(default_factory=dict)
    prefix: dict[str | None, list[int]] = field(default_factory=dict)
    steps: dict[int, tuple[str, ResolvedGraft]] = field(default_factory=dict)


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
        work: each model's share of the row's work
            (:func:`graft.core.planning.carrier.work_by_model`).
        carrier: the model that runs it (None: the base).
        kind: ``"traced"``, ``"plain"`` or ``"prefix"`` (see :class:`_Routes`).
        on_carrier: ``graft`` on the carrier.
        key: the layout key of the rows it routes (:func:`graft.core.planning.plan._layout_key`).
    """

    graft: ResolvedGraft
    work: dict[str | None, float]
    carrier: str | None = None
    kind: str = "traced"
    on_carrier: ResolvedGraft | None = None
    key: Any = None


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
    ``cache_argument`` (the base's forward argument taking that cache), ``fallbacks``
    (why a shortcut is off, and what that costs; warned once per cause) and
    ``logits_after_batches`` (grafted rows' logits computed by the base's head after the
    batches, straight into the result: :mod:`graft.core.execution.head`). ``remote``: a
    remote executor runs every row whole on the base by design; ``shortcuts``: the
    :class:`LocalExecutor`'s option."""
    if remote:
        return {
            "executor": "remote",
            "shortcuts": False,
            "shared_prefix": False,
            "cache_argument": None,
            "fallbacks": [],
            "logits_after_batches": False,
        }
    models = {"base": unwrap(model_of(base))}
    for name, donor in as_donors(donors or {}).items():
        if donor is not None:
            models[name] = unwrap(model_of(donor))
    argument = cache_argument(models["base"])
    fallbacks = no_prefix_reasons(models.values())
    return {
        "executor": "local",
        "shortcuts": shortcuts,
        "shared_prefix": shortcuts and not fallbacks,
        "cache_argument": argument,
        "fallbacks": fallbacks,
        "logits_after_batches": shortcuts and deferrable_head(models["base"]) is not None,
    }


def no_prefix_reasons(models: Iterable[nn.Module]) -> list[str]:
    """Why the shared-prefix shortcut is off on those of ``models`` that take no key/value
    cache (one line per cause, each warned once: :func:`warn_slow_path`)."""
    reasons = list(dict.fromkeys(no_prefix_reason(m) for m in models if not accepts_cache(m)))
    for reason in reasons:
        warn_slow_path(reason)
    return reasons


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
    """Routes rows (:func:`route_rows`): carriers, grafts on them, and how each row runs."""

    def __init__(self, arch: Architecture, torch_base: nn.Module, donors, same: set[str]):
        self.every, self.same = every_cell(arch), same
        self.carriers = _carriers(arch, torch_base, donors, same)
        self.costs = cell_costs(arch, torch_base) if self.carriers else {}
        self.same_models = {  # names whose model IS the carrier: their cells change nothing there
            c: {n for n, d in donors.items() if d is not None and unwrap(d) is unwrap(donors[c])}
            for c in self.carriers
        }
        models = {None: torch_base} | {c: unwrap(donors[c]) for c in self.carriers}
        self.with_cache = {c: accepts_cache(m) for c, m in models.items()}
        no_prefix_reasons(models.values())
        self.memo: LayoutCache | None = None  # set by route_rows

    def on(self, choice: _Choice, carrier: str | None, length: int) -> ResolvedGraft:
        """``choice``'s graft on ``carrier`` (kept in :attr:`memo` by the choice's key)."""
        if carrier is None:
            return choice.graft
        if choice.key is not None and self.memo is not None:
            return self.memo.remember(
                f"on {carrier}", choice.key, partial(self._moved, choice, carrier, length)
            )
        return self._moved(choice, carrier, length)

    def _moved(self, choice: _Choice, carrier: str, length: int) -> ResolvedGraft:
        moved = relative_to(choice.graft, length, carrier, self.every)
        return without(moved, self.same_models[carrier])

    def step_on(
        self, res: ResolvedGraft, length: int, carrier: str | None
    ) -> tuple[str, ResolvedGraft] | None:
        """For a step of a row grafted ``res`` on ``carrier``: the model that computes most of
        its last token, by name (the base as ``BASE``), with the step's graft on it, when
        that is not the carrier (its step then runs there on the carrier's prefix cache:
        a row that grafts every module at its last token, LT or FE+LT, needs no patch but
        the head's); else None."""
        own = BASE if carrier is None else carrier
        last = length - 1
        source = {key: res.cells.get(key, {}).get(last, own) for key in self.every}
        work: dict[str, float] = {}
        for key, name in source.items():
            work[name] = work.get(name, 0.0) + self.costs.get(key, 0.0)
        candidates = {c for c in self.carriers if self.with_cache[c]}
        if self.with_cache[None]:
            candidates.add(BASE)
        best = max(candidates & work.keys() - {own}, key=lambda n: (work[n], n), default=None)
        if best is None or work[best] <= work.get(own, 0.0):
            return None
        cells = {key: {last: name} for key, name in source.items() if name != best}
        final_norm, unembed = res.final_norm_donor or own, res.unembed_donor or own
        step = ResolvedGraft(
            cells, None if final_norm == best else final_norm, None if unembed == best else unembed
        )
        return best, without(step, self.same if best == BASE else self.same_models[best])

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


def route_rows(
    arch: Architecture,
    torch_base: nn.Module,
    rows: Sequence[GraftRow],
    resolved: Sequence[ResolvedGraft],
    donors: Mapping[str, nn.Module | None],
    same: set[str],
    batch_size: int = 16,
    kept: Callable[[Hashable], LayoutCache] | None = None,
) -> _Routes:
    """Each row's carrier, its graft there, and whether it runs whole, plain or on a shared
    prefix. Rows with the same spec, length and spans route alike (computed once, and kept
    for later calls in ``kept(scope)``, :func:`graft.core.planning.plan_cache.layouts_for` on the
    same models; the scope names what the routing depends on besides them)."""
    router = _Router(arch, torch_base, donors, same)
    scope = (
        "route",
        tuple(sorted(router.carriers)),
        tuple(sorted(router.with_cache.items(), key=str)),
        tuple(sorted(same)),
    )
    memo = LayoutCache() if kept is None else kept(scope)
    routes, choices = _Routes([]), []
    router.memo = memo
    for i, (row, res) in enumerate(zip(rows, resolved, strict=True)):
        key = _layout_key(row)
        choice = memo.remember("choice", key, partial(router.choose, res, len(row.input_ids)))
        choice.key = key
        choices.append(choice)
        assert choice.on_carrier is not None  # choose() always sets it
        routes.resolved.append(choice.on_carrier)
        getattr(routes, choice.kind).setdefault(choice.carrier, []).append(i)
    _share_grafted_prefixes(router, rows, choices, routes)
    _join_prefixes(rows, routes)
    _fill_batches(router, rows, choices, routes, batch_size)
    for carrier, idx in routes.prefix.items():
        for i in idx:
            step = memo.remember(
                f"step on {carrier}",
                choices[i].key,
                partial(router.step_on, routes.resolved[i], len(rows[i].input_ids), carrier),
            )
            if step is not None:
                routes.steps[i] = step
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
    memo = router.memo if router.memo is not None else LayoutCache()
    for idx in routes.traced.values():
        for i in idx:
            ids, graft = tuple(rows[i].input_ids), choices[i].graft
            if len(ids) < 2 or is_empty(routes.resolved[i]):  # nothing: see _join_prefixes
                continue
            signature = memo.remember(
                "graft signature",
                choices[i].key,
                partial(prefix_signature, graft, len(ids)),
            )
            if signature:  # grafted before the last token (else already a step)
                groups.setdefault((ids, signature), []).append(i)
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
        pool = cast(
            "dict[str | None, list[int]]", routes.traced if carrier is None else routes.plain
        )
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
    for pools in (routes.traced, routes.plain):
        for empty in [c for c, idx in pools.items() if not idx]:
            del pools[empty]  # type: ignore[arg-type]  # a key of this very dict
