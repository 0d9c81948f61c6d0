"""A model's config (and, where it is on this machine, its tokenizer) without its weights.

What a plan needs before anything heavy is loaded (:mod:`graft.study.planning.run_plan`): the
config of a ``tiny-*`` model is built, an embedded model's is read from its converted copy
(or from its GGUF file's header; a package shipped in chunks is assembled from its installed
chunks first, the one thing written here, as the first load would), a folder's (``--model
DIR``, ``$GRAFT_MODELS``) and a hub model's in the hub cache are read from disk, and the four
paper models fall back to their published configs (:data:`graft.models.paper.PAPER_CONFIGS`).
Nothing is downloaded or converted.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from graft.errors import ModelNotFoundError
from graft.models.embedded import embedded_cache_dir, embedded_gguf, graft_home
from graft.models.hub import in_hub_cache
from graft.models.loading import _finish_tokenizer, tiny_tokenizer
from graft.models.paper import PAPER_CONFIGS
from graft.models.registry import HUB_MODELS, resolve_model_name
from graft.models.tiny import tiny_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FoundConfig:
    """A model's config and where it came from.

    Args:
        config: the transformers config.
        origin: where it was read, in words (a folder, "the hub cache", "graft's published
            config of gpt2-xl", "tiny model").
        local: the model is on this machine (False for a published config: its weights
            are still to be downloaded).
    """

    config: Any
    origin: str
    local: bool = True


def model_config(name: str) -> FoundConfig | None:
    """The config of model ``name`` (registry name, hub id or folder) as found on this
    machine, or None when only a download would give it.

    Raises:
        ModelNotFoundError: ``name`` is no model (as :func:`resolve_model_name`).
    """
    from transformers import AutoConfig

    source, location = resolve_model_name(name)
    if source == "tiny":
        return FoundConfig(tiny_config(location), "tiny model")
    folder = _local_folder(source, location)
    if folder is not None:
        return FoundConfig(AutoConfig.from_pretrained(folder), str(folder))
    if source == "embedded":
        return _gguf_config(location)
    if in_hub_cache(location):
        return FoundConfig(AutoConfig.from_pretrained(location, local_files_only=True), "hub cache")
    paper = {hub: short for short, hub in HUB_MODELS.items() if short in PAPER_CONFIGS}
    short = name if name in PAPER_CONFIGS else paper.get(location)
    if short is not None:
        origin = f"graft's published config of {short}"
        return FoundConfig(PAPER_CONFIGS[short](), origin, local=False)
    return None


def _local_folder(source: str, location: str) -> Path | None:
    if source == "local":
        return Path(location)
    if source == "embedded":
        folder = embedded_cache_dir(location)
        return folder if (folder / "config.json").is_file() else None
    return None


#: (embedded model name, $GRAFT_HOME) -> its config as read from its GGUF file: read once per
#: process (a GGUF file is slow to parse, and a plan asks for a model's config more than once).
_GGUF_CONFIGS: dict[tuple[str, Path], FoundConfig] = {}


def _gguf_config(name: str) -> FoundConfig | None:
    """An embedded model's config from its GGUF header, where its package is installed (a
    chunked package is assembled once from its installed chunks, as loading it would: nothing
    is downloaded); None when the package is not installed. Read once per process; each
    caller gets its own copy of the config, to change as it likes."""
    key = (name, graft_home())  # a chunked package is assembled under $GRAFT_HOME
    found = _GGUF_CONFIGS.get(key)
    if found is None:
        try:
            gguf = embedded_gguf(name)
        except ModelNotFoundError:
            return None  # not cached: the package may be installed later
        found = _GGUF_CONFIGS[key] = FoundConfig(read_gguf_config(gguf), str(gguf))
    return replace(found, config=copy.deepcopy(found.config))


def read_gguf_config(gguf: Path) -> Any:
    """The transformers config in the header of the GGUF file ``gguf``."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)


def local_tokenizer(name: str) -> Any | None:
    """The tokenizer of ``name`` when it is on this machine (a tiny model's, a folder's, a
    converted embedded model's, the hub cache's), else None; nothing is downloaded."""
    from transformers import AutoTokenizer

    source, location = resolve_model_name(name)
    if source == "tiny":
        return tiny_tokenizer()
    folder = _local_folder(source, location)
    tokenizer = None
    try:
        if folder is not None:
            tokenizer = AutoTokenizer.from_pretrained(folder)
        elif source == "hub" and in_hub_cache(location):
            tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=True)
    except (OSError, ValueError) as err:  # a folder without tokenizer files
        logger.info("no tokenizer of %s on this machine (%s)", name, err)
    # transformers builds an empty tokenizer for a folder with a config and no vocabulary
    return _finish_tokenizer(tokenizer) if tokenizer is not None and len(tokenizer) > 1 else None
