"""A "graft pair" model for a self-hosted NDIF server: the base with its donors beside it.

The public NDIF service only runs models it hosts, so a private finetuned donor cannot live
there; shipping the donor's weights with every request (``--donor-mode ship``) works but the
payload grows with what is grafted. A server you run yourself can instead load the base and
its donors once and keep them: only module ids then travel with a request
(``--donor-mode hosted``).

:class:`GraftPairModel` is that model, as an nnsight wrapper a server can build from a model
key alone. It loads the base causal LM and each donor and attaches the donors to the base
as a ``graft_donors`` ``ModuleDict``, so

- the base's forward, module paths and outputs are untouched (``model.layers.3.mlp`` is
  where it always was), and
- donor ``NAME``'s module at ``PATH`` sits at ``graft_donors.NAME.PATH`` (nnsight's
  persistent id ``Module:model.graft_donors.NAME.PATH``, :func:`donor_module_id`); a
  client's trace calls it through that envoy path, which is all its request carries for
  the donor. Called through the envoy, it runs where the weights are, also when a server
  runs the trace in a sandbox process that holds no weights.

Both sides trace through the wrapper method ``_call`` (:class:`PairBase` on the client,
:class:`GraftPairModel` on the server), as nnsight's ``TransformersModel`` does.

Model key (what a self-hosted deployment is configured with, and what the client sends).
nnsight 0.8.1 keys every remotely served model as ``"<import path of the wrapper class>:
<suffix>"`` (``Remotable.to_model_key``); the server splits at the first ``:``, imports the
class (``nnsight.util.from_import_path``) and calls its ``_remoteable_from_model_key(suffix,
**load_kwargs)`` -- NDIF passes e.g. ``dispatch=True, device_map=..., torch_dtype=...``. For
this class the suffix is JSON with sorted keys::

    graft.remote.hosted.GraftPairModel:{"base": "meta-llama/Llama-3.2-1B", "donors": {"sft": "/models/llama-sft"}}

``base`` and each donor are *sources*, resolved on the server:

- a hub repo id, optionally pinned: ``owner/name`` or ``owner/name@revision``;
- a directory on the server holding a saved model (``save_pretrained``);
- ``graft.tiny:<family>`` (the tiny random base of :func:`graft.models.tiny.tiny_pair`),
  ``graft.tiny:<family>:donor`` (that pair's donor) or ``graft.tiny:<family>:donor=<seed>``
  (the base perturbed with another seed) -- for tests and dry runs.

:func:`hosted_model_key` mints the key; :meth:`GraftPairModel.to_model_key` gives the same
string. (nnsight's own ``TransformersModel`` keys are ``nnsight.modeling.transformers.
TransformersModel:{"repo_id": ..., "revision": ..., "task": "text-generation"}`` and need a
hub id: it canonicalises the id through the hub, so a local path is rejected there. A graft
pair's key carries its sources verbatim, so server-side paths are fine.)

The server needs this package installed (it imports ``graft.remote.hosted``); the client's trace
code itself travels by value and needs nothing from ``graft`` on the server.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from nnsight.modeling.mixins.remotable import Remotable
from nnsight.util import to_import_path
from torch import nn

from graft.errors import RemoteError


def _config_error(message: str) -> RemoteError:
    """A graft pair set up with bad arguments (a one-line :class:`RemoteError`)."""
    return RemoteError(message, kind="config")


DONORS_ATTR = "graft_donors"
ROOT_PATH = "model"  # the path nnsight gives the root envoy of every wrapped model
TINY_PREFIX = "graft.tiny:"


def donor_module_id(donor: str, path: str, root: str = ROOT_PATH) -> str:
    """nnsight's persistent id of donor ``donor``'s module ``path`` inside a graft pair."""
    return f"Module:{root}.{DONORS_ATTR}.{donor}.{path}"


def attach_donors(base: nn.Module, donors: Mapping[str, nn.Module]) -> nn.Module:
    """Attach ``donors`` to ``base`` as ``base.graft_donors[name]`` (in place); returns ``base``.

    The base's own modules, forward and outputs are unchanged.
    """
    if not donors:
        raise _config_error("a graft pair needs at least one donor")
    for name in donors:
        if not name.isidentifier():
            raise _config_error(f"donor name {name!r} must be an identifier, e.g. sft or task")
    base.add_module(DONORS_ATTR, nn.ModuleDict(dict(donors)))
    return base


def _tiny(source: str, *, meta: bool) -> nn.Module:
    from graft.models.tiny import TINY_FAMILIES, perturbed_copy, tiny_config, tiny_model

    parts = source[len(TINY_PREFIX) :].split(":")
    family = parts[0]
    if family not in TINY_FAMILIES or len(parts) > 2:
        raise _config_error(
            f"tiny source {source!r}: use graft.tiny:<family>[:donor[=<seed>]] with a family "
            f"of {', '.join(TINY_FAMILIES)}"
        )
    if meta:
        import transformers

        return transformers.AutoModelForCausalLM.from_config(tiny_config(family))
    base = tiny_model(family)
    if len(parts) == 1:
        return base
    kind, _, seed = parts[1].partition("=")
    if kind != "donor":
        raise _config_error(
            f"tiny source {source!r}: the second field must be donor or donor=<seed>"
        )
    return perturbed_copy(base, seed=int(seed) if seed else 100)


def _split_revision(source: str) -> tuple[str, str | None]:
    repo, sep, revision = source.partition("@")
    return repo, (revision if sep else None)


def load_source(source: str, *, meta: bool = False, **load_kwargs: Any) -> nn.Module:
    """Load one causal LM named by a source string (see the module docstring).

    ``meta=True`` builds the architecture from its config only (no weights). ``load_kwargs``
    go to ``from_pretrained`` (``dtype``/``torch_dtype``, ``device_map``, ...).
    """
    import transformers

    dtype = load_kwargs.pop("torch_dtype", None) or load_kwargs.pop("dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."))
    if source.startswith(TINY_PREFIX):
        model = _tiny(source, meta=meta)
        return model if meta or dtype is None else model.to(dtype)
    repo, revision = _split_revision(source)
    if meta:
        config = transformers.AutoConfig.from_pretrained(repo, revision=revision)
        return transformers.AutoModelForCausalLM.from_config(config)
    if dtype is not None:
        load_kwargs["dtype"] = dtype
    model = transformers.AutoModelForCausalLM.from_pretrained(
        repo, revision=revision, **load_kwargs
    )
    return model.eval()


def _suffix(base: str, donors: Mapping[str, str]) -> str:
    if not isinstance(base, str) or not all(isinstance(s, str) for s in donors.values()):
        raise _config_error("a graft pair's model key needs its base and donors as source strings")
    return json.dumps({"base": base, "donors": dict(sorted(donors.items()))}, sort_keys=True)


class _CallsByName:
    """Runs a trace's forward through the named method ``_call``, as nnsight's
    ``TransformersModel`` does.

    A trace records the method it runs by name, and a server running the trace in a sandbox
    calls that name on the wrapper it serves; the default (``"__call__"``) resolves there to
    the wrapper's own ``__call__`` instead of the model's forward, and the trace fails.
    """

    _module: Any  # the wrapped model (nnsight's Envoy sets it)

    def trace(self, *inputs: Any, fn: Any = None, **kwargs: Any) -> Any:
        # Remotable named, not super(): this code travels by value (as source), and there
        # super() has no class cell
        return Remotable.trace(self, *inputs, fn=self._call if fn is None else fn, **kwargs)

    def _call(self, *inputs: Any, **kwargs: Any) -> Any:
        return self._module(*inputs, **kwargs)


class GraftPairModel(_CallsByName, Remotable):
    """nnsight wrapper of a base causal LM with its donors attached (``graft_donors``).

    Args:
        base: the base's source string (hub id, server directory, ``graft.tiny:...``) or an
            already loaded model.
        donors: ``{name: source or loaded model}``; names are identifiers (``sft``, ``task``).
        dispatch: load the weights now (a server does); otherwise the pair is built on the
            meta device from configs and loads on first local use.
        **kwargs: load arguments for every model (``dtype``/``torch_dtype``, ``device_map``,
            ...) and nnsight envoy arguments.

    Example (what a self-hosted server does with a key)::

        key = hosted_model_key("meta-llama/Llama-3.2-1B", {"sft": "/models/llama-sft"})
        pair = Remotable.from_model_key(key, dispatch=True, torch_dtype="bfloat16")
    """

    def __init__(self, base: Any, donors: Mapping[str, Any] | None = None, **kwargs: Any):
        if not donors:
            raise _config_error("GraftPairModel needs donors={name: source or model}")
        self.graft_sources = (
            (base, dict(donors))
            if isinstance(base, str) and all(isinstance(v, str) for v in donors.values())
            else None
        )
        super().__init__(base, donors=dict(donors), **kwargs)

    # -- loading ------------------------------------------------------------------------
    def _wrap(self, module: nn.Module, *args: Any, donors=None, **kwargs: Any) -> nn.Module:
        loaded = {
            n: d if isinstance(d, nn.Module) else load_source(d, **kwargs)
            for n, d in donors.items()
        }
        return attach_donors(module, loaded)

    def _load(self, base: str, *args: Any, donors=None, **kwargs: Any) -> nn.Module:
        model = load_source(base, **dict(kwargs))
        loaded = {
            n: d if isinstance(d, nn.Module) else load_source(d, **dict(kwargs))
            for n, d in donors.items()
        }
        return attach_donors(model.eval(), {n: m.eval() for n, m in loaded.items()})

    def _load_meta(self, base: str, *args: Any, donors=None, **kwargs: Any) -> nn.Module:
        model = load_source(base, meta=True)
        loaded = {n: load_source(d, meta=True) for n, d in donors.items()}
        return attach_donors(model, loaded)

    # -- remote identity ----------------------------------------------------------------
    def _remoteable_model_key(self) -> str:
        if self.graft_sources is None:
            raise _config_error(
                "this graft pair was built from loaded models, so it has no model key; build "
                "it from source strings (hub ids or server paths)"
            )
        return _suffix(*self.graft_sources)

    @classmethod
    def _remoteable_from_model_key(cls, model_key: str, **kwargs: Any) -> GraftPairModel:
        data = json.loads(model_key)
        return cls(data["base"], donors=data["donors"], **kwargs)

    def _remoteable_set_env(self, env: dict[str, Any] | None) -> None:
        # match the client's attention implementation (as nnsight's TransformersModel does)
        requested = (env or {}).get("attn_implementation")
        config = getattr(self._module, "config", None)
        if requested and config is not None and config._attn_implementation != requested:
            self._module.set_attn_implementation(requested)

    @classmethod
    def key_for(cls, base: str, donors: Mapping[str, str]) -> str:
        """The model key of the pair ``base`` + ``donors`` (see the module docstring)."""
        return f"{to_import_path(cls)}:{_suffix(base, donors)}"


class PairBase(_CallsByName, Remotable):
    """Client-side wrapper of a graft pair's base (hosted mode): traces as the server's pair.

    The base's module tree is the pair's without ``graft_donors``; the trace reaches a donor
    module by its envoy path on the server's pair.
    """


_PAIR_BASES: weakref.WeakKeyDictionary[nn.Module, PairBase] = weakref.WeakKeyDictionary()


def wrap_pair_base(base: Any) -> Any:
    """``base`` as the client traces it in hosted mode (a wrapper is returned as is)."""
    if hasattr(base, "trace") and hasattr(base, "get"):
        return base
    wrapped = _PAIR_BASES.get(base)
    if wrapped is None:
        wrapped = _PAIR_BASES[base] = PairBase(base)
    return wrapped


def hosted_model_key(base: str, donors: Mapping[str, str]) -> str:
    """Model key of a graft pair: ``graft.remote.hosted.GraftPairModel:{"base": ..., "donors": ...}``."""
    return GraftPairModel.key_for(base, donors)


def parse_hosted_model_key(model_key: str) -> tuple[str, dict[str, str]]:
    """``(base, donors)`` of a graft-pair model key; a :class:`RemoteError` (kind ``config``)
    for a key of another model."""
    prefix = to_import_path(GraftPairModel) + ":"
    if not model_key.startswith(prefix):
        raise _config_error(
            f"{model_key!r} is not a graft-pair key (it must start with {prefix!r})"
        )
    data = json.loads(model_key[len(prefix) :])
    return data["base"], dict(data["donors"])
