"""Every error a user can fix is a GraftError (docs/how-to/contribute.md): no bare ValueError,
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


# ----------------------------------------------------------------------- the hierarchy

#: Each class of graft.errors under its kind (graft/errors.py's docstring draws the tree).
KINDS = {
    "InputError": [
        "SpecError",
        "TraceError",
        "ExperimentError",
        "DatasetError",
        "FinetuneError",
        "UnsupportedModelError",
        "ModelNotFoundError",
        "DeviceError",
        "ConfigMismatchError",
        "MemoryPlanError",
        "SpanError",
        "StatsError",
        "ResultsError",
    ],
    "StorageError": [
        "DamagedFileError",
        "RunFolderError",
        "LockError",
        "LockTimeoutError",
        "LockLostError",
    ],
    "RemoteError": [],
    "UpstreamError": ["HubUnavailable"],
}


def _error_classes() -> dict[str, type]:
    import graft.errors as errors

    return {
        name: value
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.GraftError)
    }


def test_every_error_is_under_exactly_one_kind():
    import graft.errors as errors

    classes = _error_classes()
    kinds = [classes[kind] for kind in KINDS]
    assert set(classes) == {"GraftError", *KINDS, *(n for names in KINDS.values() for n in names)}
    for kind, names in KINDS.items():
        assert classes[kind].__bases__ == (errors.GraftError,)
        for name in names:
            assert [k.__name__ for k in kinds if issubclass(classes[name], k)] == [kind], name


def test_graft_error_is_no_value_error():
    for name, cls in _error_classes().items():
        assert not issubclass(cls, ValueError), name
    assert _error_classes()["GraftError"].__bases__ == (Exception,)


def test_except_graft_error_catches_every_kind():
    import graft

    for name, cls in _error_classes().items():
        err = cls("one line", "p") if name == "DatasetError" else cls("one line")
        try:
            raise err
        except graft.GraftError as caught:
            assert caught is err and str(caught) == "one line"
    # the four kinds a caller catches are one import away
    for kind in KINDS:
        assert getattr(graft, kind) is _error_classes()[kind]


def test_existing_names_and_attributes_stay():
    import graft
    from graft.errors import DatasetError, GraftError, RemoteError, SpecError
    from graft.study.data import generic_corpus

    assert graft.GraftError is GraftError
    assert generic_corpus.HubUnavailable is _error_classes()["HubUnavailable"]
    assert SpecError("bad", param="spec").param == "spec"
    assert DatasetError("bad", "n_facts").param == "n_facts"
    err = RemoteError("down", kind="timeout", detail="trace", param="host")
    assert (err.kind, err.detail, err.param, str(err)) == ("timeout", "trace", "host", "down")
    assert RemoteError("x").kind == "server" and GraftError("x").param is None


def test_the_docstring_draws_the_tree_one_line_per_class():
    import graft.errors as errors

    doc = errors.__doc__ or ""
    tree = [line.strip(" │├└─") for line in doc.splitlines() if line.startswith("    ")]
    named = [line.split()[0] for line in tree if line]
    assert sorted(named) == sorted(_error_classes()), named
    assert len(named) == len(set(named))
    for kind, names in KINDS.items():  # each class drawn below its kind
        at = named.index(kind)
        assert set(names) <= set(named[at + 1 : at + 1 + len(names)]), kind
