"""Whether the Hugging Face hub can be reached, decided once per process by one quick probe,
and the offline mode it implies.

Without a network the hub's download library retries every request for minutes ("Retrying
in 8s [Retry 5/5]") before it falls back to its cache. So before a model loads from the hub,
:func:`prepare_hub` asks the hub's endpoint (``$HF_ENDPOINT``, default huggingface.co) once,
with a short timeout: when it does not answer and the model is in the hub cache
(``$HF_HOME``), the process goes offline (``HF_HUB_OFFLINE``, set where the installed
``huggingface_hub``, ``transformers`` and ``datasets`` read it) and says so in one warning;
when the model is not cached either, loading stops at once with one line. A user who sets
``HF_HUB_OFFLINE=1`` is never probed.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import urllib.error
import urllib.request

logger = logging.getLogger(__name__)

#: Seconds the probe waits for the hub's answer (a HEAD request, name lookup included).
HUB_PROBE_SECONDS = 1.5
#: The hub's address when ``$HF_ENDPOINT`` is not set.
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = ("1", "true", "yes", "on")

#: endpoint -> whether it answered: the one probe of this process per endpoint.
_answers: dict[str, bool] = {}
#: why this process went offline (for a run's config.json), once it did.
_offline_reason: list[str] = []


def hub_endpoint() -> str:
    """The hub's address: ``$HF_ENDPOINT`` or huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline_requested() -> bool:
    """Whether offline mode is on: ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) in the
    environment, or set in the loaded ``huggingface_hub`` (which reads it once, on import)."""
    if any(
        os.environ.get(v, "").lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    ):
        return True
    constants = sys.modules.get("huggingface_hub.constants")
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _ask(url: str, timeout: float, answer: list[bool]) -> None:
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout):  # noqa: S310 (an http(s) URL)
            answer.append(True)
    except urllib.error.HTTPError:  # the hub answered, with an error status: it is there
        answer.append(True)
    except (OSError, ValueError):  # no name, no route, refused, timed out, a bad URL
        answer.append(False)


def hub_reachable(timeout: float = HUB_PROBE_SECONDS) -> bool:
    """Whether the hub answers a HEAD request within ``timeout`` seconds (proxies from the
    environment, as the hub's own client uses them). Asked once per process and endpoint;
    False at once in offline mode (:func:`offline_requested`)."""
    if offline_requested():
        return False
    endpoint = hub_endpoint()
    if endpoint not in _answers:
        answer: list[bool] = []
        # a thread bounds the name lookup too, which urlopen's timeout does not cover
        probe = threading.Thread(target=_ask, args=(endpoint, timeout, answer), daemon=True)
        probe.start()
        probe.join(timeout + 0.5)
        _answers[endpoint] = bool(answer and answer[0])
    return _answers[endpoint]


def in_hub_cache(hub_id: str) -> bool:
    """Whether the hub cache on this machine (``$HF_HOME``/``$HF_HUB_CACHE``) holds
    ``hub_id``'s config."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(hub_id, "config.json"), str)


def go_offline(reason: str) -> None:
    """Switch this process to offline mode, where each installed library reads it: the
    environment (libraries imported later, child processes), ``huggingface_hub``'s constant
    (read at call time by its client and by transformers 5), transformers 4's own flag and
    ``datasets``' constant when they are loaded; say ``reason`` in one warning."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    for module, name in (
        ("transformers.utils.hub", "_is_offline_mode"),  # transformers 4
        ("transformers.utils.import_utils", "_is_offline_mode"),
        ("datasets.config", "HF_HUB_OFFLINE"),
    ):
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(getattr(loaded, name, None), bool):
            setattr(loaded, name, True)
    if not _offline_reason:
        _offline_reason.append(reason)
        logger.warning("%s", reason)


def offline_note() -> str | None:
    """Why this process went offline (for a run's ``config.json``), or None."""
    return _offline_reason[0] if _offline_reason else None


def prepare_hub(hub_id: str) -> None:
    """Before ``hub_id`` loads from the hub: probe the hub once; when it does not answer,
    use the hub cache offline (one warning) if the model is there.

    Raises:
        ModelNotFoundError: the hub did not answer and ``hub_id`` is not in the hub cache.
    """
    if offline_requested():
        return
    if hub_reachable():
        return
    from graft.errors import ModelNotFoundError
    from graft.models.registry import hub_hint

    endpoint = hub_endpoint()
    if not in_hub_cache(hub_id):
        raise ModelNotFoundError(
            f"cannot download {hub_id}: the hub ({endpoint}) did not answer within "
            f"{HUB_PROBE_SECONDS:g} s and the model is not in the hub cache; {hub_hint(hub_id)}"
        )
    go_offline(
        f"the hub ({endpoint}) did not answer within {HUB_PROBE_SECONDS:g} s: models load "
        "from the hub cache, offline (set HF_HUB_OFFLINE=1 to skip this check)"
    )


def _forget() -> None:
    """Forget the probe's answers and the offline note (tests)."""
    _answers.clear()
    _offline_reason.clear()
