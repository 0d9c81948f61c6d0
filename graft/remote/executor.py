"""Running planned batches on an NDIF(-compatible) server, or through nnsight's simulation.

:class:`RemoteExecutor` is the engine's executor for ``mode="remote"`` and ``"simulate"``
(:func:`graft.core.engine.run_grafts` with ``executor=RemoteExecutor(config)``). It packs
consecutive planned batches into requests, up to ``rows_per_request`` rows and
``max_payload_mb`` of donor weights each, and runs each request as one nnsight *session*
whose traces run :func:`graft.core.trace.graft_batch`, the same trace code as a local run:
the engine batches rows the same way either way, so the numbers are the same. Shipped donor
weights are sent once per request for all its batches.

``simulate`` runs nnsight's in-process serialise / deserialise path instead of a server: a
cheap check that a trace is remote-safe.
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import nnsight
import torch
from torch import nn

from graft.core.engine import donor_modules
from graft.core.plan import BatchPlan
from graft.core.trace import DonorModules, graft_batch, model_device, trace_batch
from graft.core.wrapping import unwrap
from graft.errors import RemoteError
from graft.remote.client import Target, register_by_value, send
from graft.remote.config import RemoteConfig
from graft.remote.payload import format_bytes, keyed_bytes

logger = logging.getLogger(__name__)


@dataclass
class _Request:
    """Consecutive planned batches sent together.

    Args:
        plans: the batches, in order.
        keys: ``(donor, module path)`` of every donor module their patches call.
        payload: bytes of the donor weights shipped with them (0 in hosted mode).
    """

    plans: list[BatchPlan] = field(default_factory=list)
    keys: set[tuple[str, str]] = field(default_factory=set)
    payload: int = 0

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
                with model.trace(**batch.inputs):
                    results.append(graft_batch(model, batch, mods))
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

    @property
    def hosted(self) -> bool:
        return self.config.donor_mode == "hosted"

    def run(
        self, base: Any, donors: Mapping[str, nn.Module | None], plans: Iterable[BatchPlan]
    ) -> Iterator[torch.Tensor]:
        """Logits [batch, vocab] per plan, in order (requests are sent as they are needed)."""
        self.check_donors(donors)
        requests = self.pack(donors, plans)
        target = Target.of(self.config, base)
        register_by_value()
        for r, request in enumerate(requests):
            yield from self._run_request(target, base, donors, request, r, len(requests))

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
        self, donors: Mapping[str, nn.Module | None], plans: Iterable[BatchPlan]
    ) -> list[_Request]:
        """Consecutive plans into requests within the row and payload limits."""
        cfg, limit = self.config, self.config.max_payload_bytes
        requests: list[_Request] = []
        current = _Request()
        for plan in plans:
            keys, n = _keys(plan), plan.input_ids.shape[0]
            _refuse_oversized(self._payload(donors, keys), n, limit)
            merged = current.keys | keys
            if current.plans and (
                current.n_rows + n > cfg.rows_per_request or self._payload(donors, merged) > limit
            ):
                requests.append(current)
                current, merged = _Request(), set(keys)
            current.plans.append(plan)
            current.keys = merged
            current.payload = self._payload(donors, merged)
        if current.plans:
            requests.append(current)
        return requests

    def _modules(
        self,
        torch_base: nn.Module,
        donors: Mapping[str, nn.Module | None],
        plans: Sequence[BatchPlan],
    ) -> DonorModules:
        """``{"donor:path": module}`` a request calls: shipped modules, or hosted envoy paths."""
        patches = [p for plan in plans for p in plan.patches]
        if not self.hosted:
            mods = donor_modules(donors, patches)
            _strip_persistent_ids(mods.values())
            return mods
        return {f"{p.donor}:{p.path}": _donor_ref(torch_base, p.donor, p.path) for p in patches}

    def _run_request(
        self,
        target: Target,
        base: Any,
        donors: Mapping[str, nn.Module | None],
        request: _Request,
        r: int,
        n: int,
    ) -> list[torch.Tensor]:
        where = f"request {r + 1}/{n}"
        torch_base = unwrap(base)
        device = model_device(torch_base) if self.config.mode != "remote" else torch.device("cpu")
        batches = [trace_batch(plan, torch_base, device) for plan in request.plans]
        mods = self._modules(torch_base, donors, request.plans)
        what = (
            "hosted donors (ids only)"
            if self.hosted
            else f"donor weights {format_bytes(request.payload)} shipped"
        )
        n_rows, n_batches = request.n_rows, len(request.plans)
        logger.info(
            "%s: %d rows in %d batches; %s -> %s", where, n_rows, n_batches, what, target.host
        )
        started = time.monotonic()
        results, sent = send(
            target, lambda backend: _request_body(target.model, batches, mods, backend), where
        )
        took = f"done in {time.monotonic() - started:.1f} s"
        logger.info("%s: %s%s", where, took, f", sent {format_bytes(sent)}" if sent else "")
        return results


def _refuse_oversized(size: int, n_rows: int, limit: int) -> None:
    if size > limit:
        raise RemoteError(
            f"one batch of {n_rows} rows would send {format_bytes(size)} of donor weights "
            f"(limit {format_bytes(limit)}): use donor_mode='hosted', graft fewer cells, or "
            "raise max_payload_mb",
            kind="payload",
        )
