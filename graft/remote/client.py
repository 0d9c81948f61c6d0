"""nnsight's client as a run uses it: where its requests go (:class:`Target`), sending one
with retries, a server's reachability checked before a run starts, and what a server runs.

Errors surface as :class:`RemoteError` with a one-line message and a ``kind``
(``unreachable``, ``protocol``, ``auth``, ``model``, ``payload``, ``server``, ``timeout``,
``transient``, ``config``; :mod:`graft.remote.failures` turns what nnsight raised into
one); transient ones (connection drops, 5xx/429, timeouts, an unreachable host) are retried
``retries`` times with exponential back-off. The backends a request runs through are
:mod:`graft.remote.backends`'. :func:`server_versions` reads what a server runs, for a run's
record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from graft.core.families.wrapping import unwrap, wrap
from graft.errors import RemoteError
from graft.remote.backends import GraftRemoteBackend, simulation_backend
from graft.remote.config import RemoteConfig
from graft.remote.failures import classify, unreachable

if TYPE_CHECKING:
    from nnsight.tracing.backend import Backend

logger = logging.getLogger(__name__)

_RETRYABLE = ("unreachable", "timeout", "transient")
SERVER_PACKAGES = ("ndif", "nnsight", "torch", "transformers", "graft")


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
        raise unreachable(host, reason) from None


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
