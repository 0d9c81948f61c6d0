"""Loading a model by name: :func:`load_model` gives a :class:`LoadedModel` (model, tokenizer,
where it came from) on the device and dtype asked for; tokenizers, including the offline
character-level one of the ``tiny-*`` models."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from graft.errors import DeviceError, InputError, ModelNotFoundError, first_line
from graft.models.devices import parse_device
from graft.models.embedded import embedded_source, ensure_embedded
from graft.models.hub import prepare_hub
from graft.models.paper import paper_mismatch
from graft.models.registry import EMBEDDED_MODELS, TINY_MODELS, hub_hint, resolve_model_name
from graft.models.tiny import tiny_model

logger = logging.getLogger(__name__)


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


# ----------------------------------------------------------------------------- dtype, device


def resolve_dtype(
    dtype: str | torch.dtype | None, device: str | torch.device | None
) -> torch.dtype:
    """``None`` -> float32 on CPU, bfloat16 on CUDA; strings like ``"bf16"`` are accepted."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        return torch.bfloat16 if torch.device(device or "cpu").type == "cuda" else torch.float32
    aliases = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "float": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "half": torch.float16,
        "float64": torch.float64,
        "fp64": torch.float64,
        "double": torch.float64,
    }
    try:
        return aliases[str(dtype).lower().removeprefix("torch.")]
    except KeyError:
        raise InputError(f"unknown dtype {dtype!r}; choose one of {', '.join(aliases)}") from None


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_type(device: str | torch.device | None) -> str:
    """The type of the device a run with ``device`` uses (``cpu``, ``cuda``, ``mps``), where
    it runs or not: None is :func:`default_device`'s."""
    return default_device().type if device is None else parse_device(device).type


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device to use: ``None`` -> :func:`default_device`; else ``device`` if it exists here.

    Every device string graft runs on (experiments, finetuning, loading) goes through here.

    Raises:
        DeviceError: as :func:`parse_device`, and CUDA/MPS (or a CUDA index) this machine
            does not have.
    """
    if device is None:
        return default_device()
    dev = torch.device(str(parse_device(device)))
    if dev.type == "cuda":
        n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n_gpus == 0:
            raise DeviceError(
                f"device {str(device)!r}: CUDA is not available here; use cpu", param="device"
            )
        if dev.index is not None and dev.index >= n_gpus:
            raise DeviceError(
                f"device {str(device)!r}: this machine has {n_gpus} CUDA device(s) "
                f"(cuda:0..cuda:{n_gpus - 1})",
                param="device",
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(
            f"device {str(device)!r}: MPS is not available here; use cpu", param="device"
        )
    return dev


# ----------------------------------------------------------------------------- tokenizers


def _finish_tokenizer(tok: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    # Batching (finetuning, grafting) needs a pad token; EOS is the usual stand-in.
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    return tok


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


# ----------------------------------------------------------------------------- loading


def _place(
    model, device: torch.device, dtype: torch.dtype, device_map
) -> transformers.PreTrainedModel:
    if model.dtype != dtype:
        model = model.to(dtype)
    if device_map is None:
        model = model.to(device)
    return model.eval()


def _load_pretrained(
    location: str | Path, hf_kwargs: dict[str, Any]
) -> tuple[transformers.PreTrainedModel, PreTrainedTokenizerBase]:
    return (
        AutoModelForCausalLM.from_pretrained(location, **hf_kwargs),
        AutoTokenizer.from_pretrained(location),
    )


def _load_hub(
    location: str, hf_kwargs: dict[str, Any]
) -> tuple[transformers.PreTrainedModel, PreTrainedTokenizerBase, str | None]:
    """Model, tokenizer and commit hash of a hub model; the hub probed first
    (:func:`~graft.models.hub.prepare_hub`: offline from its cache when it does not answer,
    one line at once when the model is not cached either)."""
    prepare_hub(location)
    try:
        model, tok = _load_pretrained(location, hf_kwargs)
    except OSError as err:
        raise ModelNotFoundError(
            f"could not load {location!r} from the hub ({first_line(err)}); "
            f"{hub_hint(location)}; offline registry names: "
            f"{', '.join((*EMBEDDED_MODELS, *TINY_MODELS))}"
        ) from err
    return model, tok, getattr(model.config, "_commit_hash", None)


def _load_local(
    location: str, hf_kwargs: dict[str, Any]
) -> tuple[transformers.PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer of a local folder; a folder transformers cannot load (unknown
    architecture, missing, truncated or emptied weights, weights of another shape than
    ``config.json`` says) is bad input."""
    try:
        return _load_pretrained(location, hf_kwargs)
    except (OSError, ValueError, KeyError, SafetensorError, RuntimeError) as err:
        # transformers raises a bare RuntimeError for weights whose shapes disagree with the
        # config; any other RuntimeError (out of memory with a device_map) is not bad input
        mismatch = isinstance(err, RuntimeError) and "mismatched_sizes" in str(err)
        if isinstance(err, RuntimeError) and not mismatch:
            raise
        reason = "weights of other shapes than its config.json gives" if mismatch else None
        raise ModelNotFoundError(
            f"cannot load the model folder {location} ({reason or first_line(err)}); pass a "
            "folder saved by save_pretrained (model and tokenizer)"
        ) from err


def _load_source(
    source: str, location: str, hf_kwargs: dict[str, Any]
) -> tuple[transformers.PreTrainedModel, PreTrainedTokenizerBase, str, str | None]:
    """``(model, tokenizer, location, revision)`` of a name :func:`resolve_model_name` checked."""
    if source == "tiny":
        return tiny_model(location, seed=0), tiny_tokenizer(), f"graft.tiny:{location}", "seed=0"
    if source == "embedded":
        directory = ensure_embedded(location)
        model, tok = _load_pretrained(directory, hf_kwargs)
        return model, tok, str(directory), f"sha256:{embedded_source(directory)['gguf_sha256']}"
    if source == "hub":
        model, tok, revision = _load_hub(location, hf_kwargs)
        return model, tok, location, revision
    model, tok = _load_local(location, hf_kwargs)
    return model, tok, str(Path(location).resolve()), None


#: (name, folder) pairs :func:`_check_named` has checked: each is said once.
_NAMED_WARNED: set[tuple[str, str]] = set()


def _check_named(name: str, folder: str, model: transformers.PreTrainedModel) -> None:
    """Warn (once per process) when ``folder``, loaded as ``name``, is named after a paper
    model but holds another (:func:`graft.models.paper.paper_mismatch`)."""
    if (name, folder) in _NAMED_WARNED:
        return
    _NAMED_WARNED.add((name, folder))
    n_params = sum(p.numel() for p in model.parameters())
    line = paper_mismatch(name, folder, model.config, n_params)
    if line is not None:
        logger.warning("%s", line)


def load_model(
    name_or_path: str | os.PathLike[str],
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    device_map: str | dict[str, Any] | None = None,
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
    model, tok, location, revision = _load_source(source, location, hf_kwargs)
    if source == "local":
        _check_named(name, location, model)
    # A tiny model is built on the CPU whatever device_map says: move it like any other.
    model = _place(model, dev, dt, None if source == "tiny" else device_map)
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
