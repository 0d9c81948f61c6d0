"""Which of graft's run-time packages the newest allowed releases would change.

    python scripts/newest_differs.py REPORT.json

REPORT.json is pip's ``--report`` of ``pip install --dry-run --upgrade --upgrade-strategy
eager -e .`` run in the locked .venv (scripts/test_newest.sh makes it): the packages pip would
install or upgrade there. Prints one ``name locked -> newest`` line per package that graft
needs at run time (graft's requirements without extras, and theirs, as installed in this
interpreter) and exits 0; prints the others (dev tools: what a user does not get) on stderr.
Exits 0 with nothing on stdout when no run-time package would change.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as normal

#: graft's distribution name (pyproject's [project] name; the import name is graft)
DISTRIBUTION = "graft-interp"


def runtime_closure(root: str = DISTRIBUTION) -> set[str]:
    """graft and every package it requires at run time (no extras), transitively."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        if normal(name) in seen:
            continue
        seen.add(normal(name))
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def changes(report: dict) -> list[tuple[str, str | None, str]]:
    """(name, installed version or None, version pip would install), graft itself left out."""
    found = []
    for item in report.get("install", []):
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if normal(name) == DISTRIBUTION:
            continue
        try:
            installed: str | None = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            found.append((normal(name), installed, version))
    return sorted(found)


def main(path: str) -> None:
    with open(path) as handle:
        report = json.load(handle)
    runtime = runtime_closure()
    for name, installed, version in changes(report):
        line = f"{name} {installed or '(none)'} -> {version}"
        if name in runtime:
            print(line)
        else:
            print(f"{line} (not a run-time package of graft)", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
