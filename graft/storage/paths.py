"""Whether a path can name what graft writes: UTF-8 text (graft records paths in JSON and
hands them to polars), names and a length the file system takes."""

from __future__ import annotations

import os
from pathlib import Path

#: The longest name and path most file systems take (when ``pathconf`` cannot tell).
NAME_MAX, PATH_MAX = 255, 4096


def path_problem(path: str | os.PathLike[str]) -> str:
    """Why ``path`` cannot name a folder or file graft writes, in words (``""`` when it
    can): bytes that are no UTF-8 (graft records paths in JSON and hands them to polars,
    which take text), a name longer than the file system takes, or a path longer than
    the system takes. Checked before anything is written there."""
    text = os.fspath(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 (it holds a byte no UTF-8 text has); use a name of UTF-8 text"
    absolute = Path(os.path.abspath(text))
    existing = absolute
    while not os.path.isdir(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = NAME_MAX, PATH_MAX
    for part in absolute.parts:
        size = len(part.encode("utf-8"))
        if size > name_max:
            return (
                f"has a name of {size} bytes ({part[:20]}...), longer than the {name_max} this "
                "file system takes; use a shorter name"
            )
    size = len(str(absolute).encode("utf-8"))
    if size >= path_max:
        return (
            f"is {size} bytes long, longer than the {path_max - 1} the system takes; use a "
            "shorter path"
        )
    return ""
