"""docs/explanation/architecture.md's promises about the tree: no module of graft, the commands or the
benchmarks passes 450 lines, a command's module holds at most 60 lines of code, every module
of graft has its row in the doc's "What each file does" tables, and every module the doc
names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from graft_experiments.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "explanation" / "architecture.md"
#: The most lines a module may have (docs/explanation/architecture.md, "What each file does").
MAX_LINES = 450
#: The most lines of code (no blank line, comment or docstring) a command's module may have:
#: flags -> resolve -> design -> run -> print, the rest in the library.
MAX_COMMAND_CODE = 60
#: The folders whose modules are held to :data:`MAX_LINES`.
SIZED = ("graft", "experiments", "benchmarks")

#: A package's or a single file's heading in "What each file does": **`graft/core/`**.
HEADING = re.compile(r"^\*\*`((?:graft|experiments|benchmarks)(?:/[\w.]+)*/?)`\*\*")
#: A table row whose first cell names a file: | `plan.py` | ... |
ROW = re.compile(r"^\|\s*`([^`]+\.py)`\s*\|")
#: A module path anywhere in the doc: core/plan.py, graft/results/folder.py, plan.py.
PY_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.py)\b")
#: A dotted name of graft, the commands or the benchmarks in backticks.
DOTTED = re.compile(r"`((?:graft|experiments|benchmarks)(?:\.\w+)+)`")


def _modules(*folders: str) -> list[Path]:
    return sorted(
        path
        for folder in folders
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def _lines(path: Path) -> int:
    """Lines as ``wc -l`` counts them."""
    return path.read_bytes().count(b"\n")


def test_no_formatter_compactions() -> None:
    # a size limit met by packing lines past the formatter is not met (fmt skip or off)
    packed = [
        str(path.relative_to(ROOT))
        for path in _modules(*SIZED, "tests")
        if "fmt: " + "skip" in path.read_text() or "fmt: " + "off" in path.read_text()
    ]
    assert not packed, f"formatter compactions in {', '.join(packed)}: let ruff format them"


def test_no_module_passes_450_lines() -> None:
    over = [
        f"{path.relative_to(ROOT)} ({_lines(path)} lines)"
        for path in _modules(*SIZED)
        if _lines(path) > MAX_LINES
    ]
    assert not over, (
        f"{len(over)} module(s) over {MAX_LINES} lines; split each into modules of one role "
        f"(docs/explanation/architecture.md, What each file does): {', '.join(over)}"
    )


def _code_lines(path: Path) -> int:
    source = path.read_text()
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(
        1
        for number, line in enumerate(source.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and number not in docstrings
    )


def test_every_command_is_thin() -> None:
    sizes = {module: _code_lines(ROOT / "experiments" / f"{module}.py") for module, _ in COMMANDS}
    assert min(sizes.values()) > 0, "no code counted: the count would pass anything"
    over = [f"{module}.py ({n})" for module, n in sizes.items() if n > MAX_COMMAND_CODE]
    assert not over, (
        f"commands over {MAX_COMMAND_CODE} lines of code: {', '.join(over)}; move what is not "
        "flags, resolving and printing into the library (graft.study's designs and specs)"
    )


def _file_section(text: str) -> list[str]:
    """The lines of the section "What each file does"."""
    lines = text.splitlines()
    start = lines.index("## What each file does")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def _documented(text: str) -> set[str]:
    """The modules the section gives a row (``graft/core/planning/plan.py``): a file's row in its
    package's table (first cell its name, or its path within the package), or a heading
    naming the file itself (**`graft/errors.py`**)."""
    found: set[str] = set()
    package: str | None = None
    for line in _file_section(text):
        heading = HEADING.match(line)
        if heading:
            name = heading.group(1)
            if name.endswith(".py"):
                found.add(name)
                package = None
            else:
                package = name.rstrip("/")
            continue
        row = ROW.match(line)
        if row and package is not None:
            found.add(f"{package}/{row.group(1)}")
    return found


def test_every_module_of_graft_has_its_row_in_the_architecture_doc() -> None:
    documented = _documented(DOC.read_text(encoding="utf-8"))
    missing = [
        str(path.relative_to(ROOT))
        for path in _modules("graft")
        if path.name != "__init__.py" and str(path.relative_to(ROOT)) not in documented
    ]
    assert not missing, (
        "docs/explanation/architecture.md gives no row to "
        + ", ".join(missing)
        + " (add one to its package's table in 'What each file does': | `file.py` | role |)"
    )


def _exists(name: str, package: str | None) -> bool:
    """Whether the module path ``name`` is a file: from the root, from ``graft/`` (the doc
    writes ``core/plan.py``), or within the package whose table it sits in."""
    bases = [ROOT, ROOT / "graft"] + ([ROOT / package] if package else [])
    return any((base / name).is_file() for base in bases)


def _resolves(dotted: str) -> bool:
    """Whether ``graft.x.y`` is a module or package, or a name its longest module prefix
    holds (a class, a function, a re-export; ``Class.method`` on a module)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else None
        if source is None and (base / "__init__.py").is_file():
            source = base / "__init__.py"
        if source is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        text = source.read_text(encoding="utf-8")
        most = 1 if source.name == "__init__.py" else 2
        return len(rest) <= most and re.search(rf"\b{re.escape(rest[0])}\b", text) is not None
    return False


