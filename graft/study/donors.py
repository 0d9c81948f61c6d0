"""Checksums of finished finetunes: written into the folder last, checked before a donor loads.

A finished finetune (:mod:`graft.study.finetune`) holds ``checksums.json``: ``{relative file
name: sha256}`` of every other file in it. :func:`verify_donor` checks a donor folder against
it before an experiment loads the weights, so damaged or edited weights are an error rather
than silently different results. Folders without it (made by earlier graft versions, or by
users) are loaded unverified.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from graft.errors import DamagedFileError
from graft.results.files import file_sha256, write_json_atomic

logger = logging.getLogger(__name__)

#: The checksum file of a finished finetune.
CHECKSUMS = "checksums.json"
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


def verify_donor(folder: str | os.PathLike[str]) -> None:
    """Check a model folder against its ``checksums.json``; a folder without one is loaded
    unverified (said at info level).

    Raises:
        DamagedFileError: a listed file is missing or has another sha256, a weight file is
            not listed, or ``checksums.json`` is unreadable.
    """
    folder = Path(folder)
    if not (folder / CHECKSUMS).is_file():
        logger.info(
            "%s has no %s (made by an earlier graft or by hand): not verified", folder, CHECKSUMS
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
