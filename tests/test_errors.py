"""Every error a user can fix is a GraftError (docs/contributing.md): no bare ValueError,
TypeError, RuntimeError, KeyError or IndexError is raised in graft/ or experiments/, except
programming errors, marked so on the raising line."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILTIN = {"ValueError", "TypeError", "RuntimeError", "KeyError", "IndexError"}
MARK = "# programming error"


def bare_raises(path: Path) -> list[str]:
    """``file:line`` of each unmarked ``raise <builtin error>(...)`` in ``path``."""
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            named = isinstance(exc, ast.Name) and exc.id in BUILTIN
            if named and MARK not in lines[node.lineno - 1]:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {exc.id}")
    return found


def test_user_errors_are_graft_errors():
    files = sorted(
        [*ROOT.joinpath("graft").rglob("*.py"), *ROOT.joinpath("experiments").rglob("*.py")]
    )
    found = [hit for path in files for hit in bare_raises(path)]
    assert not found, (
        "raise a graft.errors.GraftError subclass (or mark a programming error):\n"
        + "\n".join(found)
    )


def test_the_check_sees_a_bare_raise(tmp_path, monkeypatch):
    bad = tmp_path / "graft" / "x.py"
    bad.parent.mkdir()
    bad.write_text(
        f"def f():\n    raise ValueError('bad')\n\ndef g():\n    raise TypeError(1)  {MARK}\n"
    )
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    assert bare_raises(bad) == ["graft/x.py:2: ValueError"]
