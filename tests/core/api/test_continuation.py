"""Whole-continuation scoring: positions on continuation rows, the invariants, the
token-by-token reference, and exact match against an actual greedy generation."""

from __future__ import annotations

import pytest
import torch

from graft.core.api.continuation import continuation_rows, score_continuations
from graft.core.api.texts import score_targets
from graft.core.execution.engine import GraftRow, run_grafts
from graft.core.families.arch import architecture_of
from graft.core.language.selectors import parse_positions, position_set
from graft.core.language.spec import SpecError, parse_spec
from graft.models import tiny_tokenizer
from graft.models.tiny import tiny_model
from graft.remote.config import RemoteConfig
from graft.remote.executor import RemoteExecutor
from tests.reference import component_names, reference_last_logits

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-5
SPANS = {"FE": [1, 2]}
PROMPT = [1, 40, 41, 42, 43, 44, 45]  # 7 tokens
NAME = [50, 51, 52, 53]  # 4 tokens


def positions(expr: str, length: int, prompt_length: int | None) -> list[int]:
    return sorted(position_set(parse_positions(expr), length, SPANS, expr, prompt_length))


# ------------------------------------------------------------------ where positions land


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("LT", [4, 5, 6]),  # the last prompt token and every continuation position
        ("ALL", list(range(7))),
        ("FE", [1, 2]),  # spans stay on the prompt
        ("FE+LT", [1, 2, 4, 5, 6]),
        ("FE^C", [0, 3, 4, 5, 6]),  # complements cover the continuation
        ("LT^C", [0, 1, 2, 3]),
        ("(FE+LT)^C", [0, 3]),
        ("-1", [4]),  # indices count on the prompt: -1 is its last token
        ("0..1", [0, 1]),
        ("-2..-1", [3, 4]),
    ],
)
def test_positions_on_a_continuation_row(expr, expected):
    assert positions(expr, 7, 5) == expected


@pytest.mark.parametrize("expr", ["LT", "ALL", "FE^C", "(FE+LT)^C", "-1", "0..2"])
def test_prompt_length_of_the_whole_row_changes_nothing(expr):
    assert positions(expr, 7, 7) == positions(expr, 7, None)


def test_a_set_and_its_complement_cover_the_row():
    for expr in ["LT", "FE", "FE+LT", "-1"]:
        both = set(positions(expr, 9, 5)) | set(positions(f"({expr})^C", 9, 5))
        assert both == set(range(9))


@pytest.mark.parametrize(
    ("expr", "prompt_length", "message"),
    [
        ("FE", 2, r"span 'FE' has positions \[2\] outside 0..1"),
        ("5", 5, "out of range for a prompt of 5 tokens"),
        ("-6", 5, "out of range for a prompt of 5 tokens"),
        ("LT", 0, "prompt_length 0 must be between 1 and the row's 7 tokens"),
        ("LT", 8, "prompt_length 8 must be between 1 and the row's 7 tokens"),
    ],
)
def test_positions_refused_outside_the_prompt(expr, prompt_length, message):
    with pytest.raises(SpecError, match=message):
        positions(expr, 7, prompt_length)


def test_continuation_rows():
    row = GraftRow(PROMPT, SPANS, parse_spec("LT:all:all"))
    rows, targets, where = continuation_rows([row], [NAME])
    assert [list(r.input_ids) for r in rows] == [PROMPT + NAME[:j] for j in range(4)]
    assert [r.prompt_length for r in rows] == [7] * 4
    assert targets == NAME and where == [(0, j) for j in range(4)]
    assert continuation_rows([row], [NAME], start=1)[1] == NAME[1:]


@pytest.mark.parametrize(
    ("rows", "continuations", "message"),
    [
        ([GraftRow(PROMPT)], [[]], "the continuation has no tokens"),
        ([GraftRow(PROMPT)], [NAME, NAME], "2 continuations for 1 rows"),
        ([GraftRow(PROMPT, prompt_length=3)], [NAME], "already has a continuation"),
    ],
)
def test_continuation_rows_refuse_bad_input(rows, continuations, message):
    with pytest.raises(SpecError, match=message):
        continuation_rows(rows, continuations)


# ------------------------------------------------------------------------- invariants


