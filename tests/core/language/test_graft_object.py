"""graft.Graft (graft.core.language.graft_object) and the vocabulary nnsight and TransformerLens
users speak: ``attn`` is the attention block (the paper's ATTN is ``qkv``, and ``attn`` keeps that
meaning under ``protocol=paper``), ``mlp`` is the FFN, ``head=donor:all`` reads out every
position with the donor's head."""

from __future__ import annotations

import pytest
import torch

import graft
from graft.core.api.grafted_trace import trace
from graft.core.api.texts import graft_texts
from graft.core.families.arch import architecture_of
from graft.core.language.graft_object import Graft, as_spec, combine
from graft.core.language.spec import parse_spec
from graft.errors import SpecError
from graft.models import tiny_tokenizer
from graft.models.tiny import TINY_FAMILIES

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "Keanu Reeves starred in a movie with"
FIELDS = {"FE": "Keanu Reeves"}


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.mark.parametrize(
    ("obj", "text"),
    [
        (Graft(positions="FE+LT"), "FE+LT:all:all"),
        (Graft(positions=["FE", "LT"], layers="all", modules="all"), "FE+LT:all:all"),
        (Graft(positions="LT", layers="q4", modules=("o", "ffn")), "LT:q4:o,ffn"),
        (Graft(positions=-1, layers=[0, 2], modules="attn", donor="task"), "-1:0,2:attn@task"),
        (Graft(positions="(FE+LT)^C", layers=range(1, 4), modules="mlp"), "(FE+LT)^C:1-3:mlp"),
        (Graft(positions="LT", layers=3, modules="o,mlp"), "LT:3:o,mlp"),
        (Graft(positions="ALL", head="donor:all"), "ALL:all:all; head=donor:all"),
        (Graft(positions="LT", head="donor@task"), "LT:all:all; head=donor@task"),
        (Graft(positions="LT", layers="q1", protocol="paper"), "LT:q1:all; protocol=paper"),
    ],
)
def test_a_graft_object_equals_its_spec_text(obj, text):
    assert obj == parse_spec(text)
    assert obj == text
    assert obj.spec == parse_spec(text)
    assert parse_spec(str(obj)) == parse_spec(text)
    assert as_spec(obj) == parse_spec(text)


def test_grafts_added_are_a_spec_of_several_rules():
    spec = Graft(positions="FE", modules="attn", donor="task") + Graft(
        positions="LT", layers="h2", modules=("o", "ffn"), donor="relation", head="donor"
    )
    assert spec == parse_spec("FE:all:attn@task; LT:h2:o,ffn@relation; head=donor")
    assert combine("FE:all:all", Graft(positions="LT")) == parse_spec("FE:all:all; LT:all:all")
    with pytest.raises(SpecError, match="different heads"):
        combine(Graft(positions="LT", head="donor"), Graft(positions="FE", head="paper"))


def test_a_sum_of_grafts_equals_its_text():
    """A sum of two Grafts did not compare equal to its text; three, or sum(), did not add."""
    fe, lt = Graft(positions="FE"), Graft(positions="LT", modules=("o",))
    assert fe + lt == "FE:all:all; LT:all:o"
    assert fe + lt != "LT:all:o; FE:all:all"  # the order is part of the meaning
    assert str(fe + lt) == "FE:all:all; LT:all:o"
    assert fe + lt + fe == "FE:all:all; LT:all:o; FE:all:all"
    assert sum([fe, lt]) == "FE:all:all; LT:all:o"
    assert "LT:all:o" + fe == "LT:all:o; FE:all:all"
    assert parse_spec("LT:all:o") + fe == "LT:all:o; FE:all:all"
    with pytest.raises(TypeError):
        _ = 3 + fe


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"positions": "LT", "modules": "atn"}, "unknown component 'atn'.*attention block"),
        ({"positions": [], "modules": "all"}, "at least one position"),
        ({"positions": "LT", "layers": []}, "at least one layer"),
        ({"positions": "LT", "layers": range(0, 6, 2)}, "step 1"),
        ({"positions": "LT", "head": "paper:all"}, "head=donor:all"),
    ],
)
def test_a_bad_graft_object_fails_where_it_is_made(kwargs, message):
    with pytest.raises(SpecError, match=message):
        Graft(**kwargs)


def test_graft_is_exported_and_the_named_graft_kept():
    assert graft.Graft is Graft
    assert graft.NamedGraft("x", parse_spec("LT:all:o")).spec == parse_spec("LT:all:o")


def cells(spec_text: str, base) -> set[tuple[int, str]]:
    arch = architecture_of(base)
    return set(parse_spec(spec_text).resolve(arch, 6, {"FE": [0, 1]}).cells)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_attn_is_the_attention_block_and_qkv_the_papers_attn(tiny_pairs, family):
    base, _ = tiny_pairs(family)
    arch = architecture_of(base)
    has = set(arch.components)
    block = {"q", "k", "v", "o"} | ({"q_norm", "k_norm"} & has)
    assert {c for _, c in cells("LT:all:attn", base)} == block
    assert {c for _, c in cells("LT:all:qkv", base)} == {"q", "k", "v"}
    # under the paper's protocol attn keeps the paper's meaning: q, k and v
    assert {c for _, c in cells("LT:all:attn; protocol=paper", base)} == {"q", "k", "v"}
    assert cells("LT:all:mlp", base) == cells("LT:all:ffn", base)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_an_object_grafts_what_its_text_grafts(tiny_pairs, tok, family):
    base, donor = tiny_pairs(family)
    obj = Graft(positions=["FE", "LT"], layers=range(1, 3), modules=("attn", "mlp"))
    got = graft_texts(base, {"sft": donor}, tok, TEXT, [obj], fields=FIELDS)
    want = graft_texts(base, {"sft": donor}, tok, TEXT, ["FE+LT:1-2:attn,mlp"], fields=FIELDS)
    assert torch.equal(got, want)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_the_donor_head_at_every_position_reads_out_the_donor(tiny_pairs, tok, family):
    """``ALL:all:all; head=donor:all`` is the donor at every position of a trace (with
    ``head=donor`` only the last position is read by the donor's head)."""
    base, donor = tiny_pairs(family)
    with trace(base, {"sft": donor}, tok, TEXT, "ALL:all:all; head=donor:all", fields=FIELDS) as g:
        every = g.model.output.logits.save()
    with trace(base, {"sft": donor}, tok, TEXT, "ALL:all:all; head=donor", fields=FIELDS) as g:
        last_only = g.model.output.logits.save()
    with torch.no_grad():
        own = donor(**g.inputs).logits
    assert (every - own).abs().max().item() <= 1e-5
    assert (last_only[:, -1] - own[:, -1]).abs().max().item() <= 1e-5
    assert not torch.equal(base.lm_head.weight, donor.lm_head.weight)  # else the next is vacuous
    assert (last_only[:, :-1] - own[:, :-1]).abs().max().item() > 1e-4
