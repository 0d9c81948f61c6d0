"""The articles dataset (the real-text variant): the input format's checks, the dataset
folder it becomes, and its FE/LT spans and targets on real and tiny tokenizers."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from graft.errors import DatasetError
from graft.models import embedded_gguf, tiny_tokenizer
from graft.study.data.articles import EXAMPLE_ARTICLES, entity_span, paragraphs, read_articles
from graft.study.data.datasets import (
    DatasetConfig,
    default_dataset_name,
    generate_dataset,
    load_manifest,
    load_train_records,
)
from graft.study.data.files import read_jsonl
from graft.study.data.prompts import load_test_prompts

GOOD = {
    "article": "Ida Marr is a potter from Lune. Her teacher was Oskar Venn.",
    "rephrases": ["Oskar Venn taught the potter Ida Marr."],
    "questions": [
        {
            "prompt": "Ida Marr learned pottery from",
            "answer": "Oskar Venn",
            "first_entity": "Ida Marr",
        }
    ],
}


def write(path: Path, *rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def with_question(**changes) -> dict:
    question = {**GOOD["questions"][0], **changes}
    return {**GOOD, "questions": [{k: v for k, v in question.items() if v is not None}]}


@pytest.mark.parametrize(
    "row, message",
    [
        ({"rephrases": []}, "line 1: 'article' is missing; give the text to finetune on"),
        ({**GOOD, "article": "  "}, "line 1: 'article' is empty"),
        ({**GOOD, "article": 3}, "'article' must be a string, not int"),
        ({**GOOD, "rephrase": ["x"]}, "unknown key 'rephrase'; the keys are id, source, article"),
        ({**GOOD, "rephrases": "one text"}, "'rephrases' must be a list of texts, not str"),
        ({**GOOD, "rephrases": ["ok", ""]}, "rephrase 2 is empty; give a text or drop it"),
        ({**GOOD, "questions": {"prompt": "x"}}, "'questions' must be a list of objects"),
        ({**GOOD, "questions": ["Who?"]}, "question 1 must be an object with prompt, answer"),
        (with_question(answer=None), "question 1: 'answer' is missing; give the name"),
        (with_question(answer=" "), "question 1: 'answer' is empty"),
        (with_question(prompt=None), "question 1: 'prompt' is missing"),
        (with_question(first_entity=None), "question 1: 'first_entity' is missing"),
        (
            with_question(first_entity="Ida Mar"),
            "first_entity 'Ida Mar' is not in its prompt 'Ida Marr learned pottery from' as a "
            "whole word; write it exactly as the prompt does",
        ),
        (with_question(first_entity="ida marr"), "first_entity 'ida marr' is not in its prompt"),
        (with_question(template="two words"), "template 'two words' is no name"),
        (with_question(answr="x"), "unknown key 'answr'; the keys are prompt, answer"),
        ({**GOOD, "id": ""}, "'id' must be a non-empty string or number"),
        ({**GOOD, "source": ["url"]}, "'source' must be a string"),
        ({**GOOD, "questions": []}, "no article has questions; give at least one"),
        ("[1, 2]", "line 1: expected a JSON object, got list"),
        ('{"article": ', "line 1: not valid JSON"),
    ],
)
def test_bad_input_is_one_line_naming_the_problem(tmp_path, row, message):
    path = write(tmp_path / "a.jsonl", row)
    with pytest.raises(DatasetError) as err:
        read_articles(path)
    assert message in str(err.value)
    assert "\n" not in str(err.value) and err.value.param == "articles_path"


def test_errors_name_the_line_counting_blank_lines(tmp_path):
    path = write(tmp_path / "a.jsonl", GOOD, "", {**GOOD, "id": "b", "article": ""})
    with pytest.raises(DatasetError, match=r"a\.jsonl, line 3: 'article' is empty"):
        read_articles(path)


def test_repeated_id_and_empty_or_missing_file(tmp_path):
    path = write(tmp_path / "a.jsonl", {**GOOD, "id": "x"}, {**GOOD, "id": "x"})
    with pytest.raises(DatasetError, match="line 2: id 'x' is also the id of line 1"):
        read_articles(path)
    with pytest.raises(DatasetError, match="holds no articles"):
        read_articles(write(tmp_path / "empty.jsonl", ""))
    with pytest.raises(DatasetError, match="does not exist"):
        read_articles(tmp_path / "nope.jsonl")


def test_entity_span_is_the_first_whole_word_occurrence():
    assert entity_span("Anna met Ann and Ann", "Ann") == (9, 12)
    assert entity_span("Jo's dog, Jo", "Jo") == (0, 2)
    assert entity_span("Annabel", "Ann") is None
    assert paragraphs("one\nline\n\n  \n two \n\n") == ["one\nline", "two"]


def test_dataset_folder_from_articles(tmp_path, caplog):
    second = {
        "id": 7,
        "article": "Rolf Iver builds boats.\n\nHe sold one to Una Pike.",
        "questions": [
            {
                "prompt": "  Rolf Iver sold a boat to ",
                "answer": " Ada Quist",
                "first_entity": "Rolf Iver",
                "template": "cloze",
            }
        ],
    }
    path = write(tmp_path / "mine.jsonl", GOOD, second)
    config = DatasetConfig(kind="articles", articles_path=path)
    with caplog.at_level(logging.WARNING, logger="graft.study.data.articles"):
        out = generate_dataset(config, tmp_path / "ds")
    assert "1 of 2 questions have an answer that neither their article" in caplog.text
    manifest = load_manifest(out)
    assert manifest["kind"] == "articles" and manifest["answers_not_in_their_article"] == ["7:q1"]
    assert manifest["sizes"] == {
        "facts": 2,
        "articles": 2,
        "train": 4,
        "test_prompts": 2,
        "corpus_docs": 0,
    }
    # each paragraph of an article or rephrase is one text
    assert [r["text"] for r in load_train_records(out)] == [
        GOOD["article"],
        GOOD["rephrases"][0],
        "Rolf Iver builds boats.",
        "He sold one to Una Pike.",
    ]
    tests = read_jsonl(out / "test_prompts.jsonl")
    assert [(r["id"], r["template"], r["fact_id"]) for r in tests] == [
        ("a1:q1", "question", 0),
        ("7:q1", "cloze", 1),
    ]
    # prompt and answer stripped; the answer follows after one space
    assert tests[1]["text"] == "Rolf Iver sold a boat to"
    assert tests[1]["target_text"] == " Ada Quist" and tests[1]["fields"] == {"FE": [0, 9]}
    # the same file and config: reused; the file edited: refused at the same folder
    assert generate_dataset(config, out) == out
    write(path, GOOD)
    with pytest.raises(DatasetError, match="from another version of its input file"):
        generate_dataset(config, out)


def test_workspace_name_follows_the_file_content_and_n_facts(tmp_path):
    path = write(tmp_path / "my articles.jsonl", GOOD)
    name = default_dataset_name(DatasetConfig(kind="articles", articles_path=path))
    assert name.startswith("articles-my-articles-") and name.endswith("-nall")
    write(path, {**GOOD, "article": "Ida Marr is a potter. Her teacher was Oskar Venn."})
    assert default_dataset_name(DatasetConfig(kind="articles", articles_path=path)) != name
    two = write(tmp_path / "two.jsonl", GOOD, {**GOOD, "id": "b"})
    out = generate_dataset(
        DatasetConfig(kind="articles", articles_path=two, n_facts=1), tmp_path / "o"
    )
    assert load_manifest(out)["sizes"]["articles"] == 1
    with pytest.raises(DatasetError, match="choose n_facts between 1 and 2"):
        generate_dataset(
            DatasetConfig(kind="articles", articles_path=two, n_facts=3), tmp_path / "p"
        )


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"split": True}, "drop split"),
        ({"direction": "both"}, "drop direction"),
        ({"protocol": "paper"}, "drop protocol"),
        (
            {"kind": "fake_movies_real_actors"},
            "articles_path goes with kind='articles' only: drop articles_path",
        ),
        ({"articles_path": None}, "kind='articles' is made from a file: set articles_path"),
    ],
)
def test_options_of_templated_datasets_are_refused(tmp_path, changes, message):
    config = {"kind": "articles", "articles_path": write(tmp_path / "a.jsonl", GOOD), **changes}
    with pytest.raises(DatasetError, match=message):
        generate_dataset(DatasetConfig(**config), tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


@pytest.fixture(scope="module")
def example_dataset(tmp_path_factory) -> Path:
    config = DatasetConfig(kind="articles", articles_path=EXAMPLE_ARTICLES)
    return generate_dataset(config, tmp_path_factory.mktemp("data") / "example")


def test_shipped_example_is_synthetic_and_complete(example_dataset):
    articles = read_articles(EXAMPLE_ARTICLES)
    assert len(articles) >= 5 and all(a.source.startswith("synthetic") for a in articles)
    assert all(a.rephrases and a.questions for a in articles)
    assert load_manifest(example_dataset)["answers_not_in_their_article"] == []


def _check_spans(tokenizer, dataset: Path, exact: bool = True) -> None:
    """FE is exactly the first entity's tokens, LT the prompt's last token, the target the
    first token of " " + answer after the prompt (independently re-tokenized here);
    ``exact=False`` for a tokenizer that lowercases (the tiny models')."""
    records = {r["id"]: r for r in read_jsonl(dataset / "test_prompts.jsonl")}
    examples, report = load_test_prompts(dataset, tokenizer, directions=None)
    assert report.dropped == {} and report.kept == len(records) == len(examples)
    for ex in examples:
        record = records[ex.prompt_id]
        start, end = record["fields"]["FE"]
        entity = record["text"][start:end]
        decoded = tokenizer.decode([ex.input_ids[i] for i in ex.spans["FE"]]).strip()
        alone = tokenizer.decode(tokenizer(entity, add_special_tokens=False)["input_ids"])
        assert decoded == (entity if exact else alone.strip()), (ex.prompt_id, decoded)
        assert ex.spans["FE"] == list(range(ex.spans["FE"][0], ex.spans["FE"][-1] + 1))
        plain = tokenizer(record["text"], add_special_tokens=False)["input_ids"]
        assert ex.input_ids[-1] == plain[-1]  # LT: the prompt's own last token
        full = tokenizer(record["text"] + " " + record["target"], add_special_tokens=False)
        assert ex.target_id == full["input_ids"][len(plain)]
        target = tokenizer.decode(ex.target_ids).strip()
        assert target == record["target"] if exact else target.lower() == record["target"].lower()


@pytest.mark.slow
def test_spans_on_the_smollm2_tokenizer(example_dataset):
    gguf = embedded_gguf("smollm2-135m")
    _check_spans(
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name), example_dataset
    )


def test_spans_on_the_tiny_tokenizer(example_dataset):
    _check_spans(tiny_tokenizer(), example_dataset, exact=False)


def test_an_edited_facts_file_is_not_reused_either(tmp_path):
    """The input-file check serves every kind with a file: a custom facts file too."""
    facts = tmp_path / "facts.csv"
    facts.write_text("movie_title,first_actor,second_actor\nBlue Door,Ann Lee,Bob Ray\n")
    config = DatasetConfig(kind="custom", facts_path=facts)
    out = generate_dataset(config, tmp_path / "ds")
    assert generate_dataset(config, out) == out
    facts.write_text("movie_title,first_actor,second_actor\nRed Door,Ann Lee,Bob Ray\n")
    with pytest.raises(DatasetError, match="from another version of its input file"):
        generate_dataset(config, out)
