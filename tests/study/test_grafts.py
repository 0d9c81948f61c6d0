"""The named grafts of the paper's experiments (graft.study.specs.grafts): names, specs, layer windows."""

from __future__ import annotations

import pytest

from graft.core.language.spec import SpecError, parse_spec
from graft.errors import GraftError
from graft.study.specs.grafts import (
    COMPONENT_SETS,
    POSITIONS,
    component_grafts,
    hybrid_grafts,
    layer_windows,
    necessity_grafts,
    paper_token_graft,
    position_grafts,
    reference,
    spec_graft,
)


def texts(grafts) -> dict[str, str]:
    return {g.name: str(g.spec) for g in grafts}


def test_references():
    assert str(reference("PRE", None).spec) == "none"
    sft = reference("SFT", "sft").spec
    assert sft == parse_spec("ALL:all:all@sft; head=donor@sft")
    assert sft.donors() == {"sft"}
    assert reference("TASK", "task").spec.donors() == {"task"}


def test_position_grafts_cover_the_paper():
    grafts = position_grafts()
    assert [g.name for g in grafts] == ["PRE", "SFT", *POSITIONS]
    specs = texts(grafts)
    assert specs["FE+LT"] == "FE+LT:all:all"
    assert specs["(FE+LT)^C"] == "(FE+LT)^C:all:all"
    assert parse_spec(specs["M+LT"]).span_names() == {"M"}
    assert parse_spec(specs["FE+R"]).span_names() == {"FE", "R"}
    assert all(g.group == "" for g in grafts)


@pytest.mark.parametrize(
    ("policy", "suffix"), [("base", ""), ("donor", "; head=donor"), ("paper", "; head=paper")]
)
def test_head_policy_reaches_every_graft_but_the_references(policy, suffix):
    specs = texts(position_grafts(("FE", "LT"), policy))
    assert specs["FE"] == f"FE:all:all{suffix}"
    assert specs["PRE"] == "none" and specs["SFT"].endswith("head=donor")
    comps = texts(component_grafts("q4", policy))
    assert comps["O+FFN"] == f"LT:q4:o,ffn{suffix}"


def test_necessity_grafts_swap_the_roles():
    grafts = necessity_grafts(("FE", "LT"))
    assert [g.name for g in grafts] == ["SFT", "PRE", "FE", "LT"]
    assert grafts[0].spec.donors() == set()  # the base (SFT) alone
    assert grafts[1].spec.donors() == {"pre"}
    assert texts(grafts)["LT"] == "LT:all:all@pre"


def test_component_grafts():
    grafts = component_grafts("q4", group="reversal")
    assert [g.name for g in grafts] == ["PRE", "SFT", *COMPONENT_SETS]
    assert {g.group for g in grafts} == {"reversal"}
    specs = texts(grafts)
    assert specs["ATTN+O+FFN"] == "LT:q4:qkv,o,ffn"
    assert specs["O+FFN_down"] == "LT:q4:o,ffn_down"
    split = [g.name for g in component_grafts("h2", split_qkv=True)]
    assert split[-4:] == ["Q", "K", "V", "Q+K"]
    with pytest.raises(SpecError):
        component_grafts("q5")


def test_component_grafts_with_first_entity():
    grafts = component_grafts("q4", fe="all")
    assert [g.name for g in grafts] == ["PRE", "SFT", "FE all only", *COMPONENT_SETS]
    specs = texts(grafts)
    assert specs["FE all only"] == "FE:all:all"
    assert specs["O"] == "FE:all:all; LT:q4:o"
    assert all(specs[name].startswith("FE:all:all; ") for name in COMPONENT_SETS)
    with pytest.raises(SpecError, match="mpl"):
        component_grafts("q4", fe="mpl")


