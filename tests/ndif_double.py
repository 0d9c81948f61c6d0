"""A test double of an NDIF server's wire protocol, driven by nnsight's real ``RemoteBackend``.

What the real server is for and what this double is kept for: the real ``ndif`` server
(tests/remote/real, run by scripts/ndif/ci.sh) proves that graft's requests run on it --
both donor modes, its trusted and its sandbox path, its own error responses; it needs root
and a Python 3.12 server venv, so it runs in CI, not in the default suite. This double keeps
the default suite's remote tests fast and server-free, and it is the only check of what the
real server cannot be made to produce here: an API-key rejection (ndif checks keys only
with its Postgres key database), a 413 for an oversized request (ndif sets no request cap),
transient 503s to retry, a result fetched from a URL (ndif does that only through an S3
object store), a server without ``graft`` installed (checked while deserialising), and a
record of every request it received.

The protocol, as nnsight 0.8.1's client (``nnsight/intervention/backends/remote.py``) speaks it:

1. ``GET /subscribe`` upgrades to a plain websocket (the ``websocket-client`` package, not
   socket.io); the server's first text frame is ``{"session_id": "..."}``.
2. ``POST /request``, multipart: form field ``data`` = the ``RequestModel`` JSON (model_key,
   session_id, compress, env) and file ``blob`` = the serialised trace (zstd when
   ``compress``). Headers ``ndif-api-key`` (if the client has one), ``nnsight-version``,
   ``python-version``, ``ndif-timestamp``. The reply is a ``ResponseModel`` JSON (RECEIVED, or
   ERROR); an HTTP error's JSON ``{"detail": ...}`` becomes the client's error text.
3. Status updates come as websocket text frames (``ResponseModel`` JSON): QUEUED, RUNNING,
   then COMPLETED with ``data`` = a URL the client GETs for the result (or a binary frame:
   a ``torch.save``-d ``ResponseModel`` whose ``data`` is the result bytes), or ERROR with the
   server's traceback as ``description``.
4. The result is ``torch.save({name: saved value})``, zstd-compressed when the request was.

Execution copies NDIF's model actor: ``RequestModel.deserialize(blob, persistent objects of
the served model, compress)``, then ``tracer.execute(tracer.info.code)`` between nnsight's
``inc()``/``dec()``, collecting the frame's ``nnsight.save``-d values. While the payload is
deserialised the ``graft`` package is made unimportable, as on a server without it: the
trace code must travel by value.

A model key served with ``None`` is built on first use with nnsight's
``Remotable.from_model_key(key, dispatch=True)``, the way NDIF deploys a model.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.abc
import io
import json
import sys
import threading
import traceback
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class RequestRecord:
    """What the double saw of one ``POST /request``."""

    model_key: str
    payload_bytes: int
    compress: bool
    headers: dict
    env: dict = field(default_factory=dict)
    outcome: str = "received"


class _Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, roots) -> None:
        self.roots = tuple(roots)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.roots:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed on this server)")
        return None


@contextlib.contextmanager
def unimportable(roots):
    """Hide the packages ``roots`` (already imported or not) for the duration."""
    if not roots:
        yield
        return
    hidden = {n: sys.modules.pop(n) for n in list(sys.modules) if n.split(".")[0] in roots}
    blocker = _Blocker(roots)
    sys.meta_path.insert(0, blocker)
    try:
        yield
    finally:
        sys.meta_path.remove(blocker)
        sys.modules.update(hidden)


def persistent_objects(model) -> dict:
    """The server-side id -> object map used to resolve a request's persistent ids."""
    if hasattr(model, "_remoteable_persistent_objects"):
        return model._remoteable_persistent_objects()
    objects = {"Interleaver": model.interleaver}
    for envoy in model.modules():
        objects[f"Module:{envoy.path}"] = envoy._module
    return objects


