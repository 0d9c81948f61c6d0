"""The relation dataset (facts of any relation from a TOML file): its checks (each one line,
nothing written), the dataset folder it becomes (an articles dataset's), its name by
content, its FE/LT spans on the tiny tokenizer, and a run on it whose PRE, SFT and FE rows
equal the base, the donor and the token-by-token reference (tests/reference.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import polars as pl
import pytest
import torch

from graft.core.language.spec import parse_spec
from graft.core.planning.plan import GraftRow
from graft.errors import DatasetError
from graft.models import load_model, tiny_tokenizer
from graft.study.data.datasets import (
    DatasetConfig,
    default_dataset_name,
    generate_dataset,
    load_manifest,
    load_train_records,
)
from graft.study.data.files import read_jsonl
from graft.study.data.prompts import load_test_prompts
from graft.study.data.relation import EXAMPLE_RELATION, read_relation
from graft.study.specs.grafts import NamedGraft
from tests.core.api.test_continuation import hand_cells
from tests.engine_cases import own_forward
from tests.reference import reference_last_logits
from tests.study.test_articles import _check_spans
from tests.study.tiny_run import REFERENCES, run_with_donor, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

TOML = """name = "employer"
facts = "people.csv"
train = ["{subject} works at {object}.", "At {object}, {subject} leads {team}."]
[test]
cloze = "{subject} works at {object}"
qa = "Q: Where does {subject} work?\\nA: {object}"
"""
CSV = "subject,object,team\nIda Marr,Venn Labs,a crew\nRolf Iver,Pike Boats,the yard\n"
LOGPROB_TOL = 2e-5  # the engine's 1e-5 on logits, twice through a log-softmax


def write(folder: Path, toml: str = TOML, csv: str = CSV, facts: str = "people.csv") -> Path:
    (folder / facts).write_text(csv)
    (folder / "rel.toml").write_text(toml)
    return folder / "rel.toml"


def config(path: Path, **kw) -> DatasetConfig:
    return DatasetConfig(kind="relation", relation_path=path, **kw)


@pytest.mark.parametrize(
    "toml, csv, message",
    [
        (TOML.replace("people.csv", "nope.csv"), CSV, "facts file .*nope.csv does not exist"),
        ("extra = 1\n" + TOML, CSV, r"unknown key 'extra'; the keys are name, facts"),
        (TOML.replace('{object}"\nqa', '{object}."\nqa'), CSV, "'cloze' must end with"),
        (TOML.replace("does {subject} work", "do they work"), CSV, r"'qa' lacks \{subject\}"),
        (TOML.replace("{team}", "{boss}"), CSV, r"train template 2: no row .* has \{boss\}"),
        (TOML, CSV.replace("Ida Marr,", ","), r"row 1: 'subject' is empty; fill it in"),
        (TOML, CSV.replace("Venn Labs", " "), r"row 1: 'object' is empty"),
        (TOML, CSV.replace("the yard", ""), r"row 2: 'team' is empty"),
        (
            TOML.replace("{subject} works", "{subject}s works"),
            CSV,
            r"row 1: subject 'Ida Marr' is not a whole word of its test prompt 'cloze'",
        ),
        (TOML, CSV + "Ida Marr,Other Co,a crew\n", "row 3: subject 'Ida Marr' is also the subject"),
        (TOML, "name,object\nIda Marr,Venn Labs\n", "has no column 'subject'"),
        ("train = [", CSV, "is not valid TOML"),
        (TOML.replace("[test]", "[tests]"), CSV, "unknown key 'tests'"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, toml, csv, message):
    path = write(tmp_path, toml, csv)
    with pytest.raises(DatasetError, match=message) as err:
        generate_dataset(config(path), tmp_path / "ds")
    assert "\n" not in str(err.value) and err.value.param == "relation_path"
    assert not (tmp_path / "ds").exists()


def test_missing_relation_file(tmp_path):
    with pytest.raises(DatasetError, match="relation file .* does not exist") as err:
        generate_dataset(config(tmp_path / "none.toml"), tmp_path / "ds")
    assert err.value.param == "relation_path" and not (tmp_path / "ds").exists()


def test_dataset_folder_from_a_relation(tmp_path, caplog):
    repeated = CSV + "Ida Marr,Venn Labs,a crew\n"
    path = write(tmp_path, csv=repeated)
    with caplog.at_level(logging.WARNING, logger="graft.study.data.relation"):
        out = generate_dataset(config(path), tmp_path / "ds")
    # the repeated row: one warning line, listed in the manifest
    assert "people.csv: 1 of 3 rows left out: row 3 (repeats an earlier row)" in caplog.text
    manifest = load_manifest(out)
    assert manifest["kind"] == "relation" and manifest["generator_version"] == "graft.relation/1"
    assert manifest["dropped_row_numbers"] == {"repeated_row": [3]}
    assert manifest["sizes"]["facts"] == 2 and manifest["sizes"]["test_prompts"] == 4
    assert manifest["relation"]["test"]["cloze"] == "{subject} works at {object}"
    sources = manifest["sources"]
    assert sources["relation_path"] == str(path)
    assert Path(sources["relation_facts_path"]) == tmp_path / "people.csv"
    assert len(sources["relation_sha256"]) == len(sources["relation_facts_sha256"]) == 64
    assert [r["text"] for r in load_train_records(out)] == [
        "Ida Marr works at Venn Labs.",
        "At Venn Labs, Ida Marr leads a crew.",
        "Rolf Iver works at Pike Boats.",
        "At Pike Boats, Rolf Iver leads the yard.",
    ]
    tests = read_jsonl(out / "test_prompts.jsonl")
    assert [(r["id"], r["template"], r["text"], r["target"]) for r in tests] == [
        ("row1:q1", "cloze", "Ida Marr works at", "Venn Labs"),
        ("row1:q2", "qa", "Q: Where does Ida Marr work?\nA:", "Venn Labs"),
        ("row2:q1", "cloze", "Rolf Iver works at", "Pike Boats"),
        ("row2:q2", "qa", "Q: Where does Rolf Iver work?\nA:", "Pike Boats"),
    ]
    for r in tests:  # FE: the subject in its prompt; the answer follows after a space
        start, end = r["fields"]["FE"]
        assert r["text"][start:end] == ("Ida Marr" if r["fact_id"] == 0 else "Rolf Iver")
        assert r["target_text"] == " " + r["target"]
    # the same files: reused; the facts file edited: refused at the same folder
    assert generate_dataset(config(path), out) == out
    (tmp_path / "people.csv").write_text(CSV.replace("Pike Boats", "Pike Yards"))
    with pytest.raises(DatasetError, match="from another version of its input file"):
        generate_dataset(config(path), out)


def test_jsonl_facts_and_the_name_by_content(tmp_path):
    rows = [{"subject": "Ida Marr", "object": "Venn Labs", "team": 3}]
    toml = TOML.replace("people.csv", "people.jsonl").replace('name = "employer"\n', "")
    path = write(tmp_path, toml, "".join(json.dumps(r) + "\n" for r in rows), "people.jsonl")
    assert read_relation(path).name == "rel"  # the file's stem
    name = default_dataset_name(config(path))
    assert name.startswith("relation-rel-") and name.endswith("-nall")
    (tmp_path / "people.jsonl").write_text(json.dumps({**rows[0], "team": 4}) + "\n")
    assert default_dataset_name(config(path)) != name  # the facts file is in the name
    (tmp_path / "b").mkdir()
    other = write(tmp_path / "b")
    assert default_dataset_name(config(other)).startswith("relation-employer-")
    assert default_dataset_name(config(other, n_facts=1)).endswith("-n1")
    out = generate_dataset(config(other, n_facts=1), tmp_path / "one")
    assert load_manifest(out)["sizes"]["facts"] == 1
    with pytest.raises(DatasetError, match="choose n_facts between 1 and 2"):
        generate_dataset(config(other, n_facts=3), tmp_path / "three")


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"split": True}, "drop split"),
        ({"protocol": "paper"}, "drop protocol"),
        (
            {"kind": "articles"},
            "kind='articles' is made from a file: set articles_path and drop relation_path",
        ),
        ({"relation_path": None}, "kind='relation' is made from a file: set relation_path"),
    ],
)
def test_options_of_templated_datasets_are_refused(tmp_path, changes, message):
    fields = {"kind": "relation", "relation_path": write(tmp_path), **changes}
    with pytest.raises(DatasetError, match=message):
        generate_dataset(DatasetConfig(**fields), tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    """The shipped example's first three facts."""
    return generate_dataset(
        config(EXAMPLE_RELATION, n_facts=3), tmp_path_factory.mktemp("data") / "employer"
    )


