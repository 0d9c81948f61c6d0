"""What computed a result: installed package versions and the git commit of graft's checkout,
recorded in every run folder's and donor's config."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

TRACKED_PACKAGES = ("torch", "transformers", "nnsight", "polars", "graft")


def package_versions(names: Sequence[str] = TRACKED_PACKAGES) -> dict[str, str | None]:
    """Installed versions of ``names`` (None when a package is not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(path: str | os.PathLike[str] | None = None) -> str | None:
    """``git rev-parse HEAD`` of the checkout holding the graft package (or ``path``).

    Returns None when git is missing, the code is not in a git checkout, or (for the
    default) the checkout found is not the one the package was imported from, e.g. a
    non-editable install inside some other repository's virtual environment.
    """
    package_dir = Path(__file__).resolve().parents[1]
    where = Path(path) if path is not None else package_dir

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=where, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    if path is None:
        top = git("rev-parse", "--show-toplevel")
        if top is None or Path(top).resolve() / package_dir.name != package_dir:
            return None
    return git("rev-parse", "HEAD")
