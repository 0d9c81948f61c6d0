"""Checksums of finished finetunes: written into the folder last, checked before a donor loads.

A finished finetune (:mod:`graft.study.training.finetune`) holds ``checksums.json``: ``{relative file
name: sha256}`` of every other file in it. :func:`verify_donor` checks a donor folder against
it before an experiment loads the weights, so damaged or edited weights are an error rather
than silently different results. A donor folder without it is refused: graft's own finetunes
always write it, and a folder a user brought (or one of a graft before checksums) is used only
once the user accepts it as it is (:func:`accept_donor`, ``graft-exp accept FOLDER``), which
writes its checksums and ``accepted.json``. A base model (the pretrained model, from the
registry or the hub) without checksums is loaded as it is.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from graft.errors import DamagedFileError, FinetuneError
from graft.results.provenance import command_line
from graft.storage.files import (
    file_sha256,
    refuse_special_under,
    utc_timestamp,
    write_json_atomic,
)

logger = logging.getLogger(__name__)

#: The checksum file of a finished finetune.
CHECKSUMS = "checksums.json"
#: The record that a user accepted a model folder as it was (written by :func:`accept_donor`).
ACCEPTED = "accepted.json"
#: The file every finetune of graft's writes first: a folder holding it is graft's own.
FINETUNE_RECORD = "finetune_config.json"
#: Files that hold or point to weights: one not listed in checksums.json is refused, since
#: transformers may load it instead of (or besides) the listed ones.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")


def _files(folder: Path) -> list[str]:
    """Relative names of the files in ``folder`` (all depths), but ``checksums.json``."""
    names = (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return sorted(n for n in names if n != CHECKSUMS)


def write_checksums(folder: str | os.PathLike[str]) -> Path:
    """Write ``folder/checksums.json`` ({relative name: sha256} of every other file)."""
    folder = Path(folder)
    sums = {name: file_sha256(folder / name) for name in _files(folder)}
    return write_json_atomic(folder / CHECKSUMS, sums)


def _damaged(folder: Path, what: str) -> DamagedFileError:
    return DamagedFileError(
        f"donor folder {folder}: {what} (damaged or edited); delete {folder} and rerun to "
        "finetune it again"
    )


def _recorded(folder: Path) -> dict[str, str]:
    try:
        sums = json.loads((folder / CHECKSUMS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        sums = None
    if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
        raise _damaged(folder, f"{CHECKSUMS} is not a readable checksum list")
    return sums


def check_status(folder: str | os.PathLike[str]) -> str:
    """How a model folder is checked when it loads (for a run's ``config.json``):
    ``"checksums"``, ``"accepted as is <time>"`` (checksums written by :func:`accept_donor`)
    or ``"unverified"`` (no checksums: a base model)."""
    folder = Path(folder)
    if not (folder / CHECKSUMS).is_file():
        return "unverified"
    try:
        accepted = json.loads((folder / ACCEPTED).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "checksums"
    return f"accepted as is {accepted.get('time', '')}".strip()


#: Base folders said to load unverified in this process (said once each).
_SAID_UNVERIFIED: set[str] = set()


def verify_donor(folder: str | os.PathLike[str], role: str = "donor") -> None:
    """Check a model folder against its ``checksums.json``. A folder without one is refused
    when it is a donor (``role``); a base model's is loaded as it is (said at info level).

    Raises:
        DamagedFileError: a listed file is missing or has another sha256, a weight file is
            not listed, ``checksums.json`` is unreadable, or a finetune of graft's lacks it.
        FinetuneError: a donor folder a user brought has no checksums (the message names
            the command that accepts it as it is).
    """
    folder = Path(folder)
    refuse_special_under(folder)  # before anything in it is opened (a FIFO would hang)
    if not (folder / CHECKSUMS).is_file():
        accept = f"graft-exp accept {folder}"
        if (folder / FINETUNE_RECORD).is_file():
            raise DamagedFileError(
                f"donor folder {folder}: {CHECKSUMS} is missing, which every finished finetune "
                f"writes last (damaged, edited or unfinished); delete {folder} and rerun to "
                f"finetune it again, or, to use it as it is, {accept}"
            )
        if role == "donor":
            raise FinetuneError(
                f"donor folder {folder} has no {CHECKSUMS}, so graft cannot tell later whether "
                f"its weights changed; to use it as it is, {accept} (records its checksums)"
            )
        if str(folder) not in _SAID_UNVERIFIED:  # a run loads its base more than once
            _SAID_UNVERIFIED.add(str(folder))
            logger.info(
                "%s has no %s: the base model is loaded unverified (%s records its checksums)",
                folder,
                CHECKSUMS,
                accept,
            )
        return
    sums = _recorded(folder)
    for name, digest in sums.items():
        path = folder / name
        if not path.is_file():
            raise _damaged(folder, f"{name} is missing (listed in {CHECKSUMS})")
        if file_sha256(path) != digest:
            raise _damaged(folder, f"{name} does not match {CHECKSUMS}")
    for name in _files(folder):
        if name not in sums and name.endswith(WEIGHT_SUFFIXES):
            raise _damaged(folder, f"{name} is not listed in {CHECKSUMS}")


def accept_donor(folder: str | os.PathLike[str]) -> Path:
    """Accept a model folder as it is: write ``accepted.json`` (when, by which command) and
    its ``checksums.json``, so it loads as a donor and is checked from now on. A folder that
    has checksums already is refused (it needs no acceptance; a damaged one needs a new
    finetune).

    Raises:
        FinetuneError: ``folder`` is no model folder, or has its checksums.
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FinetuneError(f"{folder} is no model folder (no config.json); give a donor's folder")
    if (folder / CHECKSUMS).is_file():
        raise FinetuneError(
            f"{folder} has its {CHECKSUMS} already: it is verified when it loads (a damaged one "
            "is finetuned again: delete the folder and rerun)"
        )
    record = {
        "time": utc_timestamp(),
        "command": command_line(),
        "why": "the user chose to use this folder as it was, without graft's checksums",
    }
    write_json_atomic(folder / ACCEPTED, record)
    return write_checksums(folder)


def check_trained_on(donor: str | os.PathLike[str], dataset: str | os.PathLike[str]) -> None:
    """Refuse a finished ``donor`` whose training texts are not those ``dataset`` holds now:
    the ``train.jsonl`` hash in the donor's ``data_manifest.json`` (the dataset's manifest
    when it was trained) against the dataset's own. A dataset regenerated under the same
    name by a newer generator (e.g. the paper protocol's five article and five QA
    renderings per fact, no longer six and five) otherwise keeps its old donor silently.
    Either side without the hash (older graft, hand-made folders) passes.

    Raises:
        FinetuneError: the hashes differ; the message names the folder to delete.
    """
    refuse_special_under(donor)  # a FIFO would hang the reads below
    refuse_special_under(dataset)
    recorded = _train_hash(Path(donor) / "data_manifest.json")
    current = _train_hash(Path(dataset) / "manifest.json")
    if recorded is None or current is None or recorded == current:
        return
    raise FinetuneError(
        f"the finetuned model {donor} was trained on other texts than the dataset {dataset} "
        f"holds now (its train.jsonl changed, e.g. regenerated by a newer graft); delete "
        f"{donor} to finetune it again on the current data"
    )


def _train_hash(manifest: Path) -> str | None:
    """The sha256 of ``train.jsonl`` a dataset manifest records, or None."""
    try:
        files = json.loads(manifest.read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    value = files.get("train.jsonl") if isinstance(files, dict) else None
    return value if isinstance(value, str) else None