def own_scoring(model, ids: list[int], prompt_length: int) -> torch.Tensor:
    """The model's own teacher-forced log-probabilities of ids[prompt_length:]."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    logprobs = torch.log_softmax(logits.double(), -1)
    steps = torch.arange(prompt_length - 1, len(ids) - 1)
    return logprobs[steps, torch.tensor(ids[prompt_length:])]


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma3"])
def test_nothing_is_the_base_and_all_with_donor_head_is_the_donor(tiny_pairs, family):
    base, donor = tiny_pairs(family)
    rows = [
        GraftRow(PROMPT, SPANS, parse_spec("none")),
        GraftRow(PROMPT[:5], {"FE": [1]}, parse_spec("ALL:all:all; head=donor")),
    ]
    names = [NAME, NAME[:3]]
    scores = score_continuations(base, {"sft": donor}, rows, names, batch_size=3)
    want = [own_scoring(base, PROMPT + NAME, 7), own_scoring(donor, PROMPT[:5] + NAME[:3], 5)]
    for i, expected in enumerate(want):
        m = len(expected)
        assert int(scores["tokens"][i]) == m
        assert torch.allclose(scores["step_logprobs"][i, :m], expected, atol=TOL, rtol=0)
        assert torch.isnan(scores["step_logprobs"][i, m:]).all()
        assert abs(float(scores["logprob"][i]) - float(expected.sum())) <= m * TOL


def test_all_with_donor_head_is_the_donor_on_the_grafting_path(tiny_pairs):
    """Locally such a row runs as the donor's own forward; the simulated remote executor
    grafts every cell instead, so ALL must cover the continuation for this to hold."""
    base, donor = tiny_pairs("llama")
    row = GraftRow(PROMPT, SPANS, parse_spec("ALL:all:all; head=donor"))
    simulate = RemoteExecutor(RemoteConfig(mode="simulate"))
    scores = score_continuations(base, {"sft": donor}, [row], [NAME], executor=simulate)
    expected = own_scoring(donor, PROMPT + NAME, 7)
    assert torch.allclose(scores["step_logprobs"][0], expected, atol=TOL, rtol=0)


def test_float64_nothing_is_the_base_within_1e_10(tiny_pairs):
    base, _ = tiny_pairs("llama")
    base64 = base.double()
    try:
        scores = score_continuations(base64, {}, [GraftRow(PROMPT)], [NAME])
        expected = own_scoring(base64, PROMPT + NAME, 7)
        assert scores["step_logprobs"].dtype == torch.float64
        assert torch.allclose(scores["step_logprobs"][0], expected, atol=1e-10, rtol=0)
    finally:
        base.float()


# -------------------------------------------------------- the token-by-token reference


def hand_cells(model, positions_: list[int]) -> dict:
    """Every (layer, component) cell at ``positions_`` from the donor, built from the
    reference's own component table (not from graft's spec resolution)."""
    embeddings, layer_components = component_names(model)
    cells = {(-1, c): dict.fromkeys(positions_, "sft") for c in embeddings}
    for layer in range(model.config.num_hidden_layers):
        for c in layer_components:
            cells[layer, c] = dict.fromkeys(positions_, "sft")
    return cells


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2"])
@pytest.mark.parametrize(
    ("spec", "where"),
    [
        # LT follows the prediction position: the last prompt token and every name token
        # read so far
        ("LT:all:all", lambda p, n: list(range(p - 1, n))),
        ("FE:all:all", lambda p, n: SPANS["FE"]),
        ("(FE+LT)^C:all:all", lambda p, n: [t for t in range(p - 1) if t not in SPANS["FE"]]),
    ],
)
def test_each_step_matches_the_token_by_token_weight_swap(tiny_pairs, family, spec, where):
    base, donor = tiny_pairs(family)
    row = GraftRow(PROMPT, SPANS, parse_spec(spec))
    scores = score_continuations(base, {"sft": donor}, [row], [NAME], batch_size=2)
    p = len(PROMPT)
    for j, target in enumerate(NAME):
        ids = PROMPT + NAME[:j]
        logits = reference_last_logits(
            base, {"sft": donor}, ids, hand_cells(base, where(p, len(ids)))
        )
        logprobs = torch.log_softmax(logits.double(), -1)
        assert abs(float(scores["step_logprobs"][0, j]) - float(logprobs[target])) <= TOL
        assert int(scores["step_ranks"][0, j]) == int((logits > logits[target]).sum())


def test_rows_differing_only_in_prompt_length_are_not_confused(tiny_pairs):
    """Rows of one spec, length and spans share a cached layout; the prompt length must be
    part of that key, or the second row would take the first one's LT."""
    base, donor = tiny_pairs("llama")
    spec = parse_spec("LT:all:all")
    ids = PROMPT + NAME
    a, b = GraftRow(ids, SPANS, spec, 7), GraftRow(ids, SPANS, spec, 9)
    together = run_grafts(base, {"sft": donor}, [a, b], batch_size=1)
    alone = torch.cat([run_grafts(base, {"sft": donor}, [r]) for r in (a, b)])
    assert torch.equal(together, alone)
    assert not torch.allclose(together[0], together[1])


# ----------------------------------------------------------- exact match = greedy decoding