def test_hybrid_grafts():
    grafts = hybrid_grafts("h2")
    names = [g.name for g in grafts]
    assert names[:3] == ["PRE", "TASK", "RELATION"]
    assert names[3:] == [
        f"FE {v} + LT hybrid" for v in ("none", "all", "ATTN", "FFN", "O+FFN", "ATTN+O")
    ]
    specs = texts(grafts)
    lt = "LT:h2:qkv@task; LT:h2:o,ffn@relation"
    assert specs["FE none + LT hybrid"] == lt
    assert specs["FE O+FFN + LT hybrid"] == f"FE:all:o,ffn@task; {lt}"
    assert grafts[-1].spec.donors() == {"task", "relation"}
    assert texts(hybrid_grafts("q4", "donor"))["FE none + LT hybrid"].endswith(
        "head=donor@relation"
    )


@pytest.mark.parametrize(
    ("n_layers", "windows", "expected"),
    [
        (8, "halves", ["h1", "h2"]),
        (8, "quarters", ["q1", "q2", "q3", "q4"]),
        (16, "eighths", [f"e{k}" for k in range(1, 9)]),
        (4, "eighths", ["0", "1", "2", "3"]),  # fewer layers than windows: single layers
        (3, "single", ["0", "1", "2"]),
        (4, "2", ["0-1", "2-3"]),
        (5, "2", ["0-1", "2-3", "4-4"]),
        (4, "10", ["0-3"]),
    ],
)
def test_layer_windows(n_layers, windows, expected):
    got = layer_windows(n_layers, windows)
    assert got == expected
    covered = [i for w in got for i in parse_spec(f"LT:{w}:o").rules[0].layer_list(n_layers)]
    assert covered == list(range(n_layers))  # windows tile the layers, no gaps or overlaps


@pytest.mark.parametrize("windows", ["thirds", "0", "-2", "", "1.5"])
def test_layer_windows_rejects(windows):
    with pytest.raises(GraftError):
        layer_windows(8, windows)


@pytest.mark.parametrize(
    ("text", "name", "spec"),
    [
        ("LT:q4:o,ffn", "LT:q4:o,ffn", "LT:q4:o,ffn"),
        ("mine=FE:all:attn", "mine", "FE:all:attn"),
        (" mine = FE:all:attn@task; LT:h2:o ", "mine", "FE:all:attn@task; LT:h2:o"),
        ("LT:all:all; head=donor", "LT:all:all; head=donor", "LT:all:all; head=donor"),
        ("head=donor; ALL:all:all", "head=donor; ALL:all:all", "ALL:all:all; head=donor"),
        ("none; head=donor", "none; head=donor", "head=donor"),
    ],
)
def test_spec_graft(text, name, spec):
    graft = spec_graft(text)
    assert graft.name == name
    assert graft.spec == parse_spec(spec)


@pytest.mark.parametrize("text", ["garbage", "x=FE:all", "LT:all:mpl", "FE+:all:all"])
def test_spec_graft_rejects(text):
    with pytest.raises(SpecError):
        spec_graft(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty spec"),
        ("name=", "graft 'name': empty spec"),
        ("name=  ", "graft 'name': empty spec"),
        ("=FE:all:all", "the name before '=' is empty"),
    ],
)
def test_spec_graft_rejects_nameless_and_empty_grafts(text, message):
    """Both once ran a graft equal to PRE under another name."""
    with pytest.raises(SpecError, match=message):
        spec_graft(text)


@pytest.mark.parametrize(
    ("model", "positions", "nearest"),
    [
        ("gpt2-xl", "(FE+LT)^C", False),  # C.7.3, the paper's own model
        ("llama3.2-1b", "FE^C", False),  # C.7.1
        ("google/gemma-1.1-2b-it", "LT", False),  # C.7.2, by its hub id
        ("pythia-2.8b", "(FE+LT)^C", True),  # no table in C.7: GPT2-XL's, the nearest
    ],
)
def test_paper_token_graft_of_the_papers_models(model, positions, nearest):
    graft, line = paper_token_graft(model)
    assert graft.name == positions and str(graft.spec) == f"{positions}:all:all"
    assert ("nearest" in line) is nearest


def test_paper_token_graft_refuses_a_family_graft_does_not_know(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    with pytest.raises(GraftError, match="is of type 'bert', of no family graft knows"):
        paper_token_graft(str(tmp_path))
