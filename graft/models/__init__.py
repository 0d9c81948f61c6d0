"""Models by name: the registry (:mod:`graft.models.registry`), embedded offline GGUF models
(:mod:`graft.models.embedded`), loading (:mod:`graft.models.loading`; the hub probed once
first, :mod:`graft.models.hub`), the paper's models
as configs without weights (:mod:`graft.models.paper`), any model's config and tokenizer
without its weights (:mod:`graft.models.configs`), and device names checked without torch
(:mod:`graft.models.devices`).

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

from graft.lazy import lazy_exports

# Public names by module, imported on first use: naming a model or a device (the command
# line's options) loads neither torch nor transformers.
_EXPORTS = {
    "graft.core.families.arch": ("context_length",),
    "graft.errors": ("DeviceError", "ModelNotFoundError"),
    "graft.models.configs": ("model_config",),
    "graft.models.devices": ("DeviceName", "parse_device"),
    "graft.models.embedded": (
        "embedded_cache_dir",
        "embedded_gguf",
        "ensure_embedded",
        "graft_home",
    ),
    "graft.models.hub": ("hub_reachable", "prepare_hub"),
    "graft.models.loading": (
        "LoadedModel",
        "default_device",
        "device_type",
        "load_model",
        "resolve_device",
        "resolve_dtype",
        "tiny_tokenizer",
    ),
    "graft.models.paper": ("PAPER_CONFIGS", "meta_model"),
    "graft.models.registry": (
        "DEFAULT_MODEL",
        "EMBEDDED_MODELS",
        "HUB_MODELS",
        "MODELS_ENV",
        "REGISTRY",
        "TINY_FAMILIES",
        "TINY_MODELS",
        "EmbeddedModel",
        "looks_like_hub_id",
        "missing_folder",
        "model_slug",
        "resolve_model_name",
    ),
    "graft.models.tiny": ("perturbed_copy", "tiny_model", "tiny_pair"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
