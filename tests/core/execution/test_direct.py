"""Direct references: a row that is a donor's own forward runs as one, locally."""

from __future__ import annotations

import pytest
import torch

import graft.core.execution.executor as executor
import graft.core.execution.routing as routing
from graft.core.execution.engine import GraftRow, LocalExecutor, run_grafts
from graft.core.families.arch import architecture_of
from graft.core.language.spec import parse_spec
from graft.models.tiny import TINY_FAMILIES, perturbed_copy, tiny_model
from tests.engine_cases import own_forward

TOL = 1e-5
SFT = "ALL:all:all; head=donor"


class Grafting:
    """Runs every plan as a graft (not a LocalExecutor, so no row is taken as direct)."""

    def run(self, base, donors, plans):
        return LocalExecutor().run(base, donors, plans)


def _rows(specs: list[str], seed: int = 0) -> list[GraftRow]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i, text in enumerate(specs):
        n = 5 + i % 4  # different lengths: a row in the wrong place shows
        ids = [1] + torch.randint(3, 96, (n - 1,), generator=g).tolist()
        rows.append(GraftRow(ids, {"FE": [1, 2]}, parse_spec(text)))
    return rows


@pytest.fixture(scope="module")
def models():
    cache = {}

    def get(family):
        if family not in cache:
            base = tiny_model(family, seed=0)
            donors = {"sft": perturbed_copy(base, seed=1), "task": perturbed_copy(base, seed=2)}
            cache[family] = (base, donors)
        return cache[family]

    return get


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_sft_is_the_donor_forward(models, family, monkeypatch):
    base, donors = models(family)
    rows = _rows([SFT] * 5)
    kw = dict(batch_size=5, padding_side="right", sort_by_length=False)
    grafted = run_grafts(base, donors, rows, executor=Grafting(), **kw)
    monkeypatch.setattr(executor, "graft_batch", None)  # a trace would fail: none is run
    direct = run_grafts(base, donors, rows, **kw)
    assert (direct - grafted).abs().max() <= TOL
    assert torch.equal(direct, own_forward(donors["sft"], rows))
    assert (direct - own_forward(base, rows)).abs().max() > 1e-3  # not the base


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_rows_keep_their_order_when_some_are_direct(models, family, padding_side):
    base, donors = models(family)
    specs = [SFT, "FE:all:all", "none", "ALL:all:all@task; head=donor@task", SFT, "LT:all:o"]
    rows = _rows(specs * 2)
    kw = dict(batch_size=3, padding_side=padding_side)
    mixed = run_grafts(base, donors, rows, **kw)
    grafted = run_grafts(base, donors, rows, executor=Grafting(), **kw)
    assert (mixed - grafted).abs().max() <= TOL
    for name, text in (("sft", SFT), ("task", specs[3])):
        at = [i for i, r in enumerate(rows) if str(r.spec) == str(parse_spec(text))]
        alone = [GraftRow(rows[i].input_ids) for i in at]
        own = run_grafts(donors[name], {}, alone, batch_size=3, padding_side=padding_side)
        assert torch.equal(mixed[at], own)


def test_only_a_whole_donor_forward_is_direct(models):
    base, donors = models("gpt2")
    arch = architecture_of(base)
    router = routing._Router(arch, base, donors, set())

    def direct(text: str, n: int = 6):
        """The donor whose plain forward the row runs as, else None."""
        choice = router.choose(parse_spec(text).resolve(arch, n, {"FE": [1]}), n)
        return choice.carrier if choice.kind == "plain" else None

    assert direct(SFT) == "sft"
    assert direct("ALL:all:all@task; head=donor@task") == "task"
    assert direct("ALL:all:all") is None  # the base's head
    assert direct("ALL:all:all@task; head=donor") is None  # head from another donor
    assert direct("ALL:all:all; LT:0:q@task; head=donor") is None
    assert direct("FE^C:all:all; head=donor") is None
    assert direct("ALL:all:all; head=donor; protocol=paper") is None  # no pos_embed
