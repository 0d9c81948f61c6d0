"""Whatever nnsight's client raised, turned into one :class:`~graft.errors.RemoteError` line
with a ``kind`` (``unreachable``, ``protocol``, ``auth``, ``model``, ``payload``, ``server``,
``timeout``, ``transient``, ``config``) that names the host, the model key or the request."""

from __future__ import annotations

from dataclasses import dataclass

import websocket

from graft.errors import RemoteError

# the server failed while it was provisioning or deploying the model, before running anything
_DEPLOY_STAGES = ("PROVISIONING", "DEPLOYING")


def not_ndif(host: str, what: str) -> RemoteError:
    """``host`` answered, but not as an NDIF server does (``what``: how it answered)."""
    return _host_error(
        f"{host} answered {what}: the reply is not an NDIF response; check that host (or env "
        "NDIF_HOST) points at an NDIF server",
        "protocol",
    )


def _host_error(message: str, kind: str) -> RemoteError:
    """An error of ``kind`` that the host setting fixes."""
    return RemoteError(message, kind=kind, param="host")


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


#: How the note graft adds to an error raised while it grafts a module begins (a traceback
#: prints it after the error's own line).
GRAFT_NOTE = "graft: raised while grafting"


def _last_line(text: str) -> str:
    """The error's own line of a server's traceback text, with graft's note when it has one."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    notes = [ln for ln in lines if ln.startswith(GRAFT_NOTE)]
    rest = [ln for ln in lines if not ln.startswith(GRAFT_NOTE)]
    line = rest[-1] if rest else "no message"
    return f"{line} ({notes[-1]})" if notes else line


def unreachable(host: str, reason: object) -> RemoteError:
    return _host_error(
        f"cannot reach the NDIF host {host} ({reason}); check host (or env NDIF_HOST) and "
        "that the server is running",
        "unreachable",
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
            return not_ndif(
                where.host, f"nnsight's status websocket (/subscribe) with HTTP {exc.status_code}"
            )
        if exc.status_code in (403, 404):  # ndif opens /subscribe to anyone: not a key problem
            return _host_error(
                f"{where.host} refused nnsight's status websocket (HTTP {exc.status_code} on "
                "/subscribe): it does not speak nnsight 0.8's protocol; check host (or env "
                "NDIF_HOST) and that the server runs an ndif release for nnsight >=0.8,<0.9",
                "protocol",
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
        return unreachable(where.host, reason)
    if isinstance(exc, httpx.HTTPStatusError):
        return where.error(_http_status_kind(exc.response.status_code), str(exc))
    if isinstance(exc, httpx.ConnectError):
        return unreachable(where.host, exc)
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
        return unreachable(where.host, cause)
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
        return not_ndif(host, f"{where} with a reply nnsight cannot read as a {exc.title}")
    at = _Where(host, model_key, where)
    transport = _classify_transport(exc, at)
    if transport is not None:
        return transport
    if isinstance(exc, NnsightRemoteError):
        return _classify_nnsight(exc, at)
    if isinstance(exc, OSError):
        return at.error("transient", f"{type(exc).__name__}: {exc}")
    return RemoteError(f"{where} failed on the client: {type(exc).__name__}: {exc}", kind="config")