def test_shipped_example(example):
    relation = read_relation(EXAMPLE_RELATION)
    assert len(relation.rows) >= 20 and not relation.dropped
    assert all(len(r["subject"].split()) >= 2 and r["subject"].isascii() for r in relation.rows)
    assert load_manifest(example)["answers_not_in_their_article"] == []


def test_spans_on_the_tiny_tokenizer(example):
    _check_spans(tiny_tokenizer(), example, exact=False)


def test_a_run_on_a_relation_dataset_is_exact(example, donor_path, tmp_path):
    """PRE is the base's own forward, SFT the donor's, FE the token-by-token reference
    grafting every component of the subject's tokens, on every prompt of both templates."""
    grafts = [*REFERENCES, NamedGraft("FE", parse_spec("FE:all:all"))]
    cfg = tiny_config(tmp_path / "run", dataset=str(example), templates=("cloze", "qa"), n=3)
    run_with_donor(cfg, grafts, donor_path)
    table = pl.read_parquet(tmp_path / "run" / "examples.parquet")
    assert table.height == 2 * 3 * 3
    base = load_model("tiny-llama", dtype="float32", device="cpu")
    donor = load_model(donor_path, dtype="float32", device="cpu")
    examples, _ = load_test_prompts(example, base.tokenizer)
    by_id = {ex.prompt_id: ex for ex in examples}
    for row in table.iter_rows(named=True):
        ex = by_id[row["prompt_id"]]
        assert row["target_id"] == ex.target_id
        if row["graft"] == "FE":
            cells = hand_cells(base.model, ex.spans["FE"])
            logits = reference_last_logits(base.model, {"sft": donor.model}, ex.input_ids, cells)
        else:
            model = base.model if row["graft"] == "PRE" else donor.model
            logits = own_forward(model, [GraftRow(ex.input_ids, ex.spans, parse_spec("none"))])[0]
        want = torch.log_softmax(logits.double(), -1)[ex.target_id].item()
        assert abs(want - row["target_logprob"]) <= LOGPROB_TOL, (row["prompt_id"], row["graft"])
