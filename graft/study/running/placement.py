"""What a folder is (a run folder, a model folder, a dataset folder, a workspace), so that
commands act only on the right kind: ``graft-exp accept`` says what it accepts, and a run's
``--out`` is refused inside another run folder (its ``parts/`` included), a model or a
dataset folder, or at a workspace's root, where a later ``--overwrite`` of the outer folder,
a donor's checksums or a workspace listing would meet it.

A folder's kind is read from the files graft writes into it: the ``.graft-run`` marker (or
an older graft's ``config.json`` with its experiment), a model's ``config.json`` with its
``model_type`` (or ``architectures``), a dataset's ``manifest.json`` beside its JSONL files, a
workspace's ``datasets/`` or ``finetuned/`` folders. Where a run's folder is when ``--out``
is not given: :func:`default_out`; either way: :func:`out_folder`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from graft.errors import RunFolderError
from graft.results.folder import RunFolder
from graft.results.run_config import CONFIG_FILE
from graft.study.specs.config import SHUFFLES, ExperimentConfig
from graft.study.specs.run import RunSpecs, resolve
from graft.study.training.workspace import model_slug

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


def default_out(cfg: ExperimentConfig | RunSpecs, tag: str = "") -> Path:
    """``runs/<experiment>/<model>-<dataset>[-pairs][-tag][-replicates]-seed<seed>`` (``-pairs``:
    ``real_movies_shuffled`` with the pair-keeping shuffle); the replicate
    part names several finetune seeds (``-fseeds0-1-2``), several data seeds
    (``-dseeds0-1``) and control models (``-control``)."""
    run = resolve(cfg)
    data = Path(run.data.dataset).name if Path(run.data.dataset).is_dir() else run.data.dataset
    if run.data.shuffle != SHUFFLES[0]:  # real_movies_shuffled-pairs, as its dataset folder
        data += f"-{run.data.shuffle}"
    tags = [tag] if tag else []
    if run.donors.finetune_seeds != (0,):
        tags.append("fseeds" + "-".join(map(str, run.donors.finetune_seeds)))
    if len(run.data.data_seeds) > 1:
        tags.append("dseeds" + "-".join(map(str, run.data.data_seeds)))
    if run.donors.control:
        tags.append("control")
    parts = "".join("-" + t for t in tags)
    name = f"{model_slug(run.donors.model)}-{data}{parts}-seed{run.analysis.seed}"
    return Path("runs") / run.experiment / name


def out_folder(cfg: ExperimentConfig | RunSpecs, tag: str = "") -> Path:
    """The run folder: the run's ``out`` when given, else :func:`default_out` (``tag``: a
    part of its name); the one place a run, a design and a study work it out."""
    run = resolve(cfg)
    return Path(run.execution.out) if run.execution.out else default_out(run, tag)
