"""nnsight's client, made to fail readably: the backends a request runs through, sending
with retries, and turning whatever nnsight raised into one :class:`RemoteError` line.

Errors surface as :class:`RemoteError` with a one-line message and a ``kind``
(``unreachable``, ``protocol``, ``auth``, ``model``, ``payload``, ``server``, ``timeout``,
``transient``, ``config``); transient ones (connection drops, 5xx/429, timeouts, an
unreachable host) are retried ``retries`` times with exponential back-off.
:func:`server_versions` reads what a server runs, for a run's record.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import websocket
from nnsight.intervention.backends.display import StatusDisplay
from nnsight.intervention.backends.remote import RemoteBackend
from nnsight.schema.response import Status

from graft.core import trace as core_trace
from graft.core.wrapping import unwrap, wrap
from graft.errors import RemoteError
from graft.remote.config import RemoteConfig
from graft.remote.payload import format_bytes

if TYPE_CHECKING:
    from nnsight.intervention.backends.local import LocalSimulationBackend
    from nnsight.schema.request import RequestModel
    from nnsight.schema.response import RESULT
    from nnsight.tracing.backend import Backend
    from nnsight.tracing.tracer import Tracer

logger = logging.getLogger(__name__)

_RETRYABLE = ("unreachable", "timeout", "transient")
# the server failed while it was provisioning or deploying the model, before running anything
_DEPLOY_STAGES = ("PROVISIONING", "DEPLOYING")
SERVER_PACKAGES = ("ndif", "nnsight", "torch", "transformers", "graft")


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


def _not_ndif(host: str, what: str) -> RemoteError:
    """``host`` answered, but not as an NDIF server does (``what``: how it answered)."""
    return RemoteError(
        f"{host} answered {what}: the reply is not an NDIF response; check that host (or env "
        "NDIF_HOST) points at an NDIF server",
        kind="protocol",
        param="host",
    )


def _session_id(message: str | bytes, host: str) -> str:
    """The session id of the status websocket's first frame, ``{"session_id": "..."}``."""
    try:
        session: str = json.loads(message)["session_id"]
    except (ValueError, KeyError, TypeError):
        raise _not_ndif(host, f"nnsight's status websocket with {str(message)[:40]!r}") from None
    return session


def _http_status_kind(status: int) -> str:
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "model"
    if status == 413:
        return "payload"
    if status in (408, 429) or status >= 500:
        return "transient"
    return "server"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


def _unreachable(host: str, reason: object) -> RemoteError:
    return RemoteError(
        f"cannot reach the NDIF host {host} ({reason}); check host (or env NDIF_HOST) and "
        "that the server is running",
        kind="unreachable",
        param="host",
    )


@dataclass
class _Where:
    """What a failure message names: the host, the model key and the request."""

    host: str
    model_key: str
    request: str

    def error(self, kind: str, detail: str, full: str | None = None) -> RemoteError:
        messages = {
            "auth": f"the NDIF host {self.host} rejected the API key ({detail}); set "
            "NDIF_API_KEY to a valid key",
            "model": f"the NDIF host {self.host} does not serve model key {self.model_key} "
            f"({detail}); check model_key (hosted mode: the server must deploy that "
            "graft pair)",
            "payload": f"the NDIF host {self.host} refused {self.request} as too large "
            f"({detail}): use donor_mode='hosted', graft fewer cells, or send fewer rows per "
            "request (rows_per_request)",
            "transient": f"{self.request} to {self.host} failed: {detail}",
            "server": f"the server failed while running {self.request}: {detail}",
        }
        return RemoteError(messages[kind], kind=kind, detail=full or detail)


def _classify_transport(exc: BaseException, where: _Where) -> RemoteError | None:
    """A connection, HTTP or timeout failure of the client's own transport (else None)."""
    import socket

    import httpx

    if isinstance(exc, websocket.WebSocketBadStatusException):
        if exc.status_code < 400:  # a plain web server: no websocket upgrade (101)
            return _not_ndif(
                where.host, f"nnsight's status websocket (/subscribe) with HTTP {exc.status_code}"
            )
        if exc.status_code in (403, 404):  # ndif opens /subscribe to anyone: not a key problem
            return RemoteError(
                f"{where.host} refused nnsight's status websocket (HTTP {exc.status_code} on "
                "/subscribe): it does not speak nnsight 0.8's protocol; check host (or env "
                "NDIF_HOST) and that the server runs an ndif release for nnsight >=0.8,<0.9",
                kind="protocol",
                param="host",
            )
        return where.error(_http_status_kind(exc.status_code), f"HTTP {exc.status_code}")
    if isinstance(exc, TimeoutError | websocket.WebSocketTimeoutException | httpx.TimeoutException):
        return RemoteError(
            f"no result from {where.host} for {where.request} ({exc}); raise timeout_s "
            "or send fewer rows per request",
            kind="timeout",
        )
    if isinstance(exc, websocket.WebSocketConnectionClosedException | httpx.RemoteProtocolError):
        return where.error("transient", f"the connection dropped ({exc})")
    if isinstance(exc, ConnectionError | socket.gaierror | websocket.WebSocketAddressException):
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return _unreachable(where.host, reason)
    if isinstance(exc, httpx.HTTPStatusError):
        return where.error(_http_status_kind(exc.response.status_code), str(exc))
    if isinstance(exc, httpx.ConnectError):
        return _unreachable(where.host, exc)
    if isinstance(exc, httpx.TransportError):
        return where.error("transient", str(exc))
    return None


