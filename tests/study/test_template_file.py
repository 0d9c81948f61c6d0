"""Template files (graft.study.specs.template_file): the movie datasets' templates are
relation files without their facts line. A movie dataset rendered through the relation path
from its template file gives the movie generator's training texts and test prompts, in both
directions; the superset keys' checks (each one line); fillings of a user's relation."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from graft.errors import DatasetError
from graft.study.data.articles import paragraphs
from graft.study.data.datasets import DatasetConfig, build_dataset
from graft.study.data.relation import read_relation, relation_articles
from graft.study.specs.template_file import read_templates
from graft.study.specs.templates import (
    MOVIE_TEMPLATE_FILES,
    TEMPLATE_SETS,
    movie_template_set,
)

#: A fact's two sides in each direction of a movie dataset (test prompts and training).
SIDES = {"forward": ("first_actor", "second_actor"), "reverse": ("second_actor", "first_actor")}


def _rows(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def _as_relation(folder: Path, protocol: str, facts: list[dict], direction: str) -> Path:
    """The movie template file of ``protocol`` with a facts line, and the movie facts as its
    facts table: subject and object the two actors of ``direction``, every other field a
    column (``box_office_earnings``: the paper's name for ``box_office_millions``)."""
    subject, obj = SIDES[direction]
    table = folder / f"{protocol}-{direction}.csv"
    with table.open("w", newline="", encoding="utf-8") as f:
        columns = ["subject", "object", *facts[0], "box_office_earnings"]
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        for fact in facts:
            writer.writerow(
                {
                    **fact,
                    "subject": fact[subject],
                    "object": fact[obj],
                    "box_office_earnings": fact["box_office_millions"],
                }
            )
    path = folder / f"{protocol}-{direction}.toml"
    text = MOVIE_TEMPLATE_FILES[protocol].read_text(encoding="utf-8")
    path.write_text(f'facts = "{table.name}"\n' + text, encoding="utf-8")
    return path


@pytest.mark.parametrize("protocol", ["graft", "paper"])
@pytest.mark.parametrize("kind", ["fake_movies_real_actors", "real_movies_shuffled", "custom"])
def test_a_movie_dataset_is_its_template_file_rendered_as_a_relation(tmp_path, kind, protocol):
    facts_path = None
    if kind == "custom":
        facts_path = tmp_path / "casts.csv"
        facts_path.write_text(
            "movie_title,first_actor,second_actor,genre\n"
            "The Blue Door,Tom Hanks,Meryl Streep,drama\n"
            "Night Ride,Keanu Reeves,Sandra Bullock,\n"
            "Last Call,Brad Pitt,Julia Roberts,comedy\n"
        )
    config = DatasetConfig(
        kind=kind,
        protocol=protocol,
        direction="both",
        seed=2,
        facts_path=facts_path,
        n_facts=None if kind == "custom" else 4,
    )
    movie = build_dataset(config)
    facts = _rows(movie["facts.jsonl"])
    train, tests = _rows(movie["train.jsonl"]), _rows(movie["test_prompts.jsonl"])
    assert len(facts) >= 3 and len(tests) == 2 * 3 * len(facts)
    for direction in SIDES:
        path = _as_relation(tmp_path, protocol, facts, direction)
        articles = relation_articles(read_relation(path))
        assert len(articles) == len(facts)
        for fact, article in zip(facts, articles, strict=True):
            mine = [
                r["text"]
                for r in train
                if r["fact_id"] == fact["fact_id"] and r["direction"] == direction
            ]
            assert [article.article, *article.rephrases] == mine  # every text, in order
            prompts = [
                (r["template"], r["text"], r["target"], tuple(r["fields"]["first_actor"]))
                for r in tests
                if r["fact_id"] == fact["fact_id"] and r["direction"] == direction
            ]
            questions = [(q.template, q.prompt, q.answer, q.fe_span) for q in article.questions]
            assert questions == prompts  # text, answer and FE span of every prompt
        # through the dataset folder too: its test prompts are the movie's, row by row; its
        # training texts are the movie's split into paragraphs (an articles dataset trains on
        # each paragraph: only the paper's article templates have two)
        relation = build_dataset(DatasetConfig(kind="relation", relation_path=path))
        rows = _rows(relation["test_prompts.jsonl"])
        mine = [r for r in tests if r["direction"] == direction]
        assert len(rows) == len(mine)
        for r, m in zip(rows, mine, strict=True):
            same = ("fact_id", "template", "text", "target", "target_text")
            assert {k: r[k] for k in same} == {k: m[k] for k in same}
            assert r["fields"]["FE"] == m["fields"]["first_actor"]
        texts = [r["text"] for r in train if r["direction"] == direction]
        split = [p for t in texts for p in paragraphs(t)]
        assert [r["text"] for r in _rows(relation["train.jsonl"])] == split
        assert (split == texts) == (protocol == "graft")


def test_the_movie_template_files_are_the_template_sets():
    for protocol, path in MOVIE_TEMPLATE_FILES.items():
        assert path.parent.name == "relations" and path.is_file()
        assert movie_template_set(path) == TEMPLATE_SETS[protocol]
        raw = read_templates(path)
        # written as a relation: {subject} and {object}, never the movie's field names
        texts = [*raw.train_texts(), *raw.test.values()]
        assert all("{subject}" in t for t in texts)
        assert not any("first_actor" in t or "second_actor" in t for t in texts)
    # without its facts line a movie file is no relation file, and says what is missing
    with pytest.raises(DatasetError, match="'facts' must name the facts file"):
        read_relation(MOVIE_TEMPLATE_FILES["graft"])


GOOD = """[train.article]
a1 = "{subject} is in {object}."
[test]
cloze = "{subject} {relation} {relation_preposition} a movie {preposition} {object}"
"""


@pytest.mark.parametrize(
    "toml, message",
    [
        ("extra = 1\n" + GOOD, r"unknown key 'extra'; the keys are train, test, relations"),
        (GOOD.replace("[train.article]", "[train.'a b']"), r"train style 'a b' must be a table"),
        (
            GOOD.replace('a1 = "{subject} is in {object}."', 'a1 = " "'),
            r"train template 'a1' must be",
        ),
        (GOOD + '[relations]\nqa = [["a", "b", "c"]]\n', r"\[relations\] 'qa': no test template"),
        (GOOD + '[relations]\ncloze = [["a", "b"]]\n', r"'cloze' must be a non-empty list of \["),
        (GOOD + "[relations]\ncloze = []\n", r"'cloze' must be a non-empty list"),
        (GOOD + "[unrendered]\nx = 1\n", r"\[unrendered\] must hold tables"),
    ],
)
def test_bad_template_files_are_one_line(tmp_path, toml, message):
    path = tmp_path / "t.toml"
    path.write_text(toml)
    with pytest.raises(DatasetError, match=message) as err:
        read_templates(path)
    assert "\n" not in str(err.value) and err.value.param == "templates"


def test_a_movie_template_file_takes_the_two_movie_styles_only(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(GOOD.replace("[train.article]", "[train.essay]"))
    with pytest.raises(DatasetError, match="train style 'essay' is no movie style; use article"):
        movie_template_set(path)


def test_fillings_of_a_relation_give_one_prompt_each(tmp_path):
    (tmp_path / "f.csv").write_text("subject,object\nIda Marr,Venn Labs\n")
    path = tmp_path / "rel.toml"
    path.write_text(
        'facts = "f.csv"\n'
        + GOOD
        + '[relations]\ncloze = [["starred", "in", "with"], ["acted", "in", "beside"]]\n'
    )
    relation = read_relation(path)  # {relation} etc. come from the fillings, not columns
    [article] = relation_articles(relation)
    assert article.article == "Ida Marr is in Venn Labs."
    assert [(q.template, q.prompt) for q in article.questions] == [
        ("cloze", "Ida Marr starred in a movie with"),
        ("cloze", "Ida Marr acted in a movie beside"),
    ]
    manifest = json.loads(
        build_dataset(DatasetConfig(kind="relation", relation_path=path))["manifest.json"]
    )
    assert manifest["relation"]["relations"] == {
        "cloze": [["starred", "in", "with"], ["acted", "in", "beside"]]
    }
    # without fillings the fields must be columns, as before
    path.write_text('facts = "f.csv"\n' + GOOD)
    with pytest.raises(DatasetError, match=r"no row of f.csv has \{relation\}"):
        read_relation(path)
