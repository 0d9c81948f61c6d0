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


def python_name_resolves(name: str) -> bool:
    """Whether ``name`` (``graft.x.y``, ``benchmarks.x``) is a module, an attribute or a
    dataclass field (what a docstring or a help text may name)."""
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
            if not python_name_resolves(match.group(1)):
                broken.append(f"{path.relative_to(ROOT)}: {match.group(1)}")
    assert named > 100
    assert not broken, "references to nothing:\n" + "\n".join(broken)


def test_a_moved_name_is_caught():
    assert python_name_resolves("graft.results.summary.summarize")
    assert not python_name_resolves("graft.results.metrics.summarize")
    assert python_name_resolves("graft.study.running.runner.ExperimentRun.analyses")


def test_every_package_docstring_names_its_sub_packages():
    stale = []
    for init in sorted((ROOT / "graft").rglob("__init__.py")):
        doc = importlib.import_module(".".join(init.parent.relative_to(ROOT).parts)).__doc__ or ""
        for sub in sorted(p.parent.name for p in init.parent.glob("*/__init__.py")):
            if f"``{sub}``" not in doc and f".{sub}`" not in doc and f".{sub}" not in doc:
                stale.append(f"{init.parent.relative_to(ROOT)}: {sub}")
    assert not stale, "package docstrings that do not name a sub-package:\n" + "\n".join(stale)


_COUNT = re.compile(r"\b(two|three|four|five|six|seven|eight|nine|ten) rooms\b")
_NUMBERS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def _tree_problems(package: Path, doc: str) -> list[str]:
    """How a package docstring is untrue to its folder: it lists some of its modules
    (``:mod:`` references) but not all, or counts its rooms wrong."""
    dotted = ".".join(package.relative_to(ROOT).parts)
    modules = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    listed = set(re.findall(rf":mod:`~?{re.escape(dotted)}\.(\w+)`", doc))
    listed |= set(re.findall(r":mod:`\.(\w+)`", doc))
    problems = []
    if listed & set(modules):  # it lists its modules: then all of them
        problems += [f"{dotted}: lists its modules but not {m}" for m in modules if m not in listed]
    rooms = len(list(package.glob("*/__init__.py")))
    for word in _COUNT.findall(doc):
        if _NUMBERS.index(word) + 2 != rooms:
            problems.append(f"{dotted}: says {word} rooms, has {rooms} sub-packages")
    return problems


def test_every_package_docstring_is_true_to_its_tree():
    """A package docstring that lists its modules lists every one, and one that counts its
    rooms counts its sub-packages."""
    problems = []
    for init in sorted((ROOT / "graft").rglob("__init__.py")):
        doc = importlib.import_module(".".join(init.parent.relative_to(ROOT).parts)).__doc__
        problems += _tree_problems(init.parent, doc or "")
    assert not problems, "\n".join(problems)


def test_an_untrue_package_docstring_is_caught():
    core = ROOT / "graft" / "core"
    assert _tree_problems(core, "in four rooms") == [
        "graft.core: says four rooms, has 5 sub-packages"
    ]
    stats = ROOT / "graft" / "results" / "stats"
    found = _tree_problems(stats, "Modules: :mod:`~graft.results.stats.paired` only.")
    assert "graft.results.stats: lists its modules but not wording" in found
    assert not any("paired:" in p or p.endswith("not paired") for p in found)
