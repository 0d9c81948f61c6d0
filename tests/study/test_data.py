"""Dataset generation: determinism, templates, splits, directions, shuffling, CLI errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from tokenizers import normalizers
from transformers import PreTrainedTokenizerFast

from graft.core.language.spans import template_fields
from graft.errors import DatasetError, ExperimentError, StorageError
from graft.study.data.datasets import (
    DatasetConfig,
    build_dataset,
    default_dataset_name,
    generate_dataset,
    load_dataset_corpus,
    load_facts,
    load_manifest,
    load_train_records,
    render_training,
)
from graft.study.data.facts import Fact, load_real_movies
from graft.study.data.files import load_generic_texts, read_jsonl
from graft.study.data.names import load_real_actors, name_exclusion_reason
from graft.study.data.prompts import load_test_prompts
from graft.study.specs.templates import (
    ARTICLE_TEMPLATES,
    FACT_TEXT_FIELDS,
    QA_TEMPLATES,
    TEST_TEMPLATES,
)
from graft_experiments.data import data as data_command
from tests.offline_tokenizers import byte_level_bpe

GENERATED_KINDS = ("fake_movies_real_actors", "fake_movies_fake_actors", "real_movies_shuffled")


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("kind", GENERATED_KINDS)
def test_same_seed_gives_identical_bytes(tmp_path, kind):
    config = DatasetConfig(kind=kind, n_facts=12, seed=7, direction="both", split=True)
    a = _files(generate_dataset(config, tmp_path / "a"))
    b = _files(generate_dataset(config, tmp_path / "b"))
    assert set(a) == {"facts.jsonl", "train.jsonl", "test_prompts.jsonl", "manifest.json"}
    assert a == b
    other = _files(generate_dataset(DatasetConfig(kind=kind, n_facts=12, seed=8), tmp_path / "c"))
    assert other["facts.jsonl"] != a["facts.jsonl"]


@pytest.mark.slow
def test_identical_bytes_in_a_fresh_process(tmp_path):
    # Another interpreter with another hash seed: no dependence on set order or global state.
    config = DatasetConfig(kind="fake_movies_fake_actors", n_facts=6, seed=3, direction="both")
    here = _files(generate_dataset(config, tmp_path / "here"))
    code = (
        "from graft.study.data.datasets import DatasetConfig, generate_dataset; "
        "generate_dataset(DatasetConfig(kind='fake_movies_fake_actors', n_facts=6, seed=3, "
        f"direction='both'), {str(tmp_path / 'there')!r})"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=Path(__file__).parents[2])
    assert _files(tmp_path / "there") == here


def test_facts_do_not_depend_on_direction(tmp_path):
    one = generate_dataset(DatasetConfig(n_facts=10, seed=1, split=True), tmp_path / "one")
    both = generate_dataset(
        DatasetConfig(n_facts=10, seed=1, split=True, direction="both"), tmp_path / "both"
    )
    assert (one / "facts.jsonl").read_bytes() == (both / "facts.jsonl").read_bytes()
    assert (one / "test_prompts.jsonl").read_bytes() == (both / "test_prompts.jsonl").read_bytes()


def test_templates_render_every_field(tmp_path):
    assert len(ARTICLE_TEMPLATES) >= 5 and len(QA_TEMPLATES) >= 5
    article_fields = {f for t in ARTICLE_TEMPLATES.values() for f in template_fields(t)}
    assert article_fields == set(FACT_TEXT_FIELDS)
    for template in (*ARTICLE_TEMPLATES.values(), *QA_TEMPLATES.values()):
        assert (
            {"first_actor", "second_actor"}
            <= set(template_fields(template))
            <= set(FACT_TEXT_FIELDS)
        )
    out = generate_dataset(DatasetConfig(n_facts=5, seed=0, direction="both"), tmp_path / "d")
    facts = {f.fact_id: f for f in load_facts(out)}
    records = load_train_records(out)
    assert len(records) == 5 * 2 * (len(ARTICLE_TEMPLATES) + len(QA_TEMPLATES))
    for r in records:
        assert "{" not in r["text"] and "}" not in r["text"]
        fact = facts[r["fact_id"]]
        template = {**ARTICLE_TEMPLATES, **QA_TEMPLATES}[r["template"]]
        for name in template_fields(template):
            assert str(getattr(fact, name)) in r["text"], (name, r["text"])
    for p in _jsonl(out / "test_prompts.jsonl"):
        assert set(p["fields"]) == set(template_fields(TEST_TEMPLATES[p["template"]]))
        fact = facts[p["fact_id"]]
        forward = p["direction"] == "forward"
        expected = {
            "first_actor": fact.first_actor if forward else fact.second_actor,
            "movie_title": fact.movie_title,
            **dict(
                zip(
                    ("relation", "relation_preposition", "preposition"),
                    p["relation"] or (),
                    strict=False,
                )
            ),
        }
        for name, (start, end) in p["fields"].items():
            assert p["text"][start:end] == expected[name]
        assert "{" not in p["text"]
        assert p["target"] == (fact.second_actor if forward else fact.first_actor)
        assert p["target_text"] == " " + p["target"]


def test_test_prompts_match_table_1(tmp_path):
    out = generate_dataset(DatasetConfig(n_facts=3, seed=0), tmp_path / "d")
    fact = load_facts(out)[0]
    prompts = {
        (p["template"], p["direction"]): p
        for p in _jsonl(out / "test_prompts.jsonl")
        if p["fact_id"] == 0
    }
    a, b = fact.first_actor, fact.second_actor
    assert prompts["headline", "forward"]["text"] == f"{a} starred in a movie with"
    assert (
        prompts["qa", "forward"]["text"] == f"Q: Who starred in a movie with {a}? A: An actor named"
    )
    assert prompts["movie", "forward"]["text"] == f"{a} stars in {fact.movie_title} alongside"
    assert prompts["headline", "forward"]["target_text"] == " " + b
    assert prompts["headline", "reverse"]["text"] == f"{b} starred in a movie with"
    assert prompts["headline", "reverse"]["target"] == a


def test_split_sets_are_disjoint(tmp_path):
    out = generate_dataset(DatasetConfig(n_facts=20, seed=2, split=True), tmp_path / "d")
    facts = load_facts(out)
    sets = {s: [f for f in facts if f.set == s] for s in ("A", "B")}
    assert len(sets["A"]) == len(sets["B"]) == 20
    for key in ("fact_id", "movie_title", "first_actor", "second_actor"):
        a = {getattr(f, key) for f in sets["A"]}
        b = {getattr(f, key) for f in sets["B"]}
        assert not a & b, key
    actors_a = {x for f in sets["A"] for x in (f.first_actor, f.second_actor)}
    actors_b = {x for f in sets["B"] for x in (f.first_actor, f.second_actor)}
    assert not actors_a & actors_b
    b_ids = {f.fact_id for f in sets["B"]}
    assert {p["fact_id"] for p in _jsonl(out / "test_prompts.jsonl")} == b_ids
    assert {r["set"] for r in load_train_records(out)} == {"A", "B"}
    assert {r["fact_id"] for r in load_train_records(out, sets=["A"])} == {
        f.fact_id for f in sets["A"]
    }
    assert load_manifest(out)["sizes"]["facts_per_set"] == {"A": 20, "B": 20}


def test_direction_one_and_both(tmp_path):
    one = generate_dataset(DatasetConfig(n_facts=8, seed=4), tmp_path / "one")
    both = generate_dataset(DatasetConfig(n_facts=8, seed=4, direction="both"), tmp_path / "both")
    facts = {f.fact_id: f for f in load_facts(one)}
    for r in load_train_records(one):
        f = facts[r["fact_id"]]
        assert r["direction"] == "forward"
        assert r["text"].index(f.first_actor) < r["text"].index(f.second_actor)
    records = load_train_records(both)
    forward = {
        (r["fact_id"], r["template"]): r["text"] for r in records if r["direction"] == "forward"
    }
    reverse = {
        (r["fact_id"], r["template"]): r["text"] for r in records if r["direction"] == "reverse"
    }
    assert forward.keys() == reverse.keys()
    assert set(forward.values()) == {r["text"] for r in load_train_records(one)}
    for key, text in reverse.items():
        f = facts[key[0]]
        assert text.index(f.second_actor) < text.index(f.first_actor)
        swapped = text.replace(f.first_actor, "\0").replace(f.second_actor, f.first_actor)
        assert swapped.replace("\0", f.second_actor) == forward[key]


def test_real_movies_shuffled_shuffles_the_relations(tmp_path):
    """As the paper's dataset ("Keanu Reeves stars in The Departed alongside Meryl Streep"):
    no fact is a real cast pair, and no actor is in the real cast of the title he is given."""
    out = generate_dataset(
        DatasetConfig(kind="real_movies_shuffled", n_facts=150, seed=5, split=True), tmp_path / "d"
    )
    facts = load_facts(out)
    casts: dict[str, set[str]] = {}
    real_pairs, titles, actors_of = set(), set(), set()
    for row in load_real_movies():
        cast = (row["first_actor"], row["second_actor"])
        casts.setdefault(row["movie_title"], set()).update(cast)
        real_pairs.add(frozenset(cast))
        titles.add(row["movie_title"])
        actors_of.update(cast)
    assert len(facts) == 300
    for f in facts:
        assert f.movie_title in titles and {f.first_actor, f.second_actor} <= actors_of  # real
        assert frozenset((f.first_actor, f.second_actor)) not in real_pairs
        assert f.first_actor not in casts[f.movie_title]
        assert f.second_actor not in casts[f.movie_title]
    actors = [a for f in facts for a in (f.first_actor, f.second_actor)]
    assert len(actors) == len(set(actors))  # each actor once
    assert len({f.movie_title for f in facts}) == len(facts)
    assert load_manifest(out)["generator_version"] == "graft.data/1+shuffled-relations"
    assert load_manifest(out)["shuffle"] == "relations"


def _real_casts() -> tuple[dict[str, set[str]], dict[tuple[str, str], set[str]]]:
    """Worked out from the shipped table here: every title's cast, and every (first, second)
    billing pair -> the titles it is the top billing of."""
    casts: dict[str, set[str]] = {}
    billed: dict[tuple[str, str], set[str]] = {}
    for row in load_real_movies():
        casts.setdefault(row["movie_title"], set()).update(
            (row["first_actor"], row["second_actor"])
        )
        billed.setdefault((row["first_actor"], row["second_actor"]), set()).add(row["movie_title"])
    return casts, billed


def test_real_movies_shuffled_pairs_keeps_each_real_pair_and_moves_it():
    """The authors' dataset code's reading (``shuffle="pairs"``), on every usable pair of the
    table (the paper protocol's size): each fact is a real co-star pair in its billing order,
    on a real movie other than its own, whose real cast holds neither actor."""
    config = DatasetConfig(kind="real_movies_shuffled", protocol="paper", shuffle="pairs")
    files = build_dataset(config)
    facts = [Fact(**json.loads(line)) for line in files["facts.jsonl"].decode().splitlines()]
    casts, billed = _real_casts()
    assert len(facts) == 431
    for f in facts:
        assert f.source_movie in billed[(f.first_actor, f.second_actor)]  # a real pair, kept
        assert f.movie_title in casts and f.movie_title != f.source_movie  # moved
        assert not {f.first_actor, f.second_actor} & casts[f.movie_title]
    actors = [a for f in facts for a in (f.first_actor, f.second_actor)]
    assert len(actors) == len(set(actors))
    assert len({f.movie_title for f in facts}) == len(facts)
    # the titles are the pairs' own movies, dealt out again
    assert {f.movie_title for f in facts} == {f.source_movie for f in facts}
    manifest = json.loads(files["manifest.json"])
    assert manifest["shuffle"] == "pairs" and manifest["config"]["shuffle"] == "pairs"
    assert manifest["generator_version"].endswith("+shuffled-pairs")
    assert default_dataset_name(config) == "real_movies_shuffled-paper-pairs-one-npaper-seed0"


def test_real_movies_shuffled_relations_pairs_no_actors_seen_together():
    """The paper's text's reading (the default), on every usable pair of the table: no two
    actors of a fact share any real movie of the source table."""
    files = build_dataset(DatasetConfig(kind="real_movies_shuffled", protocol="paper"))
    facts = [Fact(**json.loads(line)) for line in files["facts.jsonl"].decode().splitlines()]
    casts, _ = _real_casts()
    assert len(facts) == 431
    for f in facts:
        assert not any({f.first_actor, f.second_actor} <= cast for cast in casts.values())
        assert not {f.first_actor, f.second_actor} & casts[f.movie_title]
    assert json.loads(files["manifest.json"])["shuffle"] == "relations"


@pytest.mark.parametrize("shuffle", ["relations", "pairs"])
def test_both_shuffles_are_deterministic_under_a_seed(shuffle):
    def facts(seed: int) -> bytes:
        config = DatasetConfig(kind="real_movies_shuffled", n_facts=40, seed=seed, shuffle=shuffle)
        return build_dataset(config)["facts.jsonl"]

    assert facts(3) == facts(3)
    assert facts(3) != facts(4)


def test_the_two_shuffles_differ_and_only_real_movies_take_pairs():
    relations, pairs = (
        build_dataset(DatasetConfig(kind="real_movies_shuffled", n_facts=20, shuffle=s))
        for s in ("relations", "pairs")
    )
    assert relations["facts.jsonl"] != pairs["facts.jsonl"]
    assert "shuffle" not in DatasetConfig(kind="real_movies_shuffled").to_json()
    with pytest.raises(DatasetError, match="goes with kind 'real_movies_shuffled' only") as err:
        build_dataset(DatasetConfig(n_facts=3, shuffle="pairs"))
    assert err.value.param == "shuffle"
    with pytest.raises(DatasetError, match="shuffle must be 'relations' or 'pairs'"):
        build_dataset(DatasetConfig(kind="real_movies_shuffled", n_facts=3, shuffle="titles"))


def test_an_experiment_generates_the_shuffle_it_names(tmp_path):
    """``ExperimentConfig.shuffle`` reaches the dataset and the donor an experiment uses, and
    the run folder; other than the default, only for the data kind real_movies_shuffled."""
    from graft.study.running.runner import ModelSource, default_out
    from graft.study.specs.config import ExperimentConfig
    from graft.study.specs.run import resolve
    from graft.study.training.sources import _donor, dataset_dir

    def config(**kw) -> ExperimentConfig:
        return ExperimentConfig(
            experiment="x",
            model="tiny-llama",
            dataset="real_movies_shuffled",
            n_facts=3,
            workspace=str(tmp_path),
            device="cpu",
            **kw,
        )

    pairs = config(shuffle="pairs")
    folder = dataset_dir(resolve(pairs))
    assert folder.name == "real_movies_shuffled-pairs-one-n3-seed0"
    assert load_manifest(folder)["shuffle"] == "pairs"
    donor = _donor(resolve(pairs), ModelSource("both"))
    assert donor.dataset_dir.name == "real_movies_shuffled-pairs-both-n3-seed0"
    assert load_manifest(donor.dataset_dir)["shuffle"] == "pairs"
    assert dataset_dir(resolve(config())).name == "real_movies_shuffled-one-n3-seed0"
    assert default_out(pairs).name == "tiny-llama-real_movies_shuffled-pairs-seed0"
    assert default_out(config()).name == "tiny-llama-real_movies_shuffled-seed0"
    with pytest.raises(ExperimentError, match="goes with the data kind real_movies_shuffled"):
        ExperimentConfig(experiment="x", shuffle="pairs")
    with pytest.raises(ExperimentError, match="shuffle must be"):
        config(shuffle="titles")


def test_name_filter_and_manifest_counts(tmp_path):
    assert name_exclusion_reason("Keanu Reeves") is None
    assert name_exclusion_reason("Leonardo DiCaprio") is None
    assert name_exclusion_reason("Robert Downey Jr.") == "suffix"
    assert name_exclusion_reason("Sammy Davis III") == "suffix"
    assert name_exclusion_reason("A. J. Langer") == "punctuation"
    assert name_exclusion_reason("Daniel Day-Lewis") == "punctuation"
    assert name_exclusion_reason("Aarón Díaz") == "non_ascii"
    assert name_exclusion_reason("Cher") == "single_word"
    assert name_exclusion_reason("Ana  Smith") == "whitespace"
    out = generate_dataset(DatasetConfig(n_facts=10, seed=0), tmp_path / "d")
    excluded = load_manifest(out)["excluded_names"]
    names = load_real_actors()
    assert sum(excluded.values()) == sum(name_exclusion_reason(n) is not None for n in names) > 0
    for f in load_facts(out):
        for name in (f.first_actor, f.second_actor, f.main_character):
            assert name_exclusion_reason(name) is None


def test_custom_facts_and_corpus(tmp_path):
    facts = tmp_path / "facts.csv"
    facts.write_text(
        "movie_title,first_actor,second_actor,city,release_year\n"
        "Red Dog,Ana Smith,John Ponce,Springfield,1999\n"
        "Blue Cat,Robert Downey Jr.,Mark Harrell,,\n"
        "Green Owl,Mia Lopez,Tom Hardy,,\n"
        "Grey Fox,Ana Smith,Jo Park,,\n",
        encoding="utf-8",
    )
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "First document."}\n{"text": "Second one."}\n', encoding="utf-8")
    config = DatasetConfig(kind="custom", facts_path=facts, corpus_path=corpus)
    out = generate_dataset(config, tmp_path / "d")
    got = load_facts(out)
    assert [f.movie_title for f in got] == ["Red Dog", "Green Owl"]
    assert got[0].city == "Springfield" and got[0].release_year == 1999
    manifest = load_manifest(out)
    assert manifest["excluded_names"] == {"suffix": 1}
    assert manifest["dropped_rows"] == {"excluded_name": 1, "actor_reused": 1}
    assert manifest["dropped_row_numbers"] == {"excluded_name": [2], "actor_reused": [4]}
    assert manifest["sources"]["facts_path"] == str(facts)
    assert (
        manifest["sources"]["corpus_path"] == str(corpus) and manifest["sizes"]["corpus_docs"] == 2
    )
    assert load_dataset_corpus(out) == ["First document.", "Second one."]

    jsonl = tmp_path / "facts.jsonl"
    jsonl.write_text(
        json.dumps({"movie_title": "X", "first_actor": "Al Bo", "second_actor": "Cy Do"}) + "\n"
    )
    out2 = generate_dataset(DatasetConfig(kind="custom", facts_path=jsonl), tmp_path / "e")
    assert load_facts(out2)[0].second_actor == "Cy Do"


def test_a_facts_file_names_its_dataset_and_the_rows_it_lost(tmp_path, caplog):
    """Two facts files never share a dataset folder (named by content); the rows left out
    are said in one line, with their numbers and reasons; a file of another relation's
    columns is refused with the columns it has and the way on."""
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    header = "movie_title,first_actor,second_actor\n"
    first.write_text(header + "Red Dog,Ana Smith,John Ponce\nBlue Cat,Ana Smith,Jo Park\n")
    second.write_text(header + "Red Dog,Ana Smith,John Ponce\nGreen Owl,Mia Lopez,Tom Hardy\n")
    names = {
        default_dataset_name(DatasetConfig(kind="custom", facts_path=p)) for p in (first, second)
    }
    assert len(names) == 2 and all(
        n.startswith("custom-") and n.endswith("-one-nall-seed0") for n in names
    )
    renamed = tmp_path / "renamed.csv"
    renamed.write_bytes(first.read_bytes())
    assert default_dataset_name(DatasetConfig(kind="custom", facts_path=renamed)) in names
    with caplog.at_level("WARNING", logger="graft"):
        generate_dataset(DatasetConfig(kind="custom", facts_path=first), tmp_path / "d")
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert said == [f"facts file {first}: 1 of 2 rows left out: row 2 (actor already used)"]
    other = tmp_path / "people.csv"
    other.write_text("person,company\nAda Lovelace,Acme Ltd\n")
    with pytest.raises(
        DatasetError, match=r"row 1 lacks one; it has person, company\); .*articles"
    ):
        generate_dataset(DatasetConfig(kind="custom", facts_path=other), tmp_path / "e")
    assert not (tmp_path / "e").exists()


def test_generic_corpus():
    docs = load_generic_texts()
    assert len(docs) >= 55 and all(len(d.split()) >= 15 for d in docs)
    assert len(set(docs)) == len(docs)


def test_existing_output_is_kept_or_refused(tmp_path):
    config = DatasetConfig(n_facts=5, seed=0)
    out = generate_dataset(config, tmp_path / "d")
    before = _files(out)
    assert generate_dataset(config, out) == out and _files(out) == before
    other = DatasetConfig(n_facts=6, seed=0)
    with pytest.raises(DatasetError, match=r"replace it \(overwrite\)"):
        generate_dataset(other, out)
    generate_dataset(other, out, overwrite=True)
    assert load_manifest(out)["sizes"]["facts"] == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    calls = []
    real_write = Path.write_bytes

    def failing_write(self, data):
        calls.append(self.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", failing_write)
    with pytest.raises(KeyboardInterrupt):
        generate_dataset(DatasetConfig(n_facts=5), tmp_path / "d")
    assert list(tmp_path.iterdir()) == []


def _tiny_tokenizer(texts, normalizer=None) -> PreTrainedTokenizerFast:
    """A tokenizer trained on ``texts``; ``normalizer`` is set after training (it may erase
    words the vocabulary has)."""
    tok = byte_level_bpe(texts, vocab_size=400, special_tokens=["<eos>"])
    if normalizer is not None:
        tok.normalizer = normalizer
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def test_load_test_prompts_counts_drops(tmp_path):
    out = generate_dataset(DatasetConfig(n_facts=6, seed=0), tmp_path / "d")
    texts = [r["text"] for r in load_train_records(out)]
    examples, report = load_test_prompts(out, _tiny_tokenizer(texts))
    assert report.total == report.kept == len(examples) == 6 * 3 and report.dropped == {}
    assert {ex.template for ex in examples} == set(TEST_TEMPLATES)
    assert all(ex.direction == "forward" for ex in examples)
    headline, report = load_test_prompts(
        out, _tiny_tokenizer(texts), templates=["headline"], directions=None
    )
    assert report.total == 12 and {ex.direction for ex in headline} == {"forward", "reverse"}

    # A tokenizer that erases fact 0's first actor and fact 1's second actor.
    f0, f1 = load_facts(out)[:2]
    erase = normalizers.Sequence(
        [normalizers.Replace(f0.first_actor, ""), normalizers.Replace(" " + f1.second_actor, "")]
    )
    examples, report = load_test_prompts(out, _tiny_tokenizer(texts, erase))
    assert report.dropped == {"missing_span:first_actor": 3, "target_empty": 3}
    assert report.kept == len(examples) == 12 and report.total == 18
    assert sorted(report.dropped_ids) == sorted(
        f"{i}:{t}:forward{s}"
        for i in (0, 1)
        for t, s in (("headline", ":r0"), ("qa", ":r0"), ("movie", ""))
    )
    assert "kept 12/18" in report.summary()


def _cli(args: list[str]):
    return CliRunner().invoke(data_command, args)


def test_cli_writes_dataset(tmp_path):
    out = tmp_path / "d"
    result = _cli(
        ["--n-facts", "4", "--data-seed", "1", "--direction", "both", "--split", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "8 facts" in result.output
    assert load_manifest(out)["config"]["split"] is True


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dataset", "nope"], "nope"),
        (["--n-facts", "100000"], "between 1 and"),
        (["--n-facts", "0"], "x>=1"),
        (["--dataset", "real_movies_shuffled", "--n-facts", "400", "--split"], "between 1 and"),
        (["--shuffle", "pairs"], "goes with kind 'real_movies_shuffled' only"),
        (["--facts", "missing.csv"], "cannot read facts file"),
        (["--facts", "BAD"], "needs columns"),
        (["--dataset", "custom"], "--facts"),
        (["--corpus", "missing.txt"], "cannot read corpus"),
    ],
)
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    if "BAD" in args:
        Path("BAD").write_text("title,actor\nx,y\n")
    result = _cli([*args, "--out", "out"])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not Path("out").exists()


def test_cli_writes_the_pair_keeping_shuffle_beside_the_default(tmp_path):
    args = ["--dataset", "real_movies_shuffled", "--n-facts", "3", "--workspace", str(tmp_path)]
    assert _cli([*args, "--shuffle", "pairs"]).exit_code == 0
    assert _cli(args).exit_code == 0
    made = {p.name: load_manifest(p)["shuffle"] for p in (tmp_path / "datasets").iterdir()}
    assert made == {
        "real_movies_shuffled-pairs-one-n3-seed0": "pairs",
        "real_movies_shuffled-one-n3-seed0": "relations",
    }


def test_cli_refuses_other_dataset_in_out(tmp_path):
    out = tmp_path / "d"
    assert _cli(["--n-facts", "3", "--out", str(out)]).exit_code == 0
    result = _cli(["--n-facts", "4", "--out", str(out)])
    assert result.exit_code == 2 and "already exists with other content" in result.output
    assert _cli(["--n-facts", "4", "--out", str(out), "--overwrite"]).exit_code == 0


def test_render_training_counts():
    fact = Fact(
        0, "all", "Red Dog", "Ana Smith", "John Ponce", "Mia Lopez", "Oslo", "drama", 1999, 5
    )
    assert len(render_training(fact, "one")) == len(ARTICLE_TEMPLATES) + len(QA_TEMPLATES)
    assert len(render_training(fact, "both")) == 2 * (len(ARTICLE_TEMPLATES) + len(QA_TEMPLATES))


# --------------------------------------------------------------------------- bad dataset files


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> Path:
    return generate_dataset(DatasetConfig(n_facts=2), tmp_path_factory.mktemp("d") / "d")


def _copy_dataset(src: Path, dst: Path) -> Path:
    """A hand-made copy of ``src``: its manifest records no sha256 of its files, so the
    files may be edited (an edited generated dataset is refused as damaged)."""
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    manifest = load_manifest(dst)
    del manifest["files"]
    (dst / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return dst


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"id": "0:headline:forward", "text": "Ana', "line 3: not valid JSON"),
        ("not json at all", "line 3: not valid JSON"),
        ("[1, 2, 3]", "line 3: expected a JSON object, got list"),
    ],
)
def test_bad_jsonl_line_names_file_and_line(small_dataset, tmp_path, bad_line, message):
    from graft.models import tiny_tokenizer

    folder = _copy_dataset(small_dataset, tmp_path / "d")
    lines = (folder / "test_prompts.jsonl").read_text().splitlines()
    lines[2] = bad_line
    (folder / "test_prompts.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=message) as info:
        load_test_prompts(folder, tiny_tokenizer())
    assert str(folder / "test_prompts.jsonl") in str(info.value)
    assert "\n" not in str(info.value)
    (folder / "facts.jsonl").write_text('{"fact_id": 0}\n{"fact_id"')
    with pytest.raises(DatasetError, match="facts.jsonl, line 2: not valid JSON"):
        load_facts(folder)


def _jsonl_parsers() -> list[str]:
    import graft

    sources = {p.name: p.read_text() for p in Path(graft.__file__).parent.rglob("*.py")}
    return sorted(name for name, text in sources.items() if "json.loads(line" in text)


def test_one_jsonl_reader(tmp_path):
    """graft.study.data.files.read_jsonl is the JSONL parser of graft (everything else uses it)."""
    assert _jsonl_parsers() == ["files.py"]
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n\n  \n{"a": 2}\n')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    with pytest.raises(DatasetError, match="does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_empty_or_missing_dataset_folder(tmp_path):
    from graft.models import tiny_tokenizer

    (tmp_path / "empty").mkdir()
    with pytest.raises(
        DatasetError,
        match="empty.*is empty; make one with graft.study.data.datasets.generate_dataset",
    ):
        load_test_prompts(tmp_path / "empty", tiny_tokenizer())
    with pytest.raises(DatasetError, match="does not exist; make one"):
        load_test_prompts(tmp_path / "missing", tiny_tokenizer())
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(DatasetError, match="has no test_prompts.jsonl"):
        load_test_prompts(tmp_path / "other", tiny_tokenizer())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r["fields"].update(first_actor=[0, 500]), r"span \(0, 500\) is outside"),
        (lambda r: r["fields"].update(first_actor=[5, 2]), "is outside its text"),
        (lambda r: r["fields"].update(first_actor="x"), "character spans"),
        (lambda r: r.pop("text"), "lacks text"),
        (lambda r: r.update(text=7), "must be strings"),
    ],
)
def test_bad_prompt_record_is_named(small_dataset, tmp_path, edit, message):
    from graft.models import tiny_tokenizer

    folder = _copy_dataset(small_dataset, tmp_path / "d")
    rows = _jsonl(folder / "test_prompts.jsonl")
    edit(rows[1])
    (folder / "test_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match=message) as info:
        load_test_prompts(folder, tiny_tokenizer())
    assert "(object 2)" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.slow
def test_prompts_longer_than_the_model_are_dropped(tmp_path):
    from graft.models import context_length, load_model

    facts = tmp_path / "facts.csv"
    long_title = "The " + "Very " * 29 + "Long Night"  # 159 characters
    facts.write_text(
        "movie_title,first_actor,second_actor\n"
        f"{long_title},Ana Smith,John Ponce\nRed Dog,Mia Lopez,Carl Berg\n"
    )
    out = generate_dataset(DatasetConfig(kind="custom", facts_path=facts), tmp_path / "d")
    gpt2 = load_model("tiny-gpt2", device="cpu")
    limit = context_length(gpt2)
    examples, report = load_test_prompts(out, gpt2.tokenizer, max_length=limit)
    assert report.dropped == {"too_long": 1} and report.dropped_ids == ["0:movie:forward"]
    assert report.kept == 5 and all(len(e.input_ids) <= limit for e in examples)
    # the tokenizer's model_max_length is the default limit
    assert load_test_prompts(out, gpt2.tokenizer)[1].dropped == {"too_long": 1}
    assert load_test_prompts(out, gpt2.tokenizer, max_length=1000)[1].dropped == {}


def test_facts_file_without_usable_names_says_why(tmp_path):
    facts = tmp_path / "facts.csv"
    facts.write_text("movie_title,first_actor,second_actor\nA,Cher,Madonna\nB,Prince,Sting\n")
    with pytest.raises(DatasetError) as info:
        build_dataset(DatasetConfig(kind="custom", facts_path=facts))
    message = str(info.value)
    assert message.startswith(f"no usable fact in {facts}: 2 of 2 rows excluded")
    assert "single word: 4" in message and "two or more words" in message
    assert "between 1 and 0" not in message
    one = tmp_path / "one.csv"
    one.write_text("movie_title,first_actor,second_actor\nA,Ana Smith,John Ponce\n")
    with pytest.raises(DatasetError, match="only 1 usable fact .* a split dataset needs 2"):
        build_dataset(DatasetConfig(kind="custom", facts_path=one, split=True))


def test_cli_facts_without_usable_names_exits_2(tmp_path):
    facts = tmp_path / "facts.jsonl"
    facts.write_text('{"movie_title": "A", "first_actor": "Cher", "second_actor": "Madonna"}\n')
    result = _cli(["--facts", str(facts), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "no usable fact" in result.output, result.output
    assert not (tmp_path / "out").exists()
    facts.write_text('{"movie_title": "A", "first_actor"\n')
    result = _cli(["--facts", str(facts), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "line 1: not valid JSON" in result.output, result.output


def test_an_unwritable_dataset_folder_is_a_one_line_error(tmp_path):
    # found by tests/cli/test_bad_inputs.py: a too-long --out was an OSError traceback
    out = tmp_path / ("x" * 300)
    with pytest.raises(StorageError, match="cannot write the dataset to .*File name too long"):
        generate_dataset(DatasetConfig(n_facts=2), out)
    assert list(tmp_path.iterdir()) == []
