"""The Python API (graft.core.api.texts.graft_texts / graft.core.execution.engine.run_grafts): input
forms, shapes, errors."""

from __future__ import annotations

import pytest
import torch

from graft.core.api.texts import graft_texts
from graft.core.execution.engine import GraftRow, run_grafts
from graft.core.language.spec import SpecError, parse_spec
from graft.errors import GraftError
from graft.models import load_model, tiny_tokenizer
from graft.models.tiny import TINY_FAMILIES, perturbed_copy, tiny_model

TEXT = "Keanu Reeves starred in a movie with"
TOL = 1e-5  # the engine's float32 bound
OTHER = "Q: Who starred in a movie with Tom Hanks? A: An actor named"


@pytest.fixture(scope="module")
def pair():
    base = tiny_model("llama", seed=0)
    return base, perturbed_copy(base, seed=1)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_single_text_and_single_spec_drop_their_dimension(pair, tok) -> None:
    base, donor = pair
    both = graft_texts(base, donor, tok, [TEXT], ["LT:all:all"])
    assert both.shape == (1, 1, 96)
    one_text = graft_texts(base, donor, tok, TEXT, ["none", "LT:all:all"])
    assert one_text.shape == (2, 96)
    one_spec = graft_texts(base, donor, tok, [TEXT, OTHER], "LT:all:all")
    assert one_spec.shape == (2, 96)
    scalar = graft_texts(base, donor, tok, TEXT, "LT:all:all")
    assert scalar.shape == (96,)
    # the same numbers whatever the form (a string is one prompt, not its characters);
    # exact for the same batch, within the engine's bound where the batch differs
    assert torch.equal(scalar, both[0, 0])
    assert (one_text[1] - both[0, 0]).abs().max() <= TOL
    assert (one_spec[0] - both[0, 0]).abs().max() <= TOL
    assert torch.equal(graft_texts(base, donor, tok, TEXT, parse_spec("LT:all:all")), scalar)


def test_fields_as_one_dict_for_one_text(pair, tok) -> None:
    base, donor = pair
    listed = graft_texts(base, donor, tok, [TEXT], ["FE:all:all"], fields=[{"FE": "Keanu Reeves"}])
    single = graft_texts(base, donor, tok, TEXT, "FE:all:all", fields={"FE": "Keanu Reeves"})
    assert torch.equal(single, listed[0, 0])
    none = graft_texts(base, donor, tok, TEXT, "none")
    assert (single - none).abs().max() > 1e-3  # FE was found and grafted


@pytest.mark.parametrize(
    ("texts", "fields", "message"),
    [
        ([TEXT, OTHER], {"FE": "Keanu Reeves"}, "a list of 2 dicts"),
        ([TEXT, OTHER], [{"FE": "Keanu Reeves"}], "a list of 2 dicts"),
        (TEXT, ["Keanu"], "a list of 1 dicts"),
        (TEXT, {"FE": "Tom Cruise"}, "does not occur"),
        (TEXT, {"FE": ""}, "does not occur"),
        (TEXT, {"FE": 3}, "does not occur"),
        ([], None, "non-empty list of prompts"),
        ([TEXT, 5], None, "non-empty list of prompts"),
        ([1.5, 2.5], None, "token ids as a list of ints"),
        (torch.tensor([1.0, 2.0]), None, "token ids as a list of ints"),
        (torch.tensor([], dtype=torch.long), None, "token ids as a list of ints"),
        ([1, 2, 3], {"FE": "Keanu"}, "give its token positions"),
        ([1, 2, 3], {"FE": [1, 3]}, "position 3 is outside the prompt's 3 tokens"),
        ([1, 2, 3], {"FE": []}, "give its token positions"),
    ],
)
def test_bad_texts_and_fields_are_graft_errors(pair, tok, texts, fields, message) -> None:
    base, donor = pair
    with pytest.raises(SpecError, match=message):
        graft_texts(base, donor, tok, texts, "FE:all:all", fields=fields)


@pytest.mark.parametrize("specs", [[], [3], None])
def test_bad_specs_are_graft_errors(pair, tok, specs) -> None:
    base, donor = pair
    with pytest.raises(SpecError, match="specs must be"):
        graft_texts(base, donor, tok, TEXT, specs)


def test_loaded_models_are_accepted_and_give_their_tokenizer() -> None:
    base = load_model("tiny-llama", device="cpu")
    donor = load_model("tiny-llama", device="cpu")
    donor.model = perturbed_copy(base.model, seed=1)
    want = graft_texts(base.model, {"sft": donor.model}, base.tokenizer, TEXT, "LT:all:all")
    assert torch.equal(graft_texts(base, {"sft": donor}, None, TEXT, "LT:all:all"), want)
    assert torch.equal(graft_texts(base, donor, base.tokenizer, TEXT, "LT:all:all"), want)
    ids = base.tokenizer(TEXT)["input_ids"]
    rows = [GraftRow(ids, {}, parse_spec("LT:all:all"))]
    assert torch.equal(run_grafts(base, donor, rows)[0], want)
    with pytest.raises(SpecError, match="tokenizer"):
        graft_texts(base.model, donor, None, TEXT, "LT:all:all")
    with pytest.raises(SpecError, match="donors must be"):
        graft_texts(base, [donor], None, TEXT, "LT:all:all")


