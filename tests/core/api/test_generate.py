"""graft.generate (graft.core.api.generate): grafting nothing is the base's own greedy generation
token for token, everything grafted with the donor's head is the donor's, and a graft on a
growing text is the graft of that text at every step."""

from __future__ import annotations

import pytest
import torch

import graft
from graft.core.api.generate import generate
from graft.core.api.texts import _rows, graft_texts
from graft.core.language.spec import parse_spec
from graft.errors import SpecError
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
    with pytest.raises(SpecError, match="continues one prompt"):
        generate(base, donor, tok, [TEXT, TEXT], "none")
