"""graft.generate (graft.core.api.generate): grafting nothing is the base's own greedy generation
token for token, everything grafted with the donor's head is the donor's, and a graft on a
growing text is the graft of that text at every step."""

from __future__ import annotations

import copy

import pytest
import torch

import graft
from graft.core.api.generate import generate
from graft.core.api.texts import _rows, graft_texts
from graft.core.execution.executor import LocalExecutor
from graft.core.language.spec import parse_spec
from graft.errors import SlowPathWarning, SpecError
from graft.models import tiny_tokenizer
from graft.models.tiny import TINY_FAMILIES

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "Keanu Reeves starred in a movie with"
FIELDS = {"FE": "Keanu Reeves"}
N = 6


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def hf_greedy(model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=N,
            min_new_tokens=N,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_nothing_is_the_base_and_everything_the_donor(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    got = generate(
        base,
        {"sft": donor},
        tok,
        TEXT,
        ["none", "ALL:all:all; head=donor"],
        fields=FIELDS,
        max_new_tokens=N,
        stop_at_eos=False,
    )
    assert got.new_ids[0] == hf_greedy(base, got.prompt_ids)
    assert got.new_ids[1] == hf_greedy(donor, got.prompt_ids)
    assert got.texts[0] == tok.decode(got.new_ids[0])


def test_each_step_is_the_graft_of_the_grown_text(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    spec = "FE+LT:all:all"
    got = generate(
        base, {"sft": donor}, tok, TEXT, spec, fields=FIELDS, max_new_tokens=3, stop_at_eos=False
    )
    ids = list(got.prompt_ids)
    spans = _rows(tok, [TEXT], [parse_spec(spec)], [FIELDS])[0].spans
    for new in got.new_ids[0]:
        row = graft.GraftRow(ids, spans, spec)
        logits = graft.run_grafts(base, {"sft": donor}, [row])
        assert int(logits[0].argmax()) == new
        ids.append(new)
    # the first step is graft_texts' last-position readout of the prompt
    first = graft_texts(base, {"sft": donor}, tok, TEXT, spec, fields=FIELDS)
    assert int(first.argmax()) == got.new_ids[0][0]


def test_sampling_is_seeded(tiny_pairs, tok):
    base, donor = tiny_pairs("gpt2")
    kwargs = dict(fields=FIELDS, max_new_tokens=5, sample=True, temperature=2.0, stop_at_eos=False)
    a = generate(base, {"sft": donor}, tok, TEXT, "LT:all:all", seed=3, **kwargs)
    b = generate(base, {"sft": donor}, tok, TEXT, "LT:all:all", seed=3, **kwargs)
    c = generate(base, {"sft": donor}, tok, TEXT, "LT:all:all", seed=4, **kwargs)
    assert a.new_ids == b.new_ids and a.new_ids != c.new_ids


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"sample": True, "temperature": 0}, "temperature"),
    ],
)
def test_bad_generation_options_are_one_error(tiny_pairs, tok, kwargs, message):
    base, donor = tiny_pairs("llama")
    with pytest.raises(SpecError, match=message):
        generate(base, {"sft": donor}, tok, TEXT, "none", **kwargs)