def _classify_server_text(text: str, where: _Where, stage: str | None = None) -> RemoteError:
    """An ERROR status from the server: its description (``stage``: the last status before)."""
    lower = text.lower()
    if stage in _DEPLOY_STAGES:
        return RemoteError(
            f"the NDIF host {where.host} could not deploy model key {where.model_key} "
            f"({_last_line(text)}); have the server deploy it (check model_key)",
            kind="model",
            detail=text,
        )
    if "unknownpersistentiderror" in lower:
        missing = _last_line(text).rpartition(": ")[2]
        return RemoteError(
            f"the model served as {where.model_key} at {where.host} has no module {missing} "
            "that the local base has: the key names a different model than the base loaded "
            "here",
            kind="model",
            detail=text,
        )
    if "traceback" not in lower:
        if "api key" in lower or "api_key" in lower or "unauthorized" in lower:
            return where.error("auth", _last_line(text), text)
        if "model" in lower and any(
            w in lower for w in ("not deployed", "not served", "not found", "unknown model")
        ):
            return where.error("model", _last_line(text), text)
    return where.error("server", _last_line(text), text)


def _classify_nnsight(exc: BaseException, where: _Where) -> RemoteError:
    """nnsight's own RemoteError: a failed POST (its cause) or the server's error text."""
    import httpx

    cause = exc.__cause__
    if isinstance(cause, httpx.HTTPStatusError):
        detail = str(exc).removeprefix("Failed to send request: ")
        status = cause.response.status_code
        return where.error(_http_status_kind(status), f"HTTP {status}: {detail}")
    if isinstance(cause, httpx.ConnectError):
        return _unreachable(where.host, cause)
    if isinstance(cause, httpx.TransportError):
        return where.error("transient", str(cause))
    return _classify_server_text(str(exc), where, getattr(exc, "graft_stage", None))


def classify(exc: BaseException, *, host: str, model_key: str, where: str) -> RemoteError:
    """Turn whatever nnsight's client raised into a one-line :class:`RemoteError`."""
    import pydantic
    from nnsight.intervention.backends.remote import RemoteError as NnsightRemoteError

    if isinstance(exc, RemoteError):
        return exc
    if isinstance(exc, pydantic.ValidationError):  # a status or reply nnsight cannot read
        return _not_ndif(host, f"{where} with a reply nnsight cannot read as a {exc.title}")
    at = _Where(host, model_key, where)
    transport = _classify_transport(exc, at)
    if transport is not None:
        return transport
    if isinstance(exc, NnsightRemoteError):
        return _classify_nnsight(exc, at)
    if isinstance(exc, OSError):
        return at.error("transient", f"{type(exc).__name__}: {exc}")
    return RemoteError(f"{where} failed on the client: {type(exc).__name__}: {exc}", kind="config")