def test_every_module_the_architecture_doc_names_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = set(_file_section(text))
    stale: list[str] = []
    package: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            package = None
        heading = HEADING.match(line) if line in section else None
        if heading and not heading.group(1).endswith(".py"):
            package = heading.group(1).rstrip("/")
        for name in PY_PATH.findall(line):
            if not _exists(name, package):
                stale.append(f"line {number}: {name}")
        for name in DOTTED.findall(line):
            if not _resolves(name):
                stale.append(f"line {number}: {name}")
    assert not stale, (
        "docs/explanation/architecture.md names modules that do not exist: " + "; ".join(stale)
    )


def test_pyproject_installs_every_package_and_no_generic_name():
    """Every package under graft/ is listed in pyproject's packages (a new one would be left
    out of a wheel otherwise), and the commands install as graft_experiments, never as a
    top-level ``experiments`` module that other projects use too."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "graft").rglob("__init__.py")
    }
    listed = set(config["packages"])
    assert tree <= listed, f"pyproject.toml lacks {sorted(tree - listed)}"
    assert listed - tree == {"graft_experiments"}
    assert config["package-dir"] == {"graft_experiments": "experiments"}
    assert "experiments" not in listed


def test_the_readme_is_one_screen_and_links_the_docs_index():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, "README.md over 150 lines: move the rest to docs/"
    assert "(docs/index.md)" in readme
    index = (ROOT / "docs" / "index.md").read_text()
    # every page of the four folders and the results index; the study pages are listed by
    # the results index (generated: benchmarks/results_pages.py)
    pages = {
        p.relative_to(ROOT / "docs").as_posix()
        for p in (ROOT / "docs").rglob("*.md")
        if p.parent.name != "results" or p.name == "index.md"
    } - {"index.md"}
    missing = sorted(p for p in pages if f"]({p}" not in index)
    assert not missing, f"docs/index.md does not link {', '.join(missing)}"


#: Where a protocol's name may be compared: the spec text's parser and resolution rules, and
#: the protocol registry; everywhere else reads a field of the protocol object.
PROTOCOL_NAME_HOMES = (
    "graft/core/language/spec.py",
    "graft/core/language/selectors.py",
    "graft/core/language/vocabulary.py",
    "graft/study/specs/protocol.py",
)


def protocol_name_comparisons(source: str) -> list[int]:
    """Lines of ``source`` comparing something named like a protocol with a protocol's name
    ("graft", "paper")."""
    names = {"graft", "paper"}
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = any(isinstance(s, ast.Constant) and s.value in names for s in sides) or any(
            isinstance(s, ast.Tuple | ast.List | ast.Set)
            and any(isinstance(e, ast.Constant) and e.value in names for e in s.elts)
            for s in sides
        )
        if named and any("protocol" in ast.unparse(s).lower() for s in sides):
            found.append(node.lineno)
    return found


def test_protocol_names_are_compared_only_by_the_parser_and_the_registry() -> None:
    assert protocol_name_comparisons("if cfg.protocol == 'paper':\n    pass\n") == [1]
    assert protocol_name_comparisons("x = protocol in ('graft', 'x')\n") == [1]
    assert protocol_name_comparisons("if head == 'paper':\n    pass\n") == []
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _modules(*SIZED)
        if str(path.relative_to(ROOT)) not in PROTOCOL_NAME_HOMES
        for line in protocol_name_comparisons(path.read_text())
    ]
    assert not found, f"protocol names compared at {', '.join(found)}: read a Protocol field"