def greedy(model, prompt: list[int], steps: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def grafted_greedy(base, donor, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding under LT:all:all, token by token with the reference: the donor's
    weights at the last prompt token and at every generated token."""
    ids = list(prompt)
    for _ in range(steps):
        cells = hand_cells(base, list(range(len(prompt) - 1, len(ids))))
        ids.append(int(reference_last_logits(base, {"sft": donor}, ids, cells).argmax()))
    return ids[len(prompt) :]


def test_exact_match_is_an_actual_greedy_generation(tiny_pairs):
    base, donor = tiny_pairs("llama")
    generated = greedy(base, PROMPT, 5)
    wrong_last = generated[:-1] + [(generated[-1] + 1) % 96]
    wrong_second = generated[:1] + [(generated[1] + 1) % 96] + generated[2:]
    rows = [GraftRow(PROMPT, SPANS, parse_spec("none"))] * 3
    scores = score_continuations(base, {}, rows, [generated, wrong_last, wrong_second])
    assert scores["exact"].tolist() == [True, False, False]
    assert (scores["step_ranks"][0] == 0).all()
    assert scores["step_ranks"][1, :4].eq(0).all() and scores["step_ranks"][1, 4] > 0
    assert scores["step_ranks"][2, 1] > 0


def test_exact_match_under_a_graft_is_the_grafted_greedy_generation(tiny_pairs):
    base, _ = tiny_pairs("llama")
    donor = tiny_model("llama", seed=11)  # far from the base, so the continuation changes
    grafted = grafted_greedy(base, donor, PROMPT, 4)
    plain = greedy(base, PROMPT, 4)
    assert grafted != plain  # the graft changes the continuation: a real test
    row = GraftRow(PROMPT, SPANS, parse_spec("LT:all:all"))
    scores = score_continuations(base, {"sft": donor}, [row, row], [grafted, plain])
    assert scores["exact"].tolist() == [True, False]


def test_first_step_given_is_not_run_again(tiny_pairs):
    base, donor = tiny_pairs("llama")
    row = GraftRow(PROMPT, SPANS, parse_spec("FE+LT:all:all"))
    full = score_continuations(base, {"sft": donor}, [row], [NAME])
    step0 = ([float(full["step_logprobs"][0, 0])], [int(full["step_ranks"][0, 0])])
    again = score_continuations(base, {"sft": donor}, [row], [NAME], first=step0)
    # the given step is taken as it is; the others run in a batch of 3 rows instead of 4,
    # whose kernels may round differently (seen with SSE4.2 kernels: 1 ulp at step 1), so
    # the contract is the engine's float32 bound, not bit-identity
    assert torch.equal(again["step_logprobs"][:, 0], full["step_logprobs"][:, 0])
    assert (again["step_logprobs"] - full["step_logprobs"]).abs().max() <= TOL
    assert (again["logprob"] - full["logprob"]).abs().max() <= TOL
    for key in ("exact", "step_ranks", "tokens"):
        assert torch.equal(full[key], again[key]), key
    marked = score_continuations(base, {"sft": donor}, [row], [NAME], first=([-99.0], [3]))
    assert float(marked["step_logprobs"][0, 0]) == -99.0 and not bool(marked["exact"][0])


# ------------------------------------------------------------------ the notebook API


def test_score_targets_on_texts(tiny_pairs):
    base, donor = tiny_pairs("llama")
    tok = tiny_tokenizer()
    texts = ["keanu reeves starred with", "tom hanks starred with"]
    specs = ["none", "FE+LT:all:all"]
    fields = [{"FE": "keanu reeves"}, {"FE": "tom hanks"}]
    out = score_targets(base, {"sft": donor}, tok, texts, specs, [" ann lee", " bo"], fields=fields)
    # character-level: " a", "n", "n", " l", "e", "e" and " b", "o"
    assert out["logprob"].shape == (2, 2) and out["step_logprobs"].shape == (2, 2, 6)
    assert out["tokens"].tolist() == [[6, 6], [2, 2]]
    prompt = tok(texts[0])["input_ids"]
    name = tok(texts[0] + " ann lee", add_special_tokens=False)["input_ids"][len(prompt) - 1 :]
    expected = own_scoring(base, prompt + name, len(prompt))
    assert torch.allclose(out["step_logprobs"][0, 0], expected, atol=TOL, rtol=0)
    one = score_targets(base, {"sft": donor}, tok, texts[1], specs[1], " bo", fields=fields[1])
    assert one["logprob"].shape == () and torch.equal(one["exact"], out["exact"][1, 1])


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ([" a"], "one target string per text"),
        ("", "adds no token"),
        ([3, 4], "targets must be strings"),
    ],
)
def test_score_targets_refuses_bad_targets(tiny_pairs, targets, message):
    base, donor = tiny_pairs("llama")
    with pytest.raises(SpecError, match=message):
        score_targets(base, donor, tiny_tokenizer(), ["ab", "cd"], "none", targets)


def test_resolve_with_a_prompt_length(tiny_pairs):
    """A continuation row resolves on the same cells as its spec says (no hidden extras)."""
    base, _ = tiny_pairs("llama")
    arch = architecture_of(base)
    res = parse_spec("LT:all:o").resolve(arch, 9, SPANS, prompt_length=6)
    assert set(res.cells) == {(layer, "o") for layer in range(arch.n_layers)}
    assert all(sorted(cell) == [5, 6, 7, 8] for cell in res.cells.values())
