"""Graft spec: parsing, printing, JSON round trips, resolution and every error."""

from __future__ import annotations

import pytest

from graft.core.families.arch import architecture_of
from graft.core.language.selectors import (
    format_positions,
    layer_group,
    layer_list,
    paper_layer_group,
    parse_layers,
    parse_positions,
    position_set,
    span_names,
)
from graft.core.language.spec import DEFAULT_DONOR, GraftSpec, Rule, SpecError, parse_spec


@pytest.fixture(scope="module")
def arch_llama(tiny_pairs):
    return architecture_of(tiny_pairs("llama")[0])


@pytest.fixture(scope="module")
def arch_gpt2(tiny_pairs):
    return architecture_of(tiny_pairs("gpt2")[0])


ROUND_TRIP = [
    "none",
    "FE:all:all",
    "FE+LT:all:all",
    "(FE+LT)^C:all:all",
    "FE^C:all:all",
    "LT:q4:o,ffn",
    "LT:4/4:o,ffn_up",
    "FE:all:all@task; LT:h2:o,ffn@relation",
    "ALL:all:all; head=donor",
    "ALL:all:all@task; head=donor@task",
    "LT:all:embed; head=paper",
    "0+-1:0,2:q",
    "2..4:1-3:attn",
    "M+R:e8:block",
    "LT:q4:o,ffn; protocol=paper",
    "FE+LT:all:all; head=paper; protocol=paper",
    "FE[-1]:all:all",
    "FE[:-1]+LT:0-2:o",
    "(FE[1:]+M[0])^C:all:block@pre",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_text_and_json_round_trip(text):
    spec = parse_spec(text)
    assert str(spec) == text
    assert parse_spec(str(spec)) == spec
    assert GraftSpec.from_json(spec.to_json()) == spec


def test_whitespace_and_canonical_form():
    assert str(parse_spec(" FE + LT : all : o , ffn ")) == "FE+LT:all:o,ffn"
    assert str(parse_spec("head=base; LT:all:o")) == "LT:all:o"


def test_layer_groups_cover_any_depth():
    for n_layers in range(1, 50):
        for n in (2, 4, 8):
            groups = [layer_group(k, n, n_layers) for k in range(1, n + 1)]
            assert sum(groups, []) == list(range(n_layers))
            if n_layers >= n:
                assert all(groups), (n_layers, n)
    # the paper's gpt2-xl (48 layers) and Llama-3.2-1B (16 layers)
    assert layer_group(4, 4, 48) == list(range(36, 48))
    assert layer_group(8, 8, 16) == [14, 15]
    assert layer_group(2, 2, 30) == list(range(15, 30))


def _paper_groups(n: int, n_layers: int) -> list[tuple[int, int]]:
    """(first, last) layer of each of the n groups by the paper's rule."""
    groups = [paper_layer_group(k, n, n_layers) for k in range(1, n + 1)]
    return [(g[0], g[-1]) for g in groups]


def test_paper_layer_rule_gives_the_documented_groups():
    # docs/reference/paper_protocol.md (c): SmolLM2 (30 layers) and Gemma (18 layers)
    assert _paper_groups(4, 30) == [(0, 6), (7, 13), (14, 20), (21, 29)]
    assert _paper_groups(2, 30) == [(0, 13), (14, 29)]
    assert _paper_groups(4, 18) == [(0, 3), (4, 7), (8, 11), (12, 17)]
    assert _paper_groups(2, 18) == [(0, 7), (8, 17)]
    # where 4 divides L the two rules agree
    for n in (2, 4):
        for k in range(1, n + 1):
            assert paper_layer_group(k, n, 48) == layer_group(k, n, 48)
    # graft's rule differs on 30 layers: its q2..q4 are 7-14, 15-21, 22-29
    assert [(g[0], g[-1]) for g in (layer_group(k, 4, 30) for k in (2, 3, 4))] == [
        (7, 14),
        (15, 21),
        (22, 29),
    ]


def test_paper_layer_rule_in_a_spec(arch_llama):
    n_layers = arch_llama.n_layers
    items = parse_layers("h2")
    q = n_layers // 4
    assert layer_list(items, n_layers, "h2", "paper") == list(range(2 * q, n_layers))
    assert Rule("LT", "q4", ("o",)).layer_list(30, "paper") == list(range(21, 30))
    assert Rule("LT", "q4", ("o",)).layer_list(30) == list(range(22, 30))
    # the spec's protocol reaches the resolution
    res = parse_spec("LT:q2:o; protocol=paper").resolve(arch_llama, 4, {})
    assert sorted(layer for layer, _ in res.cells) == list(range(q, 2 * q))
    # "last half" is the paper's third and fourth quarters
    assert layer_list(parse_layers("q3,q4"), 30, "q3,q4", "paper") == layer_list(
        parse_layers("h2"), 30, "h2", "paper"
    )


@pytest.mark.parametrize("layers", ["e1", "e8", "3/8", "1/3"])
def test_paper_layer_rule_refuses_eighths_and_other_groups(layers):
    with pytest.raises(SpecError, match="halves and quarters only"):
        layer_list(parse_layers(layers), 30, layers, "paper")
    assert layer_list(parse_layers(layers), 30, layers)  # graft's rule has them


def test_paper_protocol_all_leaves_out_the_position_embedding(arch_gpt2, arch_llama):
    ours = parse_spec("FE:all:all").resolve(arch_gpt2, 4, {"FE": [1]})
    paper = parse_spec("FE:all:all; protocol=paper").resolve(arch_gpt2, 4, {"FE": [1]})
    assert (-1, "pos_embed") in ours.cells and (-1, "pos_embed") not in paper.cells
    assert set(ours.cells) - set(paper.cells) == {(-1, "pos_embed")}
    # pos_embed stays graftable by name under the paper protocol
    named = parse_spec("FE:all:pos_embed; protocol=paper").resolve(arch_gpt2, 4, {"FE": [1]})
    assert set(named.cells) == {(-1, "pos_embed")}
    # families without a learned position embedding: the same cells either way
    llama = [
        parse_spec(t).resolve(arch_llama, 4, {"FE": [1]}).cells
        for t in ("FE:all:all", "FE:all:all; protocol=paper")
    ]
    assert llama[0] == llama[1]


def test_unknown_protocol_is_a_one_line_error():
    with pytest.raises(SpecError, match="protocol must be graft or paper"):
        parse_spec("LT:all:o; protocol=ours")
    with pytest.raises(SpecError, match="layer rule 'x' unknown"):
        layer_list(parse_layers("q1"), 8, "q1", "x")


def test_positions_resolution(arch_llama):
    spans = {"FE": [1, 2], "M": [5, 6]}
    n = 8

    def cells(text):
        res = parse_spec(text).resolve(arch_llama, n, spans)
        return sorted(res.cells[(0, "q")])

    assert cells("FE:0:q") == [1, 2]
    assert cells("LT:0:q") == [7]
    assert cells("FE+LT:0:q") == [1, 2, 7]
    assert cells("(FE+LT)^C:0:q") == [0, 3, 4, 5, 6]
    assert cells("FE^C:0:q") == [0, 3, 4, 5, 6, 7]
    assert cells("ALL:0:q") == list(range(8))
    assert cells("-2:0:q") == [6]
    assert cells("1..3+M:0:q") == [1, 2, 3, 5, 6]
    # a span's part, by Python indexing over its tokens
    assert cells("FE[-1]:0:q") == [2]
    assert cells("FE[0]:0:q") == [1]
    assert cells("FE[:-1]+M[1:]:0:q") == [1, 6]
    assert cells("(FE[-1]+LT)^C:0:q") == [0, 1, 3, 4, 5, 6]


def test_components_layers_and_embeddings(arch_llama, arch_gpt2):
    res = parse_spec("LT:q4:o,ffn").resolve(arch_llama, 5, {})
    assert set(res.cells) == {(3, c) for c in ("o", "gate", "up", "down")}
    res = parse_spec("LT:q4:o,ffn").resolve(arch_gpt2, 5, {})
    assert set(res.cells) == {(3, c) for c in ("o", "up", "down")}  # GPT-2 has no gate
    res = parse_spec("LT:0:all").resolve(arch_gpt2, 5, {})
    assert (-1, "embed") in res.cells and (-1, "pos_embed") in res.cells
    assert {c for (layer, c) in res.cells if layer == 0} == {
        "ln_1",
        "q",
        "k",
        "v",
        "o",
        "ln_2",
        "up",
        "down",
    }
    res = parse_spec("LT:1:norms").resolve(arch_llama, 5, {})
    assert set(res.cells) == {(1, "ln_1"), (1, "ln_2")}


def test_later_rule_wins_and_donors(arch_llama):
    spec = parse_spec("ALL:all:o@task; LT:3:o@relation")
    res = spec.resolve(arch_llama, 4, {})
    assert res.cells[(3, "o")] == {0: "task", 1: "task", 2: "task", 3: "relation"}
    assert res.cells[(2, "o")][3] == "task"
    assert spec.donors() == {"task", "relation"}
    assert res.donors() == {"task", "relation"}


def test_head_policies(arch_llama, arch_gpt2):
    assert parse_spec("LT:all:all").resolve(arch_gpt2, 4, {}).unembed_donor is None
    res = parse_spec("LT:all:all; head=donor").resolve(arch_gpt2, 4, {})
    assert (res.final_norm_donor, res.unembed_donor) == ("sft", "sft")
    # paper: a tied embedding grafted at the last token also swaps the unembedding
    res = parse_spec("LT:all:all; head=paper").resolve(arch_gpt2, 4, {})
    assert (res.final_norm_donor, res.unembed_donor) == (None, "sft")
    res = parse_spec("FE:all:all; head=paper").resolve(arch_gpt2, 4, {"FE": [1]})
    assert res.unembed_donor is None
    # untied llama: the paper's routine does not touch the unembedding
    assert not arch_llama.tied_embeddings
    assert parse_spec("LT:all:all; head=paper").resolve(arch_llama, 4, {}).unembed_donor is None


BAD_SPECS = [
    ("FE:all", "three ':'-separated fields"),
    ("FE:all:wobble", "unknown component 'wobble'"),
    ("FE:all:", "no components named"),
    ("FE:x9:o", "layer selector 'x9'"),
    ("FE:q5:o", "layer group 'q5' in 'q5': q1..q4"),
    ("FE:5/4:o", "layer group '5/4' in '5/4': need 1 <= k <= n in k/n"),
    ("FE:0/2:o", "need 1 <= k <= n in k/n"),
    ("FE:3-1:o", "reversed"),
    ("FE:all:o@2bad", "donor name"),
    ("(FE+LT:all:o", "missing ')'"),
    ("FE+:all:o", "ends early"),
    ("FE$:all:o", "unexpected '$'"),
    ("ALL:all:all; head=teacher", "head policy"),
    (":all:o", "empty position selector"),
    ("FE::o", "empty layer field"),
    ("FE[]:all:o", "not a span part"),
    ("FE[x]:all:o", "not a span part"),
    ("FE[1:2:3]:all:o", "not a span part"),
    ("LT:all:all;", "drop the stray ';'"),  # was accepted silently
    ("LT:all:all;; FE:all:o", "drop the stray ';'"),
    ("; LT:all:all", "drop the stray ';'"),
    ("LT:all:all; protocol=paper; protocol=graft", "protocol= given twice"),
    ("LT:all:all; head=donor; head=base", "head= given twice"),
    ("", "empty spec"),  # would run the base alone under a name that says otherwise
    ("  ", "empty spec"),
]


@pytest.mark.parametrize(("text", "message"), BAD_SPECS)
def test_invalid_specs_name_the_bad_part(text, message):
    with pytest.raises(SpecError, match=None) as info:
        parse_spec(text)
    assert message in str(info.value)


BAD_RESOLUTIONS = [
    ("LT:all:gate", "gpt2", {}, "does not exist in the gpt2 family"),
    ("LT:all:q_norm", "gpt2", {}, "does not exist in the gpt2 family"),
    ("LT:9:o", "gpt2", {}, "layer 9"),
    ("LT:2-9:o", "gpt2", {}, "layer range 2-9"),
    ("LT:e7:o", "gpt2", {}, "empty for a model with 4 layers"),
    ("FE:all:o", "gpt2", {}, "not a span of this prompt"),
    ("FE:all:o", "gpt2", {"FE": []}, "is empty"),
    ("12:all:o", "gpt2", {}, "out of range"),
    ("FE[:-1]:all:o", "gpt2", {"FE": [2]}, "span FE[:-1] in 'FE[:-1]' is empty for this prompt"),
    ("FE[3]:all:o", "gpt2", {"FE": [1, 2]}, "(2 token(s) in FE)"),
]


@pytest.mark.parametrize(("text", "family", "spans", "message"), BAD_RESOLUTIONS)
def test_invalid_resolutions_name_the_bad_part(tiny_pairs, text, family, spans, message):
    arch = architecture_of(tiny_pairs(family)[0])
    with pytest.raises(SpecError) as info:
        parse_spec(text).resolve(arch, 6, spans)
    assert message in str(info.value)


def test_rule_is_validated_on_construction():
    with pytest.raises(SpecError):
        Rule("FE", "all", ())
    with pytest.raises(SpecError):
        GraftSpec(head="weird")


def test_span_names():
    assert parse_spec("(FE+LT)^C:all:all; M+2:0:o").span_names() == {"FE", "M"}
    assert parse_spec("none").span_names() == set()
    assert parse_spec("FE[-1]+M[:2]:all:o").span_names() == {"FE", "M"}


def test_selectors_on_their_own():
    """The position and layer grammar works without a spec around it."""
    expr = parse_positions(" ( FE + LT ) ^C + 0..1 ")
    assert format_positions(expr) == "(FE+LT)^C+0..1"
    assert span_names(expr) == {"FE"}
    assert position_set(expr, 6, {"FE": [2, 3]}, "text") == {0, 1, 4}
    assert layer_list(parse_layers("q1,-1"), 8, "q1,-1") == [0, 1, 7]


def test_json_without_donors_takes_the_default_donor():
    spec = GraftSpec.from_dict(
        {"head": "donor", "rules": [{"positions": "LT", "layers": "all", "components": ["o"]}]}
    )
    assert spec.rules[0].donor == DEFAULT_DONOR == "sft"
    assert spec.head_donor == DEFAULT_DONOR


@pytest.mark.parametrize(
    "text",
    [
        "LT:" + "9" * 5000 + ":all",
        f"({'9' * 5000}):all:all",
        "FE[" + "9" * 5000 + "]:all:all",
        "LT:1-" + "9" * 19 + ":all",
    ],
)
def test_a_number_too_long_is_a_spec_error_not_a_value_error(text):
    """Python's int() refuses 4,300 digits with a bare ValueError, which GraftError no longer
    is: the parser refuses such numbers itself."""
    with pytest.raises(SpecError, match="digits; give a (position|layer) of at most 18"):
        parse_spec(text)


def test_a_spec_equals_the_text_that_means_the_same():
    spec = parse_spec("FE+LT:all:o,ffn; head=donor", name="mine")
    assert spec == " FE + LT : all : o , ffn ; head=donor"  # the name aside
    assert spec != "FE+LT:all:o,ffn"
    assert spec != "FE+LT:all:o,ffn; head=donor;"  # a text that is no spec is unequal
    assert spec != 3
    assert hash(spec) == hash(parse_spec("FE+LT:all:o,ffn; head=donor"))