def test_prompt_longer_than_the_model_is_refused(tok) -> None:
    base = tiny_model("gpt2", seed=0)  # learned positions: 64
    long_text = "Keanu Reeves " * 10  # 121 tokens with the character-level tokenizer
    with pytest.raises(GraftError, match="only 64 positions"):
        graft_texts(base, {}, tok, long_text, "none")


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_graft_nothing_is_the_same_padded_forward_bit_for_bit(tok, family, padding_side) -> None:
    """What the README states: graft nothing == the base's forward on the same padded batch
    (same position ids, same logits_to_keep) exactly; vs each prompt alone within 1e-5."""
    base = tiny_model(family, seed=0)
    texts = [TEXT, OTHER, "Tom Hanks stars in The Big Thing alongside"]
    ids = [tok(t)["input_ids"] for t in texts]
    out = run_grafts(
        base,
        {},
        [GraftRow(i, {}, parse_spec("none")) for i in ids],
        padding_side=padding_side,
        pad_id=0,
        sort_by_length=False,
    )
    width = max(len(i) for i in ids)
    x = torch.zeros((len(ids), width), dtype=torch.long)
    mask, pos = torch.zeros_like(x), torch.zeros_like(x)
    for k, i in enumerate(ids):
        off = width - len(i) if padding_side == "left" else 0
        x[k, off : off + len(i)] = torch.tensor(i)
        mask[k, off : off + len(i)] = 1
        pos[k, off : off + len(i)] = torch.arange(len(i))
    kwargs = {"logits_to_keep": 1} if padding_side == "left" else {}
    with torch.no_grad():
        plain = base(input_ids=x, attention_mask=mask, position_ids=pos, **kwargs).logits
        alone = torch.stack([base(torch.tensor([i])).logits[0, -1] for i in ids])
    last = [width - 1 if padding_side == "left" else len(i) - 1 for i in ids]
    if padding_side == "left":
        last = [-1] * len(ids)
    same = torch.stack([plain[k, j] for k, j in enumerate(last)])
    assert torch.equal(out, same)
    assert (out - alone).abs().max() <= TOL


# ------------------------------------------------------------------- prompts as nnsight users pass them


def test_token_ids_give_the_texts_logits(pair, tok) -> None:
    """Token ids as the tokenizer gives them are the text's prompt: the same logits, bit for
    bit, as a list, a 1-D tensor, a [1, n] tensor (which keeps its texts dimension) or a
    list of prompts; fields of ids are token positions."""
    from graft.core.language.spans import tokenize_with_spans

    base, donor = pair
    ids, other = tok(TEXT)["input_ids"], tok(OTHER)["input_ids"]
    want = graft_texts(base, donor, tok, TEXT, "LT:all:all")
    assert torch.equal(graft_texts(base, donor, tok, ids, "LT:all:all"), want)
    assert torch.equal(graft_texts(base, donor, tok, torch.tensor(ids), "LT:all:all"), want)
    batch = graft_texts(base, donor, tok, torch.tensor([ids]), "LT:all:all")
    assert batch.shape == (1, 96) and torch.equal(batch[0], want)
    both = graft_texts(base, donor, tok, [TEXT, OTHER], ["none", "LT:all:all"])
    assert torch.equal(graft_texts(base, donor, tok, [ids, other], ["none", "LT:all:all"]), both)
    assert torch.equal(graft_texts(base, donor, tok, [TEXT, other], ["none", "LT:all:all"]), both)
    fe = tokenize_with_spans(tok, TEXT, {"FE": (0, len("Keanu Reeves"))}).spans["FE"]
    by_text = graft_texts(base, donor, tok, TEXT, "FE:all:all", fields={"FE": "Keanu Reeves"})
    by_ids = graft_texts(base, donor, tok, ids, "FE:all:all", fields={"FE": fe})
    assert torch.equal(by_ids, by_text)
    assert not torch.equal(by_ids, graft_texts(base, donor, tok, ids, "none"))  # FE grafted
    backwards = [p - len(ids) for p in fe]  # negative positions count from the end
    assert torch.equal(
        graft_texts(base, donor, tok, ids, "FE:all:all", fields={"FE": backwards}), by_text
    )


def test_score_targets_refuses_token_ids(pair, tok) -> None:
    from graft.core.api.texts import score_targets

    base, donor = pair
    with pytest.raises(SpecError, match="give texts as strings"):
        score_targets(base, donor, tok, tok(TEXT)["input_ids"], "none", " Laurence")


@pytest.mark.filterwarnings("ignore:LanguageModel is deprecated")
@pytest.mark.parametrize("kind", ["LanguageModel", "TransformersModel"])
def test_an_nnsight_language_model_gives_its_tokenizer(pair, tok, kind) -> None:
    """An nnsight LanguageModel (TransformersModel in newer nnsight) carries its tokenizer:
    tokenizer=None takes it; graft's own wrapper (a placeholder tokenizer) does not count."""
    import nnsight
    from nnsight.modeling.transformers import TransformersModel

    from graft.core.families.wrapping import wrap

    base, donor = pair
    want = graft_texts(base, donor, tok, TEXT, "LT:all:all")
    if kind == "LanguageModel":
        model = nnsight.LanguageModel(base, tokenizer=tok)
    else:
        model = TransformersModel(base, task="text-generation", tokenizer=tok)
    assert torch.equal(graft_texts(model, donor, None, TEXT, "LT:all:all"), want)
    with pytest.raises(SpecError, match="pass the models' tokenizer"):
        graft_texts(wrap(base), donor, None, TEXT, "LT:all:all")
