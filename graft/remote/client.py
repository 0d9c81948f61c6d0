"""Remote execution of grafts on an NDIF(-compatible) server, through nnsight's own client.

One choice of backend is shared by every command (:class:`RemoteConfig`, CLI options from
:func:`remote_options`), and one function runs a list of rows locally or remotely
(:func:`run_rows`). The trace body is the engine's (:func:`graft.core.engine.graft_trace_body`);
remotely, many batches go in one request as an nnsight *session*, so donor weights shipped
with a request are sent once for all its batches.

Donor weights reach the server in one of two ways (``--donor-mode``):

``ship``
    the donor modules of exactly the grafted (layer, component) sites travel in the request,
    serialised by nnsight with the trace (the base is named by its model key and never
    travels). Exact; the payload grows with what is grafted: :func:`estimate_payload_bytes`
    sizes it, each request prints its size before it is sent, and a request over
    ``max_payload_mb`` is refused before anything is sent.
``hosted``
    a self-hosted server holds a graft pair (:class:`graft.remote.hosted.GraftPairModel`: the base
    with the donors attached as ``graft_donors``); only module ids travel. The client needs
    no donor weights, and its base may be a weightless meta copy (:func:`meta_model`).

Errors surface as :class:`RemoteError` with a one-line message and a ``kind``
(``unreachable``, ``auth``, ``model``, ``payload``, ``server``, ``timeout``, ``transient``,
``config``); transient ones (connection drops, 5xx/429, timeouts, an unreachable host) are
retried ``retries`` times with exponential back-off.

``mode="simulate"`` runs nnsight's in-process serialise / deserialise path (``remote=
"local"``) instead of a server: a cheap check that a trace is remote-safe.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import time
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import nnsight
import torch
from torch import nn

from graft.core.arch import Architecture, architecture_of, check_compatible
from graft.core.engine import (
    GraftRow,
    _unwrap,
    default_pad_id,
    graft_trace_body,
    plan_batch,
    resolve_rows,
    wrap,
)
from graft.core.spec import (
    EMBEDDING_COMPONENTS,
    GraftSpec,
    expand_components,
    parse_spec,
)
from graft.errors import RemoteError

MODES = ("local", "remote", "simulate")
DONOR_MODES = ("ship", "hosted")
DEFAULT_MAX_PAYLOAD_MB = 512.0
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_RETRIES = 2
TRANSFORMERS_MODEL_CLASS = "nnsight.modeling.transformers.TransformersModel"
_RETRYABLE = ("unreachable", "timeout", "transient")
_MB = 1024 * 1024


# ------------------------------------------------------------------------------- config


@dataclass
class RemoteConfig:
    """Where and how grafts run; shared by every experiment command.

    Args:
        mode: ``"local"`` (this machine), ``"remote"`` (an NDIF server through nnsight's
            ``RemoteBackend``) or ``"simulate"`` (nnsight's in-process serialise /
            deserialise path, ``remote="local"``: a remote-safety check without a server).
        host: NDIF base URL; ``None`` means env ``NDIF_HOST``, else nnsight's configured host
            (``https://api.ndif.us``). CLI ``--ndif-host``.
        api_key: NDIF API key; ``None`` means env ``NDIF_API_KEY``, else nnsight's configured
            key. Never a CLI option (keep keys out of shell history).
        donor_mode: ``"ship"`` (the grafted donor modules travel with each request) or
            ``"hosted"`` (a self-hosted server holds a graft pair; only ids travel).
            CLI ``--donor-mode``.
        max_payload_mb: largest request payload sent, in MiB (ship mode: the donor weights);
            a bigger request is refused before sending. CLI ``--max-payload-mb``.
        timeout_s: seconds to wait for one request's result. CLI ``--remote-timeout``.
        retries: extra attempts for a request that failed transiently (connection, 5xx/429,
            timeout). CLI ``--remote-retries``.
        retry_wait_s: back-off before the first retry, doubled at each next one.
        model_key: nnsight model key the server knows the model by. ``None`` derives it: in
            ship mode from the base's hub id (``config._name_or_path``) as nnsight's
            ``TransformersModel`` does, in hosted mode from the hub id and ``hosted_donors``
            (:func:`graft.remote.hosted.hosted_model_key`). CLI ``--ndif-model-key``.
        hosted_donors: hosted mode: ``{donor name: source on the server}`` used to derive
            the graft-pair key. CLI ``--hosted-donor NAME=SOURCE`` (repeatable).
        rows_per_request: most rows sent in one request (a request runs its batches as one
            nnsight session, so shipped donor weights are sent once per request).
        compress: zstd-compress payloads and results (nnsight's ``CONFIG.API.COMPRESS``).
        verbose: print every server status update.
    """

    mode: str = "local"
    host: str | None = None
    api_key: str | None = None
    donor_mode: str = "ship"
    max_payload_mb: float = DEFAULT_MAX_PAYLOAD_MB
    timeout_s: float = DEFAULT_TIMEOUT_S
    retries: int = DEFAULT_RETRIES
    retry_wait_s: float = 2.0
    model_key: str | None = None
    hosted_donors: dict[str, str] = field(default_factory=dict)
    rows_per_request: int = 256
    compress: bool = True
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise RemoteError(f"mode {self.mode!r} unknown: use {', '.join(MODES)}", kind="config")
        if self.donor_mode not in DONOR_MODES:
            raise RemoteError(
                f"donor mode {self.donor_mode!r} unknown: use ship or hosted", kind="config"
            )
        if not self.max_payload_mb > 0:
            raise RemoteError("--max-payload-mb must be positive", kind="config")
        if self.rows_per_request < 1 or self.retries < 0 or not self.timeout_s > 0:
            raise RemoteError(
                "rows_per_request >= 1, retries >= 0 and timeout_s > 0 are needed", kind="config"
            )

    @property
    def enabled(self) -> bool:
        """Whether grafts leave the plain local path (remote or simulated)."""
        return self.mode != "local"

    @property
    def max_payload_bytes(self) -> int:
        return int(self.max_payload_mb * _MB)

    def resolved_host(self) -> str:
        """The host URL in use (option, else ``NDIF_HOST``, else nnsight's configured host)."""
        from nnsight import CONFIG

        host = self.host or os.environ.get("NDIF_HOST") or CONFIG.API.HOST
        return host.rstrip("/")

    def resolved_api_key(self) -> str:
        from nnsight import CONFIG

        return self.api_key or os.environ.get("NDIF_API_KEY") or CONFIG.API.APIKEY or ""

    def resolved_model_key(self, base: nn.Module | None = None) -> str:
        """The model key sent with each request (see ``model_key``)."""
        if self.model_key:
            return self.model_key
        repo = getattr(getattr(_unwrap(base), "config", None), "_name_or_path", None) or ""
        looks_like_hub_id = repo.count("/") == 1 and not repo.startswith(("/", ".", "~"))
        if not looks_like_hub_id or os.path.exists(repo):
            raise RemoteError(
                f"cannot tell which model key the server knows the base by (it was loaded from "
                f"{repo or 'an unknown source'!r}, not a hub id): pass --ndif-model-key",
                kind="config",
            )
        if self.donor_mode == "hosted":
            if not self.hosted_donors:
                raise RemoteError(
                    "hosted mode needs the graft pair's model key: pass --ndif-model-key KEY or "
                    "--hosted-donor NAME=SOURCE for each donor the server holds",
                    kind="config",
                )
            from graft.remote.hosted import hosted_model_key

            return hosted_model_key(repo, self.hosted_donors)
        return hf_model_key(repo)

    @classmethod
    def from_options(
        cls,
        remote: bool | str = False,
        ndif_host: str | None = None,
        donor_mode: str = "ship",
        max_payload_mb: float = DEFAULT_MAX_PAYLOAD_MB,
        ndif_model_key: str | None = None,
        hosted_donor: Iterable[str] = (),
        remote_timeout: float = DEFAULT_TIMEOUT_S,
        remote_retries: int = DEFAULT_RETRIES,
        **extra,
    ) -> RemoteConfig:
        """Build from the values of :func:`remote_options` (``remote`` may also be a mode)."""
        mode = remote if isinstance(remote, str) else ("remote" if remote else "local")
        donors = {}
        for item in hosted_donor or ():
            name, sep, source = item.partition("=")
            if not sep or not name.strip() or not source.strip():
                raise RemoteError(
                    f"--hosted-donor {item!r}: write NAME=SOURCE, e.g. sft=/models/llama-sft",
                    kind="config",
                )
            donors[name.strip()] = source.strip()
        return cls(
            mode=mode,
            host=ndif_host or None,
            donor_mode=donor_mode,
            max_payload_mb=float(max_payload_mb),
            model_key=ndif_model_key or None,
            hosted_donors=donors,
            timeout_s=float(remote_timeout),
            retries=int(remote_retries),
            **extra,
        )


def hf_model_key(repo_id: str, revision: str | None = None) -> str:
    """The key nnsight's ``TransformersModel`` sends for a causal LM from the hub.

    Same string as ``TransformersModel(repo_id).to_model_key()`` without its hub call (which
    only canonicalises the id's spelling): ``nnsight.modeling.transformers.TransformersModel:
    {"repo_id": ..., "revision": ..., "task": "text-generation"}``.
    """
    suffix = json.dumps({"repo_id": repo_id, "revision": revision, "task": "text-generation"})
    return f"{TRANSFORMERS_MODEL_CLASS}:{suffix}"


def remote_options(func: Callable) -> Callable:
    """Click decorator: add the remote-execution options; the command gets ``remote=RemoteConfig``.

    Options: ``--remote`` (run on an NDIF server), ``--ndif-host URL``, ``--ndif-model-key KEY``,
    ``--donor-mode ship|hosted``, ``--hosted-donor NAME=SOURCE`` (repeatable),
    ``--max-payload-mb N``, ``--remote-timeout S``, ``--remote-retries N``. Their values reach
    the command as one keyword argument ``remote`` (a :class:`RemoteConfig`; ``mode ==
    "local"`` without ``--remote``). A bad combination is a ``click.BadParameter``; any of
    the other options without ``--remote`` is a usage error (exit 2), never silently ignored.
    """
    import click
    from click.core import ParameterSource

    names = (
        "remote_flag",
        "ndif_host",
        "ndif_model_key",
        "donor_mode",
        "hosted_donor",
        "max_payload_mb",
        "remote_timeout",
        "remote_retries",
    )

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        values = {n: kwargs.pop(n) for n in names if n in kwargs}
        try:
            kwargs["remote"] = RemoteConfig.from_options(
                remote=values.pop("remote_flag", False), **values
            )
        except RemoteError as err:
            raise click.BadParameter(str(err)) from err
        if kwargs["remote"].mode == "local":
            ctx = click.get_current_context()
            given = [
                p.opts[0]
                for p in ctx.command.params
                if p.name in values
                and ctx.get_parameter_source(p.name) not in (None, ParameterSource.DEFAULT)
            ]
            if given:
                one = len(given) == 1
                raise click.UsageError(
                    f"{', '.join(given)} {'applies' if one else 'apply'} only to remote runs: "
                    f"add --remote (or drop {'it' if one else 'them'})"
                )
        return func(*args, **kwargs)

    options = [
        click.option(
            "--remote",
            "remote_flag",
            is_flag=True,
            help="Run the grafted forward passes on an NDIF server (nnsight's remote client).",
        ),
        click.option(
            "--ndif-host",
            default=None,
            metavar="URL",
            help="NDIF server URL [default: env NDIF_HOST, else nnsight's host]. The API key "
            "is read from env NDIF_API_KEY.",
        ),
        click.option(
            "--ndif-model-key",
            default=None,
            metavar="KEY",
            help="Model key the server knows the model by [default: derived from the base's "
            "hub id].",
        ),
        click.option(
            "--donor-mode",
            type=click.Choice(DONOR_MODES),
            default="ship",
            show_default=True,
            help="ship: send the grafted donor modules with each request; hosted: the server "
            "holds a graft pair (graft.remote.hosted.GraftPairModel), only ids travel.",
        ),
        click.option(
            "--hosted-donor",
            multiple=True,
            metavar="NAME=SOURCE",
            help="Hosted mode: a donor the server holds (hub id or server path), to derive "
            "the graft-pair model key.",
        ),
        click.option(
            "--max-payload-mb",
            type=click.FloatRange(0, min_open=True),
            default=DEFAULT_MAX_PAYLOAD_MB,
            show_default=True,
            help="Refuse a request whose payload (ship mode: donor weights) is bigger.",
        ),
        click.option(
            "--remote-timeout",
            type=click.FloatRange(0, min_open=True),
            default=DEFAULT_TIMEOUT_S,
            show_default=True,
            help="Seconds to wait for one request's result.",
        ),
        click.option(
            "--remote-retries",
            type=click.IntRange(0),
            default=DEFAULT_RETRIES,
            show_default=True,
            help="Retries of a request that failed transiently.",
        ),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


# ----------------------------------------------------------------- serialisation helpers


def register_by_value() -> None:
    """Ship graft's trace code by value, so the server needs no ``graft`` installed."""
    import nnsight

    nnsight.register("graft.core.engine")


class _PersistentObjects:
    """What nnsight's ``LocalSimulationBackend`` needs from a model: its persistent objects.

    nnsight's ``Remotable`` wrappers have ``_remoteable_persistent_objects``; a plain
    ``NNsight`` wrapper does not, so this builds the same map (interleaver plus every module
    by path) for any envoy.
    """

    def __init__(self, envoy) -> None:
        self.envoy = envoy

    def _remoteable_persistent_objects(self) -> dict:
        if hasattr(self.envoy, "_remoteable_persistent_objects"):
            return self.envoy._remoteable_persistent_objects()
        objects = {"Interleaver": self.envoy.interleaver}
        for envoy in self.envoy.modules():
            objects[f"Module:{envoy.path}"] = envoy._module
        return objects


def simulation_backend(envoy, verbose: bool = False):
    """nnsight's in-process serialise/deserialise backend (``remote="local"``) for any envoy."""
    from nnsight.intervention.backends.local import LocalSimulationBackend

    register_by_value()
    return LocalSimulationBackend(_PersistentObjects(envoy), verbose=verbose)


def _plain(patch):
    """A SitePatch as a SimpleNamespace: no graft class has to be rebuilt on the server."""
    if dataclasses.is_dataclass(patch):
        return types.SimpleNamespace(
            **{f.name: getattr(patch, f.name) for f in dataclasses.fields(patch)}
        )
    return patch


def _strip_persistent_ids(modules: Iterable) -> None:
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


def prepare_remote_trace(model, patches, donor_modules, remote, backend):
    """Make one engine trace remote-safe; returns ``(patches, donor_modules, backend, remote)``.

    Used by :func:`graft.core.engine.run_plan` whenever ``remote`` or ``backend`` is given: patches
    become plain namespaces, the engine is registered to travel by value, shipped donor
    modules lose stale persistent ids, and ``remote="local"`` works for plain ``NNsight``
    wrappers (nnsight only accepts it on its ``Remotable`` wrappers).
    """
    from nnsight.modeling.mixins.remotable import Remotable

    register_by_value()
    _strip_persistent_ids(donor_modules.values())
    if backend is None and remote and not isinstance(model, Remotable):
        if remote != "local":
            raise RemoteError(
                "remote=True needs an nnsight model with a model key; for a plain model use "
                "graft.remote.client.run_rows(..., remote=RemoteConfig(mode='remote', ...))",
                kind="config",
            )
        backend, remote = simulation_backend(model), False
    return [_plain(p) for p in patches], donor_modules, backend, remote


# ------------------------------------------------------------------------ payload sizes


def gpt2_xl_config():
    """Hand-written config of gpt2-xl (no download): d=1600, 48 layers, 25 heads, tied."""
    import transformers

    return transformers.GPT2Config(
        n_embd=1600, n_layer=48, n_head=25, vocab_size=50257, n_positions=1024
    )


def llama32_1b_config():
    """Hand-written config of Llama-3.2-1B (no download): d=2048, 16 layers, tied embeddings."""
    import transformers

    return transformers.LlamaConfig(
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=8192,
        vocab_size=128256,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        rope_theta=500000.0,
    )


PAPER_CONFIGS: dict[str, Callable] = {
    "gpt2-xl": gpt2_xl_config,
    "llama3.2-1b": llama32_1b_config,
}


def meta_model(config) -> nn.Module:
    """A weightless causal LM of ``config`` on the meta device (shapes only, no download)."""
    import transformers

    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config).eval()


def _module_bytes(modules: Iterable[nn.Module], dtype: torch.dtype | None = None) -> int:
    seen: dict[int, torch.Tensor] = {}
    for module in modules:
        for t in (*module.parameters(), *module.buffers()):
            seen.setdefault(id(t), t)
    size = (lambda t: dtype.itemsize) if dtype is not None else (lambda t: t.element_size())
    return sum(t.numel() * size(t) for t in seen.values())


def spec_module_paths(arch: Architecture, spec: GraftSpec | str) -> set[tuple[str, str]]:
    """``(donor, module path)`` of every donor module ``spec`` can call, on any prompt.

    Positions are taken as non-empty (an upper bound: a rule fully overridden by a later one
    still counts). A fused QKV site counts whole even when only q, k or v is grafted (the
    whole module runs).
    """
    if isinstance(spec, str):
        spec = parse_spec(spec)
    out: set[tuple[str, str]] = set()
    for rule in spec.rules:
        layers = rule.layer_list(arch.n_layers)
        for comp in expand_components(rule.components, arch.components, arch.family):
            for layer in [-1] if comp in EMBEDDING_COMPONENTS else layers:
                out.add((rule.donor, arch.site_for(layer, comp)[0]))
    if spec.head == "donor":
        out.add((spec.head_donor, arch.table.final_norm_path))
        out.add((spec.head_donor, arch.table.unembed_path))
    elif spec.head == "paper" and arch.tied_embeddings:
        embed = arch.table.embed_sites[0].path
        for donor in {d for d, p in out if p == embed}:
            out.add((donor, arch.table.unembed_path))
    return out


def estimate_payload_bytes(
    model, specs: GraftSpec | str | Iterable[GraftSpec | str], *, dtype: torch.dtype | None = None
) -> int:
    """Bytes of donor weights ship mode sends for grafts ``specs`` (one request, all donors).

    Args:
        model: a donor (or the base: same shapes), its nnsight wrapper, or a config
            (``transformers.PretrainedConfig``, built on the meta device: no weights needed).
        specs: one spec or several (text or ``GraftSpec``); modules shared by several count
            once per donor.
        dtype: count every tensor at this dtype's size (default: the tensors' own dtype).

    Tied tensors count once. Serialisation adds a little (the trace, the envoy tree: tens
    of KB); zstd takes little off float weights.
    """
    if not isinstance(model, nn.Module) and hasattr(model, "model_type"):
        model = meta_model(model)
    torch_model = _unwrap(model)
    arch = architecture_of(torch_model)
    if isinstance(specs, str | GraftSpec):
        specs = [specs]
    keys = set().union(*(spec_module_paths(arch, s) for s in specs)) if specs else set()
    per_donor: dict[str, list[nn.Module]] = {}
    for donor, path in keys:
        per_donor.setdefault(donor, []).append(torch_model.get_submodule(path))
    return sum(_module_bytes(mods, dtype) for mods in per_donor.values())


TABLE_SPECS = ("LT:all:all", "LT:q4:o,ffn", "FE:all:attn", "ALL:all:q")


def payload_table(
    specs: Sequence[str] = TABLE_SPECS, models: Mapping[str, Callable] | None = None
) -> list[dict]:
    """Ship-mode payload of each graft on each paper model, from configs alone (meta device).

    One dict per (model, graft): ``model``, ``graft``, ``bytes_float32``, ``bytes_bfloat16``
    (gpt2-xl's checkpoint is float32, Llama-3.2-1B's bfloat16) and ``params``.
    """
    rows = []
    for name, make_config in (models or PAPER_CONFIGS).items():
        model = meta_model(make_config())
        for spec in specs:
            n32 = estimate_payload_bytes(model, spec, dtype=torch.float32)
            rows.append(
                {
                    "model": name,
                    "graft": spec,
                    "params": n32 // 4,
                    "bytes_float32": n32,
                    "bytes_bfloat16": estimate_payload_bytes(model, spec, dtype=torch.bfloat16),
                }
            )
    return rows


def format_bytes(n: float) -> str:
    """``1.23 GB``-style size (powers of 1024)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GB"


# ----------------------------------------------------------------------- nnsight client


def _remote_backend_class():
    """nnsight's ``RemoteBackend`` with a payload limit, a deadline and quiet status output."""
    from nnsight.intervention.backends.display import StatusDisplay
    from nnsight.intervention.backends.remote import RemoteBackend
    from nnsight.schema.response import Status

    class GraftRemoteBackend(RemoteBackend):
        """nnsight's blocking ``RemoteBackend`` (its serialiser, POST, status stream and
        result download), plus: refuse a payload over ``max_payload_bytes`` before sending,
        give up after ``timeout_s`` without a result, and report statuses to ``log``."""

        def __init__(self, model_key, *, max_payload_bytes, timeout_s, log, **kwargs):
            super().__init__(model_key, **kwargs)
            self.max_payload_bytes = max_payload_bytes
            self.timeout_s = timeout_s
            self.log = log
            self.payload_bytes = 0
            self.display = StatusDisplay(enabled=False, verbose=False)

        def _serialize(self, tracer) -> bytes:
            blob = super()._serialize(tracer)
            self.payload_bytes = len(blob)
            if len(blob) > self.max_payload_bytes:
                raise RemoteError(
                    f"the request would send {format_bytes(len(blob))} (limit "
                    f"{format_bytes(self.max_payload_bytes)}): use --donor-mode hosted, graft "
                    "fewer cells, or raise --max-payload-mb",
                    kind="payload",
                )
            return blob

        def request(self, request, tracer):
            import websocket

            blob = self._serialize(tracer)
            connection = websocket.create_connection(
                f"{self.ws_host}/subscribe",
                header={"ndif-api-key": self.api_key} if self.api_key else None,
                timeout=min(30.0, self.timeout_s),
            )
            try:
                request.session_id = json.loads(connection.recv())["session_id"]
                self.send(request, blob)
                deadline = time.monotonic() + self.timeout_s
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
                    result = self.handle(response)
                    if response.status == Status.COMPLETED:
                        return result
            finally:
                connection.close()

    return GraftRemoteBackend


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


def _classify(exc: BaseException, *, host: str, model_key: str, where: str) -> RemoteError:
    """Turn whatever nnsight's client raised into a one-line :class:`RemoteError`."""
    import socket

    import httpx
    import websocket
    from nnsight.intervention.backends.remote import RemoteError as NnsightRemoteError

    if isinstance(exc, RemoteError):
        return exc

    def by_kind(kind: str, detail: str, full: str | None = None) -> RemoteError:
        messages = {
            "auth": f"the NDIF host {host} rejected the API key ({detail}); set NDIF_API_KEY "
            "to a valid key",
            "model": f"the NDIF host {host} does not serve model key {model_key} ({detail}); "
            "check --ndif-model-key (hosted mode: the server must deploy that graft pair)",
            "payload": f"the NDIF host {host} refused {where} as too large ({detail}): use "
            "--donor-mode hosted, graft fewer cells, or send fewer rows per request",
            "transient": f"{where} to {host} failed: {detail}",
            "server": f"the server failed while running {where}: {detail}",
        }
        return RemoteError(messages[kind], kind=kind, detail=full or detail)

    if isinstance(exc, websocket.WebSocketBadStatusException):
        return by_kind(_http_status_kind(exc.status_code), f"HTTP {exc.status_code}")
    if isinstance(exc, TimeoutError | websocket.WebSocketTimeoutException | httpx.TimeoutException):
        return RemoteError(
            f"no result from {host} for {where} ({exc}); raise --remote-timeout or send fewer "
            "rows per request",
            kind="timeout",
        )
    if isinstance(exc, websocket.WebSocketConnectionClosedException | httpx.RemoteProtocolError):
        return by_kind("transient", f"the connection dropped ({exc})")
    if isinstance(exc, ConnectionError | socket.gaierror | websocket.WebSocketAddressException):
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return RemoteError(
            f"cannot reach the NDIF host {host} ({reason}); check --ndif-host / NDIF_HOST and "
            "that the server is running",
            kind="unreachable",
        )
    if isinstance(exc, httpx.HTTPStatusError):
        return by_kind(_http_status_kind(exc.response.status_code), str(exc))
    if isinstance(exc, httpx.ConnectError):
        return RemoteError(
            f"cannot reach the NDIF host {host} ({exc}); check --ndif-host / NDIF_HOST and "
            "that the server is running",
            kind="unreachable",
        )
    if isinstance(exc, httpx.TransportError):
        return by_kind("transient", str(exc))
    if isinstance(exc, NnsightRemoteError):
        cause = exc.__cause__
        text = str(exc)
        if isinstance(cause, httpx.HTTPStatusError):
            detail = text.removeprefix("Failed to send request: ")
            status = cause.response.status_code
            return by_kind(_http_status_kind(status), f"HTTP {status}: {detail}")
        if isinstance(cause, httpx.ConnectError):
            return _classify(cause, host=host, model_key=model_key, where=where)
        if isinstance(cause, httpx.TransportError):
            return by_kind("transient", str(cause))
        # an ERROR status from the server: its description
        lower = text.lower()
        if "unknownpersistentiderror" in lower:
            missing = _last_line(text).rpartition(": ")[2]
            return RemoteError(
                f"the model served as {model_key} at {host} has no module {missing} that the "
                "local base has: the key names a different model than the base loaded here",
                kind="model",
                detail=text,
            )
        if "traceback" not in lower:
            if "api key" in lower or "api_key" in lower or "unauthorized" in lower:
                return by_kind("auth", _last_line(text), text)
            if "model" in lower and any(
                w in lower for w in ("not deployed", "not served", "not found", "unknown model")
            ):
                return by_kind("model", _last_line(text), text)
        return by_kind("server", _last_line(text), text)
    if isinstance(exc, OSError):
        return by_kind("transient", f"{type(exc).__name__}: {exc}")
    return RemoteError(f"{where} failed on the client: {type(exc).__name__}: {exc}", kind="config")


# ------------------------------------------------------------------------------ running


def _request_body(model, batches, donor_modules, backend):
    """One remote request: a session running every batch's grafted trace on the server."""
    with model.session(backend=backend):
        results = nnsight.save([])
        with torch.no_grad():
            for inputs, patches, batch_rows, pick in batches:
                with model.trace(**inputs):
                    graft_trace_body(model, patches, donor_modules)
                    full = model.output.logits
                    results.append(full[batch_rows.to(full.device), pick.to(full.device)])
    return results


def _normalise_donors(donors) -> dict:
    """``{name: model or None}`` from a model, a mapping, or donor names."""
    if isinstance(donors, nn.Module) or hasattr(donors, "trace"):
        return {"sft": donors}
    if isinstance(donors, Mapping):
        return dict(donors)
    if isinstance(donors, str):
        return {donors: None}
    if isinstance(donors, Iterable):
        names = list(donors)
        if all(isinstance(n, str) for n in names):
            return dict.fromkeys(names)
    raise TypeError("donors must be a model, {name: model} or (hosted mode) donor names")


def _log_stderr(message: str) -> None:
    print(f"[graft remote] {message}", file=sys.stderr, flush=True)


def run_rows(
    base,
    donors,
    rows: Sequence[GraftRow],
    *,
    batch_size: int = 16,
    remote: RemoteConfig | None = None,
    progress: bool | str = False,
    padding_side: str = "left",
    pad_id: int | None = None,
    log_probs: bool = False,
    sort_by_length: bool = True,
    log: Callable[[str], None] | None = _log_stderr,
) -> torch.Tensor:
    """Final-position logits of every row, locally or remotely, as ``remote`` says.

    Local (``remote`` is None or ``mode == "local"``) this is :func:`graft.core.engine.run_grafts`.
    Remote and simulated runs batch rows exactly as it does (same batches, so the same
    numbers) and send up to ``remote.rows_per_request`` rows per request, each request one
    nnsight session.

    Args:
        base: the base model (HF causal LM or its nnsight wrapper). Remote: only its module
            tree and config are used, so a weightless :func:`meta_model` copy will do; its
            hub id gives the default model key. Simulated hosted mode: a
            :class:`graft.remote.hosted.GraftPairModel` (or a model with donors attached).
        donors: ``{name: model}`` or one model (``"sft"``). Hosted mode needs no weights:
            names (``["sft"]``) or ``{name: None}`` will do.
        rows: the (prompt, spans, spec) rows.
        batch_size: rows per forward pass.
        remote: where to run (None: locally).
        progress: a tqdm bar over rows (a string is its description).
        padding_side, pad_id, log_probs, sort_by_length: as in ``run_grafts``.
        log: where the one line per request goes (its payload size before sending, its
            time after); None for silence. Default: stderr.

    Returns:
        tensor [len(rows), vocab] on CPU (float32; float64 for a float64 model).

    Raises:
        RemoteError: one line saying what failed (unreachable host, bad key, model not
            served, payload too large, the server's own error, timeout).
        SpecError: a spec does not fit the model or a prompt.
    """
    from graft.core.engine import run_grafts

    if remote is None or remote.mode == "local":
        donors = _normalise_donors(donors)
        if any(d is None for d in donors.values()):
            raise RemoteError("a local run needs every donor's weights", kind="config")
        return run_grafts(
            base,
            donors,
            rows,
            batch_size=batch_size,
            padding_side=padding_side,
            pad_id=pad_id,
            log_probs=log_probs,
            progress=progress,
            sort_by_length=sort_by_length,
        )
    out = _run_remote(
        base,
        donors,
        rows,
        cfg=remote,
        batch_size=batch_size,
        padding_side=padding_side,
        pad_id=pad_id,
        sort_by_length=sort_by_length,
        progress=progress,
        log=log,
    )
    return torch.log_softmax(out, dim=-1) if log_probs else out


@dataclass
class _Request:
    batches: list = field(default_factory=list)  # (row indices, BatchPlan)
    keys: set = field(default_factory=set)  # (donor, path)
    payload: int = 0

    @property
    def n_rows(self) -> int:
        return sum(len(idx) for idx, _ in self.batches)


def _run_remote(
    base, donors, rows, *, cfg, batch_size, padding_side, pad_id, sort_by_length, progress, log
):
    hosted = cfg.donor_mode == "hosted"
    donors = _normalise_donors(donors)
    torch_base = _unwrap(base)
    arch = architecture_of(torch_base)
    same = _check_donors(torch_base, donors, hosted)
    if pad_id is None:
        pad_id = default_pad_id(torch_base.config)
    resolved = resolve_rows(arch, rows, donors)
    order = list(range(len(rows)))
    if sort_by_length:
        order.sort(key=lambda i: len(rows[i].input_ids))

    def size(keys) -> int:
        return _payload(donors, keys, hosted)

    # plan every batch, then pack consecutive batches into requests
    requests: list[_Request] = []
    current = _Request()
    limit = cfg.max_payload_bytes
    for b in range(math.ceil(len(rows) / batch_size) if rows else 0):
        idx = order[b * batch_size : (b + 1) * batch_size]
        plan = plan_batch(
            arch,
            [rows[i] for i in idx],
            pad_id=pad_id,
            padding_side=padding_side,
            resolved=[resolved[i] for i in idx],
        )
        keys = {(p.donor, p.path) for p in plan.patches if p.donor not in same}
        _refuse_oversized(size(keys), len(idx), limit)
        merged = current.keys | keys
        if current.batches and (
            current.n_rows + len(idx) > cfg.rows_per_request or size(merged) > limit
        ):
            requests.append(current)
            current = _Request()
            merged = set(keys)
        current.batches.append((idx, plan))
        current.keys = merged
        current.payload = size(merged)
    if current.batches:
        requests.append(current)
    return _run_requests(
        base, donors, same, requests, len(rows), cfg=cfg, progress=progress, log=log
    )


def _check_donors(torch_base: nn.Module, donors: dict, hosted: bool) -> set[str]:
    """Ship mode: every donor is loaded and fits the base. Returns donors that ARE the base."""
    same = set()
    if hosted:
        return same
    for name, donor in donors.items():
        if donor is None:
            raise RemoteError(
                f"ship mode sends donor {name!r}'s weights, so it must be loaded here; "
                "use --donor-mode hosted if the server holds the donors",
                kind="config",
            )
        if _unwrap(donor) is torch_base:
            same.add(name)
        check_compatible(torch_base, _unwrap(donor), name)
    return same


def _payload(donors: dict, keys, hosted: bool) -> int:
    """Bytes of the donor modules ``keys`` ((donor, path) pairs) ship mode sends."""
    if hosted:
        return 0
    per: dict[str, list] = {}
    for donor, path in keys:
        per.setdefault(donor, []).append(_unwrap(donors[donor]).get_submodule(path))
    return sum(_module_bytes(m) for m in per.values())


def _refuse_oversized(size: int, n_rows: int, limit: int) -> None:
    if size > limit:
        raise RemoteError(
            f"one batch of {n_rows} rows would send {format_bytes(size)} of donor weights "
            f"(limit {format_bytes(limit)}): use --donor-mode hosted, graft fewer cells, or "
            "raise --max-payload-mb",
            kind="payload",
        )


def run_plan_remote(
    base, donors, plan, remote: RemoteConfig, *, log: Callable[[str], None] | None = _log_stderr
) -> torch.Tensor:
    """One planned batch (:func:`graft.core.engine.plan_batch`) as one remote (or simulated) request.

    The remote twin of :func:`graft.core.engine.run_plan`: logits [batch, vocab] at each row's last
    token, float32 on the CPU. ``base`` and ``donors`` as in :func:`run_rows`.
    """
    if not remote.enabled:
        raise RemoteError("run_plan_remote needs mode 'remote' or 'simulate'", kind="config")
    hosted = remote.donor_mode == "hosted"
    donors = _normalise_donors(donors)
    same = _check_donors(_unwrap(base), donors, hosted)
    n = plan.input_ids.shape[0]
    keys = {(p.donor, p.path) for p in plan.patches if p.donor not in same}
    size = _payload(donors, keys, hosted)
    _refuse_oversized(size, n, remote.max_payload_bytes)
    request = _Request([(list(range(n)), plan)], keys, size)
    return _run_requests(base, donors, same, [request], n, cfg=remote, progress=False, log=log)


def _run_requests(base, donors, same, requests, n_rows, *, cfg, progress, log) -> torch.Tensor:
    """Send planned requests; scatter their logits into [n_rows, vocab] (row order restored)."""
    hosted = cfg.donor_mode == "hosted"
    torch_base = _unwrap(base)
    model = wrap(base)
    device = next(torch_base.parameters()).device
    if device.type == "meta" or cfg.mode == "remote":
        device = torch.device("cpu")
    supports_keep = "logits_to_keep" in _forward_params(torch_base)
    host = cfg.resolved_host() if cfg.mode == "remote" else "simulate"
    model_key = cfg.resolved_model_key(torch_base) if cfg.mode == "remote" else "simulate"
    env = {}
    attn = getattr(getattr(torch_base, "config", None), "_attn_implementation", None)
    if attn:
        env["attn_implementation"] = attn
    register_by_value()

    out: torch.Tensor | None = None
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=n_rows, desc=progress if isinstance(progress, str) else "grafting", unit="row"
        )
    for r, req in enumerate(requests):
        where = f"request {r + 1}/{len(requests)}"
        batches, mods = [], {}
        for _idx, plan in req.batches:
            patches = [_plain(p) for p in plan.patches if p.donor not in same]
            for p in patches:
                key = f"{p.donor}:{p.path}"
                if key not in mods:
                    mods[key] = (
                        _donor_ref(torch_base, p.donor, p.path)
                        if hosted
                        else _unwrap(donors[p.donor]).get_submodule(p.path)
                    )
            inputs = dict(
                input_ids=plan.input_ids.to(device),
                attention_mask=plan.attention_mask.to(device),
                position_ids=plan.position_ids.to(device),
            )
            if supports_keep and plan.keep_last_only:
                inputs["logits_to_keep"] = 1
            n = plan.input_ids.shape[0]
            batch_rows = torch.arange(n)
            pick = (
                torch.full_like(batch_rows, -1)
                if "logits_to_keep" in inputs
                else plan.last_index.clone()
            )
            batches.append((inputs, patches, batch_rows, pick))
        _strip_persistent_ids(mods.values())
        if log is not None:
            what = (
                f"donor weights {format_bytes(req.payload)} shipped"
                if not hosted
                else "hosted donors (ids only)"
            )
            log(f"{where}: {req.n_rows} rows in {len(req.batches)} batches; {what} -> {host}")
        started = time.monotonic()
        results, sent = _send(
            model,
            batches,
            mods,
            cfg=cfg,
            where=where,
            host=host,
            model_key=model_key,
            env=env,
            log=log,
        )
        if log is not None:
            took = f"done in {time.monotonic() - started:.1f} s"
            log(f"{where}: {took}, sent {format_bytes(sent)}" if sent else f"{where}: {took}")
        for (idx, _plan), logits in zip(req.batches, results, strict=True):
            if logits.dtype != torch.float64:
                logits = logits.float()
            logits = logits.cpu()
            if out is None:
                out = torch.empty((n_rows, logits.shape[-1]), dtype=logits.dtype)
            out[torch.tensor(idx)] = logits
            if bar is not None:
                bar.update(len(idx))
    if bar is not None:
        bar.close()
    return out if out is not None else torch.empty((0, 0))


def _donor_ref(torch_base: nn.Module, donor: str, path: str):
    """Hosted mode: the server's donor module by id (with the local one, if this is a pair)."""
    from graft.remote.hosted import DONORS_ATTR, DonorRef, donor_module_id

    try:
        local = torch_base.get_submodule(f"{DONORS_ATTR}.{donor}.{path}")
    except AttributeError:
        local = None
    return DonorRef(donor_module_id(donor, path), local)


def _forward_params(model: nn.Module):
    import inspect

    return inspect.signature(model.forward).parameters


def _send(model, batches, mods, *, cfg, where, host, model_key, env, log):
    """Run one request (with retries): (per-batch logits, payload bytes sent)."""
    attempts = cfg.retries + 1
    for attempt in range(1, attempts + 1):
        if cfg.mode == "simulate":
            backend = simulation_backend(model, verbose=cfg.verbose)
        else:
            backend = _remote_backend_class()(
                model_key,
                host=host,
                api_key=cfg.resolved_api_key(),
                env=env,
                max_payload_bytes=cfg.max_payload_bytes,
                timeout_s=cfg.timeout_s,
                log=log if cfg.verbose else None,
            )
            backend.compress = cfg.compress
        try:
            results = _request_body(model, batches, mods, backend)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a RemoteError
            if cfg.mode == "simulate" and not isinstance(exc, RemoteError):
                raise
            err = _classify(exc, host=host, model_key=model_key, where=where)
            if err.kind not in _RETRYABLE or attempt == attempts:
                if attempts > 1 and err.kind in _RETRYABLE:
                    err = RemoteError(
                        f"{err} (gave up after {attempts} attempts)",
                        kind=err.kind,
                        detail=err.detail,
                    )
                raise err from exc
            wait = cfg.retry_wait_s * 2 ** (attempt - 1)
            if log is not None:
                log(f"{where}: {err}; retrying in {wait:g} s ({attempt}/{cfg.retries})")
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
            f"NDIF host {host!r} is not a URL such as https://api.ndif.us; check --ndif-host / "
            "NDIF_HOST",
            kind="config",
        )
    try:
        with socket.create_connection((url.hostname, port), timeout=min(timeout_s, cfg.timeout_s)):
            pass
    except OSError as err:
        reason = err.strerror or str(err) or type(err).__name__
        raise RemoteError(
            f"cannot reach the NDIF host {host} ({reason}); check --ndif-host / NDIF_HOST and "
            "that the server is running",
            kind="unreachable",
        ) from None