@dataclass
class Target:
    """Where one run's requests go.

    Args:
        config: the run's remote configuration.
        model: the nnsight wrapper of the client's base (its traces are what is sent).
        host: the server URL (``"simulate"`` for in-process simulation).
        model_key: the key the server knows the base by (``"simulate"`` likewise).
        env: what the server should match (the base's attention implementation).
    """

    config: RemoteConfig
    model: Any
    host: str
    model_key: str
    env: dict[str, str]

    @classmethod
    def of(cls, config: RemoteConfig, base: Any) -> Target:
        """The target of ``config`` for ``base`` (resolves host, key and API key settings)."""
        torch_base = unwrap(base)
        remote = config.mode == "remote"
        env: dict[str, str] = {}
        attn = getattr(getattr(torch_base, "config", None), "_attn_implementation", None)
        if attn:
            env["attn_implementation"] = attn
        if config.donor_mode == "hosted":  # trace as the server's graft pair
            from graft.remote.hosted import wrap_pair_base

            model = wrap_pair_base(base)
        else:
            model = wrap(base)
        return cls(
            config=config,
            model=model,
            host=config.resolved_host() if remote else "simulate",
            model_key=config.resolved_model_key(torch_base) if remote else "simulate",
            env=env,
        )

    def backend(self) -> Backend:
        """A fresh nnsight backend for one attempt."""
        cfg = self.config
        if cfg.mode == "simulate":
            return simulation_backend(self.model, verbose=cfg.verbose)
        backend = GraftRemoteBackend(
            self.model_key,
            host=self.host,
            api_key=cfg.resolved_api_key(),
            env=self.env,
            max_payload_bytes=cfg.max_payload_bytes,
            timeout_s=cfg.timeout_s,
            log=logger.info if cfg.verbose else None,
        )
        backend.compress = cfg.compress
        return backend


def send(target: Target, body: Callable[[Any], Sequence[Any]], where: str) -> tuple[list[Any], int]:
    """Run ``body(backend)`` (one request) with retries: (its results, payload bytes sent).

    Raises:
        RemoteError: the failure, classified; transient kinds only after the last retry.
    """
    cfg = target.config
    attempts = cfg.retries + 1
    for attempt in range(1, attempts + 1):
        backend = target.backend()
        try:
            results = body(backend)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a RemoteError
            if cfg.mode == "simulate" and not isinstance(exc, RemoteError):
                raise
            err = classify(exc, host=target.host, model_key=target.model_key, where=where)
            if err.kind not in _RETRYABLE or attempt == attempts:
                if attempts > 1 and err.kind in _RETRYABLE:
                    err = RemoteError(
                        f"{err} (gave up after {attempts} attempts)",
                        kind=err.kind,
                        detail=err.detail,
                    )
                raise err from exc
            wait = cfg.retry_wait_s * 2 ** (attempt - 1)
            logger.warning(
                "%s: %s; retrying in %g s (%d/%d)", where, err, wait, attempt, cfg.retries
            )
            time.sleep(wait)
            continue
        return list(results), getattr(backend, "payload_bytes", 0)
    raise AssertionError("unreachable")


def check_reachable(cfg: RemoteConfig, timeout_s: float = 10.0) -> None:
    """Fail fast, before a run writes or finetunes anything, when ``cfg`` runs on a server
    that accepts no connection (a TCP connect to its host and port; no request is sent).

    Raises:
        RemoteError: kind ``unreachable`` (or ``config`` for a malformed host URL).
    """
    import socket
    from urllib.parse import urlsplit

    if getattr(cfg, "mode", "local") != "remote":
        return
    host = cfg.resolved_host()
    url = urlsplit(host if "://" in host else f"https://{host}")
    try:
        port = url.port or (80 if url.scheme in ("http", "ws") else 443)
    except ValueError:
        port = None
    if not url.hostname or port is None:
        raise RemoteError(
            f"NDIF host {host!r} is not a URL such as https://api.ndif.us; check host (or env "
            "NDIF_HOST)",
            kind="config",
            param="host",
        )
    try:
        with socket.create_connection((url.hostname, port), timeout=min(timeout_s, cfg.timeout_s)):
            pass
    except OSError as err:
        reason = err.strerror or str(err) or type(err).__name__
        raise _unreachable(host, reason) from None


def server_versions(cfg: RemoteConfig, timeout_s: float = 30.0) -> dict[str, str] | None:
    """What the NDIF server runs (its ``GET /env``): Python and the packages that decide results.

    ``{"host": ..., "python": "3.12.1", "ndif": "0.1.2", "nnsight": "0.8.1", ...}`` (packages
    of :data:`SERVER_PACKAGES` the server lacks are left out), or None when the run is not
    remote or the server does not say (an older server, or no answer within ``timeout_s``):
    recording versions must never stop a run.
    """
    if cfg.mode != "remote":
        return None
    import httpx

    host = cfg.resolved_host()
    api_key = cfg.resolved_api_key()
    try:
        response = httpx.get(
            f"{host}/env",
            headers={"ndif-api-key": api_key} if api_key else None,
            timeout=timeout_s,
        )
        response.raise_for_status()
        env = response.json()
        packages = env.get("packages", {})
        python = str(env.get("python_version", "")).split(" ")[0]
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    found = {name: str(packages[name]) for name in SERVER_PACKAGES if name in packages}
    return {"host": host, **({"python": python} if python else {}), **found}