def test_token_ids_generate_as_their_text(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    want = generate(base, donor, tok, TEXT, ["none", "LT:all:all"], max_new_tokens=3)
    for prompt in (tok(TEXT)["input_ids"], torch.tensor(tok(TEXT)["input_ids"])):
        got = generate(base, donor, tok, prompt, ["none", "LT:all:all"], max_new_tokens=3)
        assert got.prompt_ids == want.prompt_ids and got.new_ids == want.new_ids


TEXTS = [TEXT, "Tom Hanks was in", "In a film, the actress Meryl Streep starred with the great"]
ALL_FIELDS = [FIELDS, {"FE": "Tom Hanks"}, {"FE": "Meryl Streep"}]


def test_a_batch_of_prompts_is_each_prompt_alone(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    specs = ["none", "FE+LT:all:all"]
    kwargs = dict(max_new_tokens=4, stop_at_eos=False)
    together = generate(base, donor, tok, TEXTS, specs, fields=ALL_FIELDS, **kwargs)
    assert isinstance(together, list) and len(together) == len(TEXTS)
    assert len({len(g.prompt_ids) for g in together}) == len(TEXTS)  # lengths differ
    for text, fields, got in zip(TEXTS, ALL_FIELDS, together, strict=True):
        alone = generate(base, donor, tok, text, specs, fields=fields, **kwargs)
        assert got.prompt_ids == alone.prompt_ids and got.new_ids == alone.new_ids
        assert got.cached and got.fallback is None


def test_a_sampled_text_does_not_depend_on_the_rest_of_the_call(tiny_pairs, tok):
    base, donor = tiny_pairs("gpt2")
    kwargs = dict(max_new_tokens=6, sample=True, temperature=2.0, stop_at_eos=False, seed=5)
    alone = generate(base, donor, tok, TEXT, "LT:all:all", fields=FIELDS, **kwargs)
    crowd = generate(
        base,
        donor,
        tok,
        list(reversed(TEXTS)),
        ["none", "FE:all:all", "LT:all:all"],
        fields=list(reversed(ALL_FIELDS)),
        batch_size=4,
        **kwargs,
    )
    assert crowd[-1].new_ids[2] == alone.new_ids[0]
    # the rows draw apart: the same graft on another prompt, or another graft, another text
    assert len({tuple(g.new_ids[0]) for g in crowd} | {tuple(crowd[-1].new_ids[1])}) > 1


def test_top_k_one_and_a_tiny_top_p_are_greedy(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    kwargs = dict(fields=ALL_FIELDS, max_new_tokens=5, stop_at_eos=False)
    greedy = generate(base, donor, tok, TEXTS, ["none", "LT:all:all"], **kwargs)
    for option in ({"top_k": 1}, {"top_p": 1e-9}):
        got = generate(
            base,
            donor,
            tok,
            TEXTS,
            ["none", "LT:all:all"],
            sample=True,
            temperature=5.0,
            **option,
            **kwargs,
        )
        assert [g.new_ids for g in got] == [g.new_ids for g in greedy]
    hot = generate(
        base, donor, tok, TEXTS, ["none", "LT:all:all"], sample=True, temperature=5.0, **kwargs
    )
    assert [g.new_ids for g in hot] != [g.new_ids for g in greedy]  # sampling does sample


def test_top_k_draws_among_the_k_likeliest(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")

    def draw(seed: int) -> int:
        got = generate(
            base,
            donor,
            tok,
            TEXT,
            "FE:all:all",
            fields=FIELDS,
            max_new_tokens=1,
            sample=True,
            temperature=50.0,
            top_k=3,
            seed=seed,
        )
        return got.new_ids[0][0]

    first = graft_texts(base, donor, tok, TEXT, "FE:all:all", fields=FIELDS)
    assert draw(1) in first.topk(3).indices.tolist()
    draws = {draw(seed) for seed in range(12)}
    assert draws <= set(first.topk(3).indices.tolist()) and len(draws) > 1


class _Relay:
    """An executor that is not the local one (as a remote executor is not)."""

    def run(self, base, donors, plans):
        return LocalExecutor().run(base, donors, plans)


def test_an_executor_without_a_cache_falls_back_and_says_why(tiny_pairs, tok):
    base, donor = tiny_pairs("llama")
    kwargs = dict(fields=FIELDS, max_new_tokens=3, stop_at_eos=False)
    want = generate(base, donor, tok, TEXT, ["none", "LT:all:all"], **kwargs)
    with pytest.warns(SlowPathWarning, match="cache runs on this machine only"):
        got = generate(base, donor, tok, TEXT, ["none", "LT:all:all"], executor=_Relay(), **kwargs)
    assert got.new_ids == want.new_ids
    assert not got.cached and "_Relay" in (got.fallback or "")
    asked = generate(base, donor, tok, TEXT, "LT:all:all", cache=False, **kwargs)
    assert not asked.cached and asked.fallback is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sample": True, "top_k": -1}, "top_k must be an integer >= 0"),
        ({"sample": True, "top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"sample": True, "top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": 5}, "pass sample=True"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"max_new_tokens": 64}, "lower max_new_tokens"),
    ],
)
def test_bad_sampling_options_are_one_error(tiny_pairs, tok, kwargs, message):
    base, donor = tiny_pairs("llama")
    with pytest.raises(SpecError, match=message):
        generate(base, {"sft": donor}, tok, TEXT, "none", **kwargs)


@pytest.mark.parametrize("cache", [True, False])
def test_rows_stop_at_the_end_token_and_the_others_go_on(tiny_pairs, tok, cache):
    base, donor = tiny_pairs("llama")
    specs = ["none", "LT:all:all", "FE:all:all"]
    kwargs = dict(fields=ALL_FIELDS, max_new_tokens=6, cache=cache)
    free = generate(base, donor, tok, TEXTS, specs, stop_at_eos=False, **kwargs)
    end = free[2].new_ids[1][2]  # a token one row writes third: made the end token
    ending = copy.deepcopy(tok)
    ending.eos_token = tok.convert_ids_to_tokens(end)
    assert ending.eos_token_id == end
    got = generate(base, donor, ending, TEXTS, specs, stop_at_eos=True, **kwargs)
    stopped = 0
    for want, have in zip(free, got, strict=True):
        for ids, cut in zip(want.new_ids, have.new_ids, strict=True):
            n = ids.index(end) + 1 if end in ids else len(ids)
            assert cut == ids[:n]
            stopped += n < len(ids)
    assert stopped >= 1  # some row stopped early while others went on
