"""Docstrings name what exists: every Sphinx reference to graft (``:func:`graft.x.y```,
``:mod:``, ``:class:``, ...) in graft's modules resolves to a module, an attribute or a
dataclass field, so a function that moves does not leave its old address behind."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROLE = re.compile(r":(?:mod|func|class|data|meth|attr|exc|obj):`~?(graft(?:\.\w+)+)`")


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            fields = (
                {f.name for f in dataclasses.fields(found)}
                if dataclasses.is_dataclass(found)
                else set()
            )  # type: ignore[arg-type]
            if attr in fields:
                return attr == parts[-1]
            if not hasattr(found, attr):
                return False
            found = getattr(found, attr)
        return True
    return False


def test_every_docstring_reference_resolves():
    named, broken = 0, []
    for path in sorted((ROOT / "graft").rglob("*.py")):
        for match in ROLE.finditer(path.read_text()):
            named += 1
            if not _resolves(match.group(1)):
                broken.append(f"{path.relative_to(ROOT)}: {match.group(1)}")
    assert named > 100
    assert not broken, "references to nothing:\n" + "\n".join(broken)


def test_a_moved_name_is_caught():
    assert _resolves("graft.results.summary.summarize")
    assert not _resolves("graft.results.metrics.summarize")
    assert _resolves("graft.study.running.runner.ExperimentRun.analyses")


def test_every_package_docstring_names_its_sub_packages():
    stale = []
    for init in sorted((ROOT / "graft").rglob("__init__.py")):
        doc = importlib.import_module(".".join(init.parent.relative_to(ROOT).parts)).__doc__ or ""
        for sub in sorted(p.parent.name for p in init.parent.glob("*/__init__.py")):
            if f"``{sub}``" not in doc and f".{sub}`" not in doc and f".{sub}" not in doc:
                stale.append(f"{init.parent.relative_to(ROOT)}: {sub}")
    assert not stale, "package docstrings that do not name a sub-package:\n" + "\n".join(stale)
