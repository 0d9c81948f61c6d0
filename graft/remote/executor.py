"""Running planned batches on an NDIF(-compatible) server, or through nnsight's simulation.

:class:`RemoteExecutor` is the engine's executor for ``mode="remote"`` and ``"simulate"``
(:func:`graft.core.execution.engine.run_grafts` with ``executor=RemoteExecutor(config)``). It packs
consecutive planned batches into requests, up to ``rows_per_request`` rows and
``max_payload_mb`` of donor weights each, and runs each request as one nnsight *session*
whose traces run :func:`graft.core.execution.trace.graft_batch`, the same trace code as a local run:
the engine batches rows the same way either way, so the numbers are the same. Shipped donor
weights are sent once per request for all its batches. Batches whose own donor weights are
over ``max_payload_mb`` are split between layers, one request per layer block
(:mod:`graft.remote.blocks`), with the same numbers.

``simulate`` runs nnsight's in-process serialise / deserialise path instead of a server: a
cheap check that a trace is remote-safe.
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import nnsight
import torch
from torch import nn

from graft.core.api import tracer as grafted_tracer
from graft.core.execution.executor import TraceParts
from graft.core.execution.module_tables import donor_modules
from graft.core.execution.trace import DonorModules, graft_batch, model_device, trace_batch
from graft.core.families.arch import architecture_of
from graft.core.families.wrapping import unwrap
from graft.core.planning.plan import BatchPlan, SitePatch
from graft.errors import RemoteError
from graft.remote import blocks
from graft.remote.backends import register_by_value
from graft.remote.blocks import Block, run_block
from graft.remote.client import Target, send
from graft.remote.config import RemoteConfig
from graft.remote.payload import format_bytes, keyed_bytes

logger = logging.getLogger(__name__)


@dataclass
class SentRequest:
    """One request a :class:`RemoteExecutor` sent (its ``sent`` list), for measurements.

    Args:
        rows: rows its batches hold.
        batches: planned batches it ran.
        block: the layers it ran when its batches were split between layers
            (:meth:`graft.remote.blocks.Block.label`), else None.
        payload: bytes of the donor weights it carried (0 in hosted mode).
        sent: bytes of the serialised request as sent (0 when simulated).
        seconds: from sending to its result, retries included.
    """

    rows: int
    batches: int
    block: str | None
    payload: int
    sent: int
    seconds: float


@dataclass
class _Request:
    """Consecutive planned batches sent together.

    Args:
        plans: the batches, in order.
        keys: ``(donor, module path)`` of every donor module their patches call.
        payload: bytes of the donor weights shipped with them (0 in hosted mode).
        block: for batches split between layers (:mod:`graft.remote.blocks`), the layers
            this request runs (``keys`` and ``payload`` are the block's); None: all of them.
    """

    plans: list[BatchPlan] = field(default_factory=list)
    keys: set[tuple[str, str]] = field(default_factory=set)
    payload: int = 0
    block: Block | None = None

    @property
    def n_rows(self) -> int:
        return sum(p.input_ids.shape[0] for p in self.plans)


def _keys(plan: BatchPlan) -> set[tuple[str, str]]:
    return {(p.donor, p.path) for p in plan.patches}


def _strip_persistent_ids(modules: Iterable[object]) -> None:
    """Drop nnsight's persistent-id tags from donor modules that must travel by value.

    nnsight tags a module ``Module:<path>`` when an envoy over it is serialised; a donor
    that was once traced as a base keeps the tag, and the server would then silently use
    ITS module at that path (the base's) instead of the shipped donor weights.
    """
    for module in modules:
        if isinstance(module, nn.Module):
            for sub in module.modules():
                sub.__dict__.pop("_persistent_id", None)
            for tensor in (*module.parameters(), *module.buffers()):
                tensor.__dict__.pop("_persistent_id", None)


def _donor_ref(torch_base: nn.Module, donor: str, path: str) -> str:
    """Hosted mode: the envoy path of the pair's donor module (the trace calls it by path).

    On a local graft pair (simulation) that module must exist, so a missing donor fails here
    rather than inside the trace.
    """
    from graft.remote.hosted import DONORS_ATTR

    ref = f"{DONORS_ATTR}.{donor}.{path}"
    if isinstance(getattr(torch_base, DONORS_ATTR, None), nn.Module):
        try:
            torch_base.get_submodule(ref)
        except AttributeError:
            raise RemoteError(
                f"the graft pair has no donor {donor!r} module {path}", kind="config"
            ) from None
    return ref


def _request_body(
    model: Any, batches: Sequence[types.SimpleNamespace], mods: DonorModules, backend: Any
) -> Any:
    """One request: a session running every batch's grafted trace (on the server)."""
    with model.session(backend=backend):
        results = nnsight.save([])
        with torch.no_grad():
            for batch in batches:
                with model.trace(**batch.inputs) as tracer:
                    if batch.block is None:
                        results.append(graft_batch(model, batch, mods))
                    else:
                        results.append(run_block(model, batch, mods))
                        if batch.block.stop <= batch.block.n_layers:
                            tracer.stop()  # the rest of the forward is the next block's
    return results


class RemoteExecutor:
    """Runs planned batches remotely (or simulated), packed into requests.

    Args:
        config: where and how (``mode`` ``"remote"`` or ``"simulate"``; donor mode, limits,
            retries).

    Donors: ship mode needs every donor's weights here; hosted mode none (donor names, or
    ``{name: None}``, will do) and the base may be a weightless meta copy.
    """

    def __init__(self, config: RemoteConfig) -> None:
        if not config.enabled:
            raise RemoteError(
                "a remote executor needs mode 'remote' or 'simulate'; run locally without one",
                kind="config",
            )
        self.config = config
        #: every request this executor sent, in order
        self.sent: list[SentRequest] = []

    @property
    def hosted(self) -> bool:
        return self.config.donor_mode == "hosted"

    def run(
        self, base: Any, donors: Mapping[str, nn.Module | None], plans: Iterable[BatchPlan]
    ) -> Iterator[torch.Tensor]:
        """Logits [batch, vocab] per plan, in order (requests are sent as they are needed)."""
        self.check_donors(donors)
        requests = self.pack(donors, plans, base)
        target = Target.of(self.config, base)
        register_by_value()
        residuals: list[torch.Tensor] = []  # what the last block request returned
        for r, request in enumerate(requests):
            results = self._run_request(target, base, donors, request, r, len(requests), residuals)
            if request.block is not None and not request.block.last:
                residuals = results
                continue
            residuals = []
            yield from results

    def check_donors(self, donors: Mapping[str, nn.Module | None]) -> None:
        if self.hosted:
            return
        for name, donor in donors.items():
            if donor is None:
                raise RemoteError(
                    f"ship mode sends donor {name!r}'s weights, so it must be loaded here; "
                    "use donor_mode='hosted' if the server holds the donors",
                    kind="config",
                )

    def _payload(
        self, donors: Mapping[str, nn.Module | None], keys: Iterable[tuple[str, str]]
    ) -> int:
        if self.hosted:
            return 0
        return keyed_bytes(keys, lambda d, path: unwrap(donors[d]).get_submodule(path))

    def pack(
        self, donors: Mapping[str, nn.Module | None], plans: Iterable[BatchPlan], base: Any
    ) -> list[_Request]:
        """Consecutive plans into requests within the row and payload limits; batches whose
        own donor weights are over the limit go split between layers (:meth:`split`)."""
        cfg, limit = self.config, self.config.max_payload_bytes
        requests: list[_Request] = []
        current = _Request()
        over: list[BatchPlan] = []  # consecutive batches over the limit, split together
        for plan in plans:
            keys, n = _keys(plan), plan.input_ids.shape[0]
            if self._payload(donors, keys) > limit:
                if current.plans:
                    requests.append(current)
                    current = _Request()
                if over and not self._fits_split(base, [*over, plan]):
                    requests += self.split(base, donors, over)
                    over = []
                over.append(plan)
                continue
            if over:
                requests += self.split(base, donors, over)
                over = []
            merged = current.keys | keys
            if current.plans and (
                current.n_rows + n > cfg.rows_per_request or self._payload(donors, merged) > limit
            ):
                requests.append(current)
                current, merged = _Request(), set(keys)
            current.plans.append(plan)
            current.keys = merged
            current.payload = self._payload(donors, merged)
        if over:
            requests += self.split(base, donors, over)
        if current.plans:
            requests.append(current)
        return requests

    def _residual_sizes(self, base: Any) -> tuple[int, int]:
        """(width, bytes per value) of ``base``'s residual stream."""
        torch_base = unwrap(base)
        embed = architecture_of(torch_base).table.embed_sites[0].path
        weight = cast(torch.Tensor, torch_base.get_submodule(embed).weight)
        return int(weight.shape[-1]), weight.element_size()

    def _fits_split(self, base: Any, plans: Sequence[BatchPlan]) -> bool:
        """Whether ``plans`` may share split requests: rows within ``rows_per_request`` and
        residual streams within a share of the limit (:data:`graft.remote.blocks.RESIDUAL_SHARE`)."""
        hidden, itemsize = self._residual_sizes(base)
        rows = sum(p.input_ids.shape[0] for p in plans)
        residual = sum(blocks.residual_bytes(p, hidden, itemsize) for p in plans)
        limit = self.config.max_payload_bytes
        return rows <= self.config.rows_per_request and residual <= blocks.RESIDUAL_SHARE * limit

    def split(
        self, base: Any, donors: Mapping[str, nn.Module | None], plans: Sequence[BatchPlan]
    ) -> list[_Request]:
        """Batches over the payload limit as one request per layer block
        (:mod:`graft.remote.blocks`): each carries the donor modules grafted in its block."""
        arch = architecture_of(unwrap(base))
        limit = self.config.max_payload_bytes
        reserve = blocks.reserve_bytes(plans, *self._residual_sizes(base))
        budget = limit - reserve
        if budget <= 0:
            rows = sum(p.input_ids.shape[0] for p in plans)
            raise RemoteError(
                f"a request of at most {format_bytes(limit)} has no room for donor weights "
                f"beside the trace and the residual stream of {rows} rows "
                f"({format_bytes(reserve)}): raise max_payload_mb, lower batch_size, or use "
                "donor_mode='hosted'",
                kind="payload",
            )
        found = blocks.plan_blocks(
            arch,
            blocks.keys_by_stage(arch, plans),
            lambda keys: self._payload(donors, keys),
            budget,
            limit,
        )
        return [_Request(list(plans), set(block.keys), block.payload, block) for block in found]

    def _modules(
        self,
        torch_base: nn.Module,
        donors: Mapping[str, nn.Module | None],
        patches: Sequence[SitePatch],
    ) -> DonorModules:
        """``{"donor:path": module}`` a request calls: shipped modules, or hosted envoy paths."""
        if not self.hosted:
            mods = donor_modules(donors, patches)
            _strip_persistent_ids(mods.values())
            return mods
        return {f"{p.donor}:{p.path}": _donor_ref(torch_base, p.donor, p.path) for p in patches}

    def trace_parts(
        self, base: Any, donors: Mapping[str, nn.Module | None], patches: Sequence[SitePatch]
    ) -> TraceParts:
        """A user's grafted trace (:func:`graft.core.api.grafted_trace.trace`) sent as one
        request: the envoy the server knows, the donor modules (shipped or hosted) and a
        backend that sends it with the retries and one-line errors of :func:`send`."""
        self.check_donors(donors)
        n_rows = int(patches[0].rows.shape[0]) if patches else 0
        _refuse_oversized(
            self._payload(donors, {(p.donor, p.path) for p in patches}),
            n_rows,
            self.config.max_payload_bytes,
        )
        target = Target.of(self.config, base)
        register_by_value()
        grafted_tracer.register_by_value()
        torch_base = unwrap(base)
        device = model_device(torch_base) if self.config.mode != "remote" else torch.device("cpu")
        mods = self._modules(torch_base, donors, patches)
        return TraceParts(target.model, device, mods, _SendingBackend(target))

    def _run_request(
        self,
        target: Target,
        base: Any,
        donors: Mapping[str, nn.Module | None],
        request: _Request,
        r: int,
        n: int,
        residuals: Sequence[torch.Tensor] = (),
    ) -> list[torch.Tensor]:
        """Send one request; ``residuals``: for a block after the first, the residual stream
        entering it, per batch (the previous block request's results)."""
        where = f"request {r + 1}/{n}"
        torch_base = unwrap(base)
        device = model_device(torch_base) if self.config.mode != "remote" else torch.device("cpu")
        batches = [trace_batch(plan, torch_base, device) for plan in request.plans]
        patches = [p for plan in request.plans for p in plan.patches]
        block = request.block
        for i, batch in enumerate(batches):
            batch.block = None
            if block is not None:
                batch.patches = [p for p in batch.patches if (p.donor, p.path) in block.keys]
                batch.block = blocks.trace_block(block, residuals[i] if block.start >= 0 else None)
        if block is not None:
            patches = [p for p in patches if (p.donor, p.path) in block.keys]
        mods = self._modules(torch_base, donors, patches)
        what = (
            "hosted donors (ids only)"
            if self.hosted
            else f"donor weights {format_bytes(request.payload)} shipped"
        )
        n_rows, n_batches = request.n_rows, len(request.plans)
        split = f", {block.label()}" if block is not None else ""
        logger.info(
            "%s: %d rows in %d batches%s; %s -> %s",
            where,
            n_rows,
            n_batches,
            split,
            what,
            target.host,
        )
        started = time.monotonic()
        results, sent = send(
            target, lambda backend: _request_body(target.model, batches, mods, backend), where
        )
        seconds = time.monotonic() - started
        logger.info(
            "%s: done in %.1f s%s", where, seconds, f", sent {format_bytes(sent)}" if sent else ""
        )
        self.sent.append(
            SentRequest(
                rows=n_rows,
                batches=n_batches,
                block=block.label() if block is not None else None,
                payload=request.payload,
                sent=sent,
                seconds=seconds,
            )
        )
        return results


class _SendingBackend:
    """nnsight backend of a user's grafted trace: one request through :func:`send` (retried
    when the failure is transient, else one :class:`RemoteError` line); the saved values come
    back into the user's frame as from nnsight's own backend."""

    def __init__(self, target: Target) -> None:
        self.target = target

    def __call__(self, tracer: Any) -> None:
        def body(backend: Any) -> list[Any]:
            backend(tracer)
            return []

        send(self.target, body, "the grafted trace")


def _refuse_oversized(size: int, n_rows: int, limit: int) -> None:
    if size > limit:
        raise RemoteError(
            f"one batch of {n_rows} rows would send {format_bytes(size)} of donor weights "
            f"(limit {format_bytes(limit)}): use donor_mode='hosted', graft fewer cells, or "
            "raise max_payload_mb",
            kind="payload",
        )
