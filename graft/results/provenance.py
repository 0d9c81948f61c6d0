"""What computed a result: installed package versions, the git commit of graft's checkout
(and whether it had uncommitted changes), the machine and the command line, recorded in
every run folder's and donor's config."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

TRACKED_PACKAGES = ("torch", "transformers", "nnsight", "polars", "graft")
#: graft's distribution name on the package index (``pip install graft-interp``; "graft"
#: there is another project); records keep calling it ``graft``, its import name.
DISTRIBUTION = "graft-interp"


def package_versions(names: Sequence[str] = TRACKED_PACKAGES) -> dict[str, str | None]:
    """Installed versions of ``names`` (None when a package is not installed); ``graft`` is
    looked up under its distribution name, :data:`DISTRIBUTION`."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(DISTRIBUTION if name == "graft" else name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _git(where: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _checkout(path: str | os.PathLike[str] | None) -> Path | None:
    """The folder to ask git about: ``path``, or graft's own checkout (None when the package
    was not imported from a git checkout of its own, e.g. a non-editable install inside some
    other repository's virtual environment)."""
    package_dir = Path(__file__).resolve().parents[1]
    if path is not None:
        return Path(path)
    top = _git(package_dir, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() / package_dir.name != package_dir:
        return None
    return package_dir


def git_commit(path: str | os.PathLike[str] | None = None) -> str | None:
    """``git rev-parse HEAD`` of the checkout holding the graft package (or ``path``); None
    when git is missing or graft does not run from a checkout of its own."""
    where = _checkout(path)
    return None if where is None else _git(where, "rev-parse", "HEAD")


def git_dirty(path: str | os.PathLike[str] | None = None) -> bool | None:
    """Whether that checkout's tracked files differ from its commit (the result then did not
    come from the commit alone); None where :func:`git_commit` is None."""
    where = _checkout(path)
    if where is None:
        return None
    status = _git(where, "status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def machine_info(device: Any = None) -> dict[str, Any]:
    """The machine a result was computed on: CPU model and count, torch's thread count, the
    GPU's name when ``device`` (a ``torch.device`` or its text) is a CUDA device, platform
    and Python."""
    import torch

    dev = torch.device(device) if device is not None else None
    cuda = dev is not None and dev.type == "cuda" and torch.cuda.is_available()
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(dev) if cuda else None,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that is running, as a shell line (its program as the name it was called
    by, e.g. ``graft-exp position --n 5``)."""
    args = list(sys.argv if argv is None else argv)
    if args:
        args[0] = Path(args[0]).name
    return shlex.join(args)
