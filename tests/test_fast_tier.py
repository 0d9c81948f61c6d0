"""The fast tier (``pytest -m "not slow"``, docs/how-to/contribute.md) runs code of every module of
graft: checked on what this session's fast tests ran (``tests/fast_tier.py``). The check runs
last, in the whole suite (CI) or with ``pytest -m "not slow or fast_tier_check"``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import graft
import graft.core.execution.engine as engine
from tests.fast_tier import RECORD, graft_modules, runs_code


def test_every_module_of_graft_is_found_with_its_functions():
    modules = {name: (Path(path), has) for name, path, has in graft_modules()}
    files = sorted(Path(graft.__file__).parent.rglob("*.py"))
    assert len(modules) == len(files) and {path for path, _ in modules.values()} == set(files)
    assert modules["graft"] == (Path(graft.__file__), True)
    assert modules["graft.core.execution.engine"] == (Path(engine.__file__), True)
    assert modules["graft.core"][1] is False  # a package that only re-exports


def test_a_module_of_declarations_has_no_code_to_run():
    protocol = (
        'class P(Protocol):\n    def f(self) -> int:\n        """What f is."""\n        ...\n'
    )
    assert not runs_code(protocol)
    assert not runs_code("@dataclass\nclass D:\n    x: int\n\nNAMES = {'a': 1}\n")
    assert not runs_code("def f():\n    raise NotImplementedError\n")
    assert runs_code("class D:\n    def f(self):\n        return 1\n")
    assert runs_code('def f():\n    """Doc."""\n    print()\n')


@pytest.mark.slow
@pytest.mark.fast_tier_check
def test_fast_tier_runs_every_module():
    if RECORD.partial:
        pytest.skip(f"not the whole fast tier: {RECORD.partial}")
    if RECORD.tracing_refused:
        pytest.skip(
            f"another tracer was active during {len(RECORD.tracing_refused)} fast tests "
            f"(e.g. {RECORD.tracing_refused[0]}), so what they ran is unknown"
        )
    assert RECORD.active
    not_run = sorted(RECORD.pending.values())
    assert not not_run, (
        f"no test outside the slow tier runs a function of {', '.join(not_run)}: "
        "add a small fast test for each (docs/how-to/contribute.md, 'Two tiers')"
    )
    not_imported = [name for name in RECORD.without_functions if name not in sys.modules]
    assert not not_imported, f"never imported: {', '.join(not_imported)}"
