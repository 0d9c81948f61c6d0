"""graft.core.api.decoding: the key/value cache of graft.generate gives, step by step, the
recompute path's logits, recomputing only the positions whose graft changed; generation with
it is token-identical to generation without it on every tiny family."""

from __future__ import annotations

import pytest
import torch

from graft.core.api.decoding import CachedSteps, RecomputeSteps, first_change, signatures
from graft.core.api.generate import generate
from graft.core.api.texts import _rows
from graft.core.families.arch import architecture_of
from graft.core.language.spec import parse_spec
from graft.core.planning.plan import GraftRow, resolve_rows
from graft.models import tiny_tokenizer
from graft.models.tiny import TINY_FAMILIES
from tests.fast_tier import slow_except

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = [
    "Keanu Reeves starred in a movie with",
    "Tom Hanks was in",
    "In a film, the actress Meryl Streep starred with the great",
]
FIELDS = [{"FE": "Keanu Reeves"}, {"FE": "Tom Hanks"}, {"FE": "Meryl Streep"}]
#: graft -> positions a step runs after the prompt (module docstring of decoding)
WINDOWS = {
    "none": 1,
    "FE:all:all": 1,
    "ALL:1:mlp": 1,
    "ALL:all:all; head=donor": 1,
    "LT:all:all": 2,
    "FE+LT:all:o,ffn": 2,
    "(FE+LT)^C:all:all": 2,
    "-2:all:all": 3,
}
STEPS = 5


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _rows_of(tok, spec: str) -> list[GraftRow]:
    return _rows(tok, TEXTS, [parse_spec(spec)], FIELDS)


@pytest.mark.parametrize("spec", list(WINDOWS))
def test_cached_steps_give_the_recomputed_logits_and_run_only_their_window(tiny_pairs, tok, spec):
    base, donor = tiny_pairs("llama")
    rows = _rows_of(tok, spec)
    cached = CachedSteps(base, {"sft": donor}, rows, pad_id=None)
    again = RecomputeSteps(base, {"sft": donor}, rows, pad_id=None)
    width = max(len(r.input_ids) for r in rows)
    for step in range(STEPS):
        want, got = again.logits(), cached.logits()
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
        tokens = want.argmax(-1).tolist()
        again.extend(tokens)
        cached.extend(tokens)
        assert cached.positions_run == width + step * WINDOWS[spec]


def test_a_graft_changes_the_logits_the_cache_must_reproduce(tiny_pairs, tok):
    """The check above could not fail if the graft changed nothing: here it does."""
    base, donor = tiny_pairs("llama")
    plain = CachedSteps(base, {"sft": donor}, _rows_of(tok, "none"), pad_id=None).logits()
    for spec in ("FE:all:all", "LT:all:all", "-2:all:all"):
        grafted = CachedSteps(base, {"sft": donor}, _rows_of(tok, spec), pad_id=None).logits()
        assert (grafted - plain).abs().max() > 1e-3


def test_rows_that_stop_leave_the_batch_and_the_rest_go_on(tiny_pairs, tok):
    base, donor = tiny_pairs("gemma2")  # sliding-window layers
    rows = _rows(tok, TEXTS, [parse_spec("LT:all:all")], FIELDS)
    cached = CachedSteps(base, {"sft": donor}, rows, pad_id=None)
    again = RecomputeSteps(base, {"sft": donor}, rows, pad_id=None)
    keep = [[0, 1, 2], [0, 2], [0], [0]]  # the longest prompt (2) stops after two steps
    for index in keep:
        cached.keep(index)
        again.keep(index)
        want = again.logits()
        torch.testing.assert_close(cached.logits(), want, atol=2e-5, rtol=0)
        tokens = want.argmax(-1).tolist()
        cached.extend(tokens)
        again.extend(tokens)
    assert cached.cached == len(cached.ids[0]) - 1  # the longest prompt's padding left the cache


def test_signatures_change_where_the_graft_moves(tiny_pairs, tok):
    base, _ = tiny_pairs("llama")
    arch = architecture_of(base)
    row = _rows_of(tok, "FE+LT:all:all")[0]
    n = len(row.input_ids)

    def sig(length: int):
        grown = GraftRow(list(row.input_ids) + [5] * (length - n), row.spans, row.spec)
        return signatures(resolve_rows(arch, [grown], ["sft"])[0], length)

    before, now = sig(n), sig(n + 1)
    assert first_change(before, now) == n - 1  # the old LT is now ungrafted
    assert before[n - 1] and not now[n - 1] and now[n]
    assert first_change(before, before) == n


@pytest.mark.parametrize("family", slow_except(TINY_FAMILIES, "llama"))
def test_cached_generation_is_token_identical_to_recomputing(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    specs = list(WINDOWS)
    kwargs = dict(fields=FIELDS, max_new_tokens=8, stop_at_eos=False)
    cached = generate(base, {"sft": donor}, tok, TEXTS, specs, **kwargs)
    again = generate(base, {"sft": donor}, tok, TEXTS, specs, cache=False, **kwargs)
    assert [g.new_ids for g in cached] == [g.new_ids for g in again]
    assert all(g.cached for g in cached) and not any(g.cached for g in again)
    width = max(len(g.prompt_ids) for g in cached)
    assert (
        cached[0].positions_run[0] < again[0].positions_run[0] == sum(width + s for s in range(8))
    )
    # the same, step by step, in logits: all the grafts in one batch, each step's tokens fed
    rows = _rows(tok, TEXTS, [parse_spec(s) for s in specs], FIELDS)
    steps = CachedSteps(base, {"sft": donor}, rows, pad_id=None)
    recompute = RecomputeSteps(base, {"sft": donor}, rows, pad_id=None)
    moved = torch.zeros(len(rows), dtype=torch.bool)
    for _ in range(6):
        want = recompute.logits()
        torch.testing.assert_close(steps.logits(), want, atol=2e-5, rtol=0)
        base_rows = want.view(len(TEXTS), len(specs), -1)[:, :1]  # each prompt's "none"
        moved |= (want.view(len(TEXTS), len(specs), -1) - base_rows).abs().amax(-1).flatten() > 1e-4
        tokens = want.argmax(-1).tolist()
        steps.extend(tokens)
        recompute.extend(tokens)
    # every graft changed the logits of some prompt (gemma3's sliding windows keep FE from
    # reaching the newest token of the longer ones)
    assert moved.view(len(TEXTS), len(specs))[:, 1:].any(0).all()
