"""The nnsight backends a graft request runs through: nnsight's remote backend with graft's
payload limit, deadline and status log (:class:`GraftRemoteBackend`), its in-process
simulation for any wrapper, and the code registered to travel by value."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import websocket
from nnsight.intervention.backends.display import StatusDisplay
from nnsight.intervention.backends.remote import RemoteBackend
from nnsight.schema.response import Status

from graft.core.execution import trace as core_trace
from graft.errors import RemoteError
from graft.remote.failures import not_ndif
from graft.remote.payload import format_bytes

if TYPE_CHECKING:
    from nnsight.intervention.backends.local import LocalSimulationBackend
    from nnsight.schema.request import RequestModel
    from nnsight.schema.response import RESULT
    from nnsight.tracing.tracer import Tracer


def register_by_value() -> None:
    """Ship the code that runs in a trace by value: the graft trace itself, a layer block's
    (:mod:`graft.remote.blocks`) and the hosted wrappers' forward method (a server needs no
    ``graft`` for them)."""
    import nnsight

    core_trace.register_by_value()
    nnsight.register("graft.remote.blocks")
    nnsight.register("graft.remote.hosted")


class _PersistentObjects:
    """What nnsight's ``LocalSimulationBackend`` needs from a model: its persistent objects.

    nnsight's ``Remotable`` wrappers have ``_remoteable_persistent_objects``; a plain
    ``NNsight`` wrapper does not, so this builds the same map (interleaver plus every module
    by path) for any envoy.
    """

    def __init__(self, envoy: Any) -> None:
        self.envoy = envoy

    def _remoteable_persistent_objects(self) -> dict[str, Any]:
        if hasattr(self.envoy, "_remoteable_persistent_objects"):
            persistent: dict[str, Any] = self.envoy._remoteable_persistent_objects()
            return persistent
        objects = {"Interleaver": self.envoy.interleaver}
        for envoy in self.envoy.modules():
            objects[f"Module:{envoy.path}"] = envoy._module
        return objects


def simulation_backend(envoy: Any, verbose: bool = False) -> LocalSimulationBackend:
    """nnsight's in-process serialise/deserialise backend (``remote="local"``) for any envoy."""
    from nnsight.intervention.backends.local import LocalSimulationBackend

    register_by_value()
    return LocalSimulationBackend(_PersistentObjects(envoy), verbose=verbose)


class GraftRemoteBackend(RemoteBackend):
    """nnsight's blocking ``RemoteBackend`` (its serialiser, POST, status stream and
    result download), plus: refuse a payload over ``max_payload_bytes`` before sending,
    give up after ``timeout_s`` without a result, and report statuses to ``log``."""

    def __init__(
        self,
        model_key: str,
        *,
        max_payload_bytes: int,
        timeout_s: float,
        log: Callable[[str], None] | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model_key, **kwargs)
        self.max_payload_bytes = max_payload_bytes
        self.timeout_s = timeout_s
        self.log = log
        self.payload_bytes = 0
        self.display = StatusDisplay(enabled=False, verbose=False)

    def _serialize(self, tracer: Tracer) -> bytes:
        blob: bytes = super()._serialize(tracer)
        self.payload_bytes = len(blob)
        if len(blob) > self.max_payload_bytes:
            raise RemoteError(
                f"the request would send {format_bytes(len(blob))} (limit "
                f"{format_bytes(self.max_payload_bytes)}): use donor_mode='hosted', graft "
                "fewer cells, or raise max_payload_mb",
                kind="payload",
            )
        return blob

    def request(self, request: RequestModel, tracer: Tracer) -> RESULT | None:

        blob = self._serialize(tracer)
        connection = websocket.create_connection(
            f"{self.ws_host}/subscribe",
            header={"ndif-api-key": self.api_key} if self.api_key else None,
            timeout=min(30.0, self.timeout_s),
        )
        try:
            request.session_id = _session_id(connection.recv(), self.host)
            stage = "SENT"
            deadline = time.monotonic() + self.timeout_s  # the upload counts too
            self.send(request, blob)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no result within {self.timeout_s:g} s")
                connection.settimeout(min(remaining, 1.0))
                try:
                    message = connection.recv()
                except websocket.WebSocketTimeoutException:
                    continue
                response = self.parse(message)
                if self.log is not None and response.status != Status.COMPLETED:
                    self.log(f"  {response.status.value}: {response.description}".rstrip())
                if response.status not in (Status.ERROR, Status.LOG):
                    stage = response.status.value
                try:
                    result = self.handle(response)
                except Exception as exc:
                    # how far the request got: see classify
                    exc.graft_stage = stage  # type: ignore[attr-defined]
                    raise
                if response.status == Status.COMPLETED:
                    return result
        finally:
            connection.close()


def _session_id(message: str | bytes, host: str) -> str:
    """The session id of the status websocket's first frame, ``{"session_id": "..."}``."""
    try:
        session: str = json.loads(message)["session_id"]
    except (ValueError, KeyError, TypeError):
        raise not_ndif(host, f"nnsight's status websocket with {str(message)[:40]!r}") from None
    return session
