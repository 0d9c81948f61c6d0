"""Where and how grafts run: :class:`RemoteConfig` and model keys.

``mode="local"`` runs on this machine, ``"remote"`` on an NDIF(-compatible) server through
nnsight's own client, ``"simulate"`` through nnsight's in-process serialise / deserialise path
(a cheap check that a trace is remote-safe). Donor weights reach a server in one of two ways
(``donor_mode``): ``ship`` sends the grafted donor modules with each request (sized by
:mod:`graft.remote.payload`); ``hosted`` names the donor modules of a graft pair the server
holds (:class:`graft.remote.hosted.GraftPairModel`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from graft.errors import RemoteError
from graft.models.registry import looks_like_hub_id
from graft.ranges import Range, first_problem

if TYPE_CHECKING:
    from torch import nn

MODES = ("local", "remote", "simulate")
DONOR_MODES = ("ship", "hosted")
# An NDIF server queues each request, payload included, as one Redis value, and Redis caps a
# value at 512 MiB (proto-max-bulk-len); the API, the queue and the model actor each hold a
# copy besides. 448 MiB leaves room for the envelope and keeps a request that fits Redis from
# being the one that fails on the server.
DEFAULT_MAX_PAYLOAD_MB = 448.0
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_RETRIES = 2
#: The ranges of :class:`RemoteConfig`'s numbers: a payload up to 64 GiB, a wait up to a
#: week, up to 10 retries (the back-off doubles: 10 retries from 2 s wait 34 min in all).
REMOTE_RANGES: dict[str, Range] = {
    "max_payload_mb": Range(0, 65_536, low_open=True),
    "timeout_s": Range(0, 7 * 24 * 3600, low_open=True),
    "retries": Range(0, 10, integer=True),
    "retry_wait_s": Range(0, 3600),
    "rows_per_request": Range(1, integer=True),
}
TRANSFORMERS_MODEL_CLASS = "nnsight.modeling.transformers.TransformersModel"
_MB = 1024 * 1024


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
            a batch whose donor weights are more is split between layers, one request per
            layer block (:mod:`graft.remote.blocks`), and what cannot be split (one module
            over it) is refused before sending. CLI ``--max-payload-mb``.
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
        verbose: log every server status update (logger ``graft.remote.client``).

    Numbers outside their range (:data:`REMOTE_RANGES`) raise a one-line
    :class:`~graft.errors.RemoteError` of kind ``config`` naming the field.
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
            raise RemoteError(
                f"mode {self.mode!r} unknown: use {', '.join(MODES)}", kind="config", param="mode"
            )
        if self.donor_mode not in DONOR_MODES:
            raise RemoteError(
                f"donor_mode {self.donor_mode!r} unknown: use ship or hosted",
                kind="config",
                param="donor_mode",
            )
        found = first_problem(REMOTE_RANGES, self)
        if found:
            raise RemoteError(found[1], kind="config", param=found[0])

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
        from graft.core.families.wrapping import unwrap

        repo = getattr(getattr(unwrap(base), "config", None), "_name_or_path", None) or ""
        if not looks_like_hub_id(repo) or os.path.exists(repo):
            raise RemoteError(
                f"cannot tell which model key the server knows the base by (it was loaded from "
                f"{repo or 'an unknown source'!r}, not a hub id): set model_key",
                kind="config",
            )
        if self.donor_mode == "hosted":
            if not self.hosted_donors:
                raise RemoteError(
                    "hosted mode needs the graft pair's model key: set model_key, or "
                    "hosted_donors={name: source} for each donor the server holds",
                    kind="config",
                )
            from graft.remote.hosted import hosted_model_key

            return hosted_model_key(repo, self.hosted_donors)
        return hf_model_key(repo)


def hf_model_key(repo_id: str, revision: str | None = None) -> str:
    """The key nnsight's ``TransformersModel`` sends for a causal LM from the hub.

    Same string as ``TransformersModel(repo_id).to_model_key()`` without its hub call (which
    only canonicalises the id's spelling): ``nnsight.modeling.transformers.TransformersModel:
    {"repo_id": ..., "revision": ..., "task": "text-generation"}``.
    """
    suffix = json.dumps({"repo_id": repo_id, "revision": revision, "task": "text-generation"})
    return f"{TRANSFORMERS_MODEL_CLASS}:{suffix}"
