"""What a folder is (a run folder, a model folder, a dataset folder, a workspace), so that
commands act only on the right kind: ``graft-exp accept`` says what it accepts, and a run's
``--out`` is refused inside another run folder (its ``parts/`` included), a model or a
dataset folder, or at a workspace's root, where a later ``--overwrite`` of the outer folder,
a donor's checksums or a workspace listing would meet it.

A folder's kind is read from the files graft writes into it: the ``.graft-run`` marker (or
an older graft's ``config.json`` with its experiment), a model's ``config.json`` with its
``model_type`` (or ``architectures``), a dataset's ``manifest.json`` beside its JSONL files, a
workspace's ``datasets/`` or ``finetuned/`` folders.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from graft.errors import RunFolderError
from graft.results.folder import RunFolder
from graft.results.run_config import CONFIG_FILE

#: The kinds :func:`folder_kind` tells apart.
RUN_FOLDER, MODEL_FOLDER, DATASET_FOLDER, WORKSPACE = (
    "run folder",
    "model folder",
    "dataset folder",
    "workspace",
)

_DATASET_FILES = ("facts.jsonl", "test_prompts.jsonl", "train.jsonl", "corpus.jsonl")


def _model_config(path: Path) -> bool:
    try:
        config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and ("model_type" in config or "architectures" in config)


def folder_kind(path: str | os.PathLike[str]) -> str | None:
    """The kind of the folder ``path`` (:data:`RUN_FOLDER`, :data:`MODEL_FOLDER`, :data:`DATASET_FOLDER` or
    :data:`WORKSPACE`), or None for any other folder (or no folder)."""
    path = Path(path)
    if not path.is_dir():
        return None
    if RunFolder(path).is_marked():
        return RUN_FOLDER
    if _model_config(path):
        return MODEL_FOLDER
    if (path / "manifest.json").is_file() and any((path / f).is_file() for f in _DATASET_FILES):
        return DATASET_FOLDER
    if (path / "datasets").is_dir() or (path / "finetuned").is_dir():
        return WORKSPACE
    return None


def _listed_in(run_folder: Path, child: Path) -> bool:
    """Whether ``child`` is a direct sub-run the run folder's config lists (``runs``: the
    runs of a sweep such as ``graft-exp patching``, kept in its folder)."""
    if child.parent != run_folder:
        return False
    try:
        config = json.loads((run_folder / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    runs = config.get("runs") if isinstance(config, dict) else None
    return isinstance(runs, list) and child.name in runs


def check_out_placement(
    out: str | os.PathLike[str], workspace: str | os.PathLike[str] | None = None
) -> None:
    """Refuse the run folder ``out`` when it is, or lies inside, a model or dataset folder;
    lies inside another run folder (unless it is one of the sub-runs that folder's config
    lists); or is the root of a workspace (``workspace``, or any folder holding a
    workspace's ``datasets/`` or ``finetuned/``).

    Raises:
        RunFolderError: one line naming the folder it is in and the fix.
    """
    out = Path(os.path.abspath(out))
    kind = folder_kind(out)
    if kind in (MODEL_FOLDER, DATASET_FOLDER, WORKSPACE) or (
        workspace is not None and out == Path(os.path.abspath(workspace))
    ):
        raise RunFolderError(
            f"--out {out} is a {kind or WORKSPACE}, not a run folder; choose another "
            "output folder (e.g. runs/NAME)"
        )
    child = out
    for parent in out.parents:
        parent_kind = folder_kind(parent)
        if parent_kind == RUN_FOLDER and not _listed_in(parent, child):
            raise RunFolderError(
                f"--out {out} is inside the run folder {parent} (an --overwrite of it would "
                "delete this run); choose a folder outside it"
            )
        if parent_kind in (MODEL_FOLDER, DATASET_FOLDER):
            raise RunFolderError(
                f"--out {out} is inside the {parent_kind} {parent}; choose a folder outside it"
            )
        child = parent