class NdifDouble:
    """An in-process NDIF stand-in on ``127.0.0.1`` (a background thread running aiohttp).

    Args:
        models: ``{model key: nnsight wrapper}``; a ``None`` value is built from the key on
            first use (``Remotable.from_model_key(key, dispatch=True)``).
        api_keys: accepted ``ndif-api-key`` values (None: accept any, including none).
        max_request_bytes: refuse a bigger payload with HTTP 413.
        transient_failures: answer this many next requests with HTTP 503.
        result_on_socket: send COMPLETED as a binary frame carrying the result, instead of
            a URL to download it from.
        hidden_packages: packages made unimportable while a payload is deserialised.
    """

    def __init__(
        self,
        models: Mapping[str, Any],
        *,
        api_keys=None,
        max_request_bytes: int | None = None,
        transient_failures: int = 0,
        result_on_socket: bool = False,
        hidden_packages=("graft",),
    ) -> None:
        self.models = dict(models)
        self.api_keys = set(api_keys) if api_keys is not None else None
        self.max_request_bytes = max_request_bytes
        self.transient_failures = transient_failures
        self.result_on_socket = result_on_socket
        self.hidden_packages = tuple(hidden_packages)
        self.requests: list[RequestRecord] = []
        self.url = ""
        self._sockets: dict = {}
        self._results: dict[str, bytes] = {}
        self._responses: dict[str, str] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> NdifDouble:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> NdifDouble:
        from aiohttp import web

        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                app = web.Application(client_max_size=1 << 34)
                app.router.add_get("/subscribe", self._subscribe)
                app.router.add_post("/request", self._request)
                app.router.add_get("/result/{id}", self._result)
                app.router.add_get("/response/{id}", self._response)
                app.router.add_get("/ping", self._ping)
                self._runner = web.AppRunner(app, access_log=None)
                self._loop.run_until_complete(self._runner.setup())
                site = web.TCPSite(self._runner, "127.0.0.1", 0)
                self._loop.run_until_complete(site.start())
                port = site._server.sockets[0].getsockname()[1]
                self.url = f"http://127.0.0.1:{port}"
            except BaseException as exc:  # surfaced in start()
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="ndif-double", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown() -> None:
            for ws in list(self._sockets.values()):
                await ws.close()
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()
        self._loop = None

    # --------------------------------------------------------------------- routes
    async def _ping(self, request):
        from aiohttp import web

        return web.Response(text="pong")

    async def _subscribe(self, request):
        from aiohttp import web

        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        session_id = uuid.uuid4().hex
        self._sockets[session_id] = ws
        await ws.send_str(json.dumps({"session_id": session_id}))
        try:
            async for _ in ws:
                pass
        finally:
            self._sockets.pop(session_id, None)
        return ws

    async def _request(self, request):
        from aiohttp import web
        from nnsight.schema.request import RequestModel
        from nnsight.schema.response import ResponseModel, Status

        headers = dict(request.headers)
        key = request.headers.get("ndif-api-key")
        if self.api_keys is not None and key not in self.api_keys:
            return web.json_response({"detail": "Invalid or missing API key."}, status=401)
        if "nnsight-version" not in request.headers:
            return web.json_response({"detail": "Upgrade your nnsight client."}, status=426)
        if self.transient_failures > 0:
            self.transient_failures -= 1
            return web.json_response({"detail": "Service temporarily unavailable."}, status=503)
        data, blob = None, b""
        reader = await request.multipart()
        async for part in reader:
            if part.name == "data":
                data = await part.text()
            elif part.name == "blob":
                blob = bytes(await part.read())
        if data is None:
            return web.json_response({"detail": "form field 'data' is missing"}, status=422)
        req = RequestModel.model_validate_json(data)
        record = RequestRecord(req.model_key, len(blob), req.compress, headers, dict(req.env))
        self.requests.append(record)
        if self.max_request_bytes is not None and len(blob) > self.max_request_bytes:
            record.outcome = "too large"
            return web.json_response(
                {
                    "detail": f"Request payload of {len(blob)} bytes exceeds this server's "
                    f"limit of {self.max_request_bytes} bytes."
                },
                status=413,
            )
        job_id = uuid.uuid4().hex
        if req.model_key not in self.models:
            record.outcome = "not served"
            response = ResponseModel(
                id=job_id,
                status=Status.ERROR,
                description=f"Model key {req.model_key!r} is not deployed on this server.",
            )
            return web.Response(text=response.model_dump_json(), content_type="application/json")
        asyncio.get_running_loop().create_task(self._run(job_id, req, blob, record))
        response = ResponseModel(
            id=job_id, status=Status.RECEIVED, description="Your job has been received."
        )
        self._responses[job_id] = response.model_dump_json()
        return web.Response(text=response.model_dump_json(), content_type="application/json")

    async def _result(self, request):
        from aiohttp import web

        data = self._results.pop(request.match_info["id"], None)
        if data is None:
            return web.json_response({"detail": "no such result"}, status=404)
        return web.Response(body=data, content_type="application/octet-stream")

    async def _response(self, request):
        from aiohttp import web

        text = self._responses.get(request.match_info["id"])
        if text is None:
            return web.json_response({"detail": "no such job"}, status=404)
        return web.Response(text=text, content_type="application/json")

    # ------------------------------------------------------------------ execution
    async def _emit(self, session_id: str, response) -> None:
        self._responses[response.id] = response.model_dump_json()
        ws = self._sockets.get(session_id)
        if ws is not None and not ws.closed:
            await ws.send_str(response.model_dump_json())

    async def _run(self, job_id: str, req, blob: bytes, record: RequestRecord) -> None:
        from nnsight.schema.response import ResponseModel, Status

        await self._emit(req.session_id, ResponseModel(id=job_id, status=Status.QUEUED))
        await self._emit(
            req.session_id,
            ResponseModel(id=job_id, status=Status.RUNNING, description="Your job has started."),
        )
        try:
            data = await asyncio.to_thread(self._execute, req, blob)
        except Exception as exc:
            record.outcome = "error"
            description = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            await self._emit(
                req.session_id,
                ResponseModel(id=job_id, status=Status.ERROR, description=description),
            )
            return
        record.outcome = "completed"
        done = "Your job has been completed."
        ws = self._sockets.get(req.session_id)
        if self.result_on_socket and ws is not None:
            response = ResponseModel(
                id=job_id, status=Status.COMPLETED, description=done, data=data
            )
            await ws.send_bytes(response.pickle())
            return
        self._results[job_id] = data
        await self._emit(
            req.session_id,
            ResponseModel(
                id=job_id,
                status=Status.COMPLETED,
                description=done,
                data=f"{self.url}/result/{job_id}",
            ),
        )

    def _model(self, key: str):
        model = self.models[key]
        if model is None:
            from nnsight.modeling.mixins.remotable import Remotable

            model = self.models[key] = Remotable.from_model_key(key, dispatch=True)
        return model

    def _execute(self, req, blob: bytes) -> bytes:
        from nnsight.schema.request import RequestModel
        from nnsight.tracing.tracer import _saves, dec, inc

        with self._lock:
            model = self._model(req.model_key)
            with unimportable(self.hidden_packages):
                tracer = RequestModel.deserialize(blob, persistent_objects(model), req.compress)
            if hasattr(model, "_remoteable_set_env"):
                model._remoteable_set_env(req.env)
            inc()
            try:
                tracer.execute(tracer.info.code)
                saves = _saves()
                saved = {
                    name: value
                    for name, value in tracer.info.frame.f_locals.items()
                    if id(value) in saves
                }
            finally:
                dec()
        buffer = io.BytesIO()
        torch.save(saved, buffer)
        data = buffer.getvalue()
        if req.compress:
            import zstandard

            data = zstandard.ZstdCompressor(level=3).compress(data)
        return data
