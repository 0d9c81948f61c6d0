"""The engine's self-check over several families (graft.core.api.selfcheck): its table and
its verdict."""

from __future__ import annotations

import pytest

from graft.core.api import selfcheck
from graft.core.api.selfcheck import SMOKE_SPECS, self_check


def test_self_check_tables_each_family_and_holds_on_tiny_pairs(tiny_pairs):
    found = self_check((family, tiny_pairs(family)) for family in ("llama", "gpt2"))
    assert found.failures == [] and list(found.shifts) == ["llama", "gpt2"]
    lines = found.lines()
    assert lines[0].split() == ["graft", "llama", "gpt2"]
    assert [line[:24].strip() for line in lines[1 : 1 + len(SMOKE_SPECS)]] == SMOKE_SPECS
    assert lines[1].split()[1:] == ["0.0000", "0.0000"]  # grafting nothing moves nothing
    assert lines[1 + len(SMOKE_SPECS)].split()[:2] == ["engine", "path"]
    assert found.ok_line().endswith("within 1e-05, in 2 families")


def test_self_check_names_each_family_whose_invariant_fails(tiny_pairs, monkeypatch):
    monkeypatch.setattr(selfcheck, "TOLERANCE", -1.0)  # every difference is too large
    found = self_check([("llama", tiny_pairs("llama"))])
    assert len(found.failures) == 2 and all(f.startswith("llama: ") for f in found.failures)


@pytest.mark.parametrize("n", [1, 3])
def test_the_ok_line_counts_families(n):
    found = selfcheck.SelfCheck({f"f{i}": [] for i in range(n)}, [], {})
    assert found.ok_line().endswith(f"in {n} famil{'y' if n == 1 else 'ies'}")
