"""A dataset's input files against its kind (a file without its kind, a kind without its
file, two files), said before anything reads a file, in flags on the command line and in
field names in Python; extra facts-file columns; a split set asked of an unsplit dataset."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from graft.errors import DatasetError, FinetuneError
from graft.study import Workspace
from graft.study.data import training_data
from graft.study.data.datasets import DatasetConfig, default_dataset_name, generate_dataset
from graft_experiments.data import data as data_command

FACTS = "movie_title,first_actor,second_actor\nRed Dog,Ana Smith,John Ponce\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--dataset", "articles"],
            "--dataset articles is made from a file: set --articles",
        ),
        (
            ["--dataset", "relation"],
            "--dataset relation is made from a file: set --relation",
        ),
        (
            ["--dataset", "articles", "--facts", "casts.csv"],
            "--dataset articles is made from a file: set --articles and drop --facts, or use "
            "--dataset custom",
        ),
        (
            ["--dataset", "fake_movies_fake_actors", "--facts", "casts.csv"],
            "--facts goes with --dataset custom only: drop --facts, or use --dataset custom",
        ),
        (
            ["--dataset", "custom", "--articles", "casts.csv"],
            "--dataset custom is made from a file: set --facts and drop --articles, or use "
            "--dataset articles",
        ),
        (
            ["--articles", "casts.csv", "--facts", "casts.csv"],
            "--facts and --articles cannot go together",
        ),
        (["--dataset", "custom"], "--dataset custom is made from a file: set --facts"),
    ],
)
def test_cli_input_file_mistakes_exit_2_in_one_line(tmp_path, monkeypatch, args, message):
    """No --out: the workspace's folder name is not read from a file before the check."""
    monkeypatch.chdir(tmp_path)
    Path("casts.csv").write_text(FACTS)
    result = CliRunner().invoke(data_command, [*args, "--workspace", "ws"])
    assert result.exit_code == 2, result.output
    assert message in result.output, result.output
    assert isinstance(result.exception, SystemExit)  # no AssertionError
    assert "facts_path" not in result.output and "articles_path" not in result.output
    assert not Path("ws").exists()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"kind": "articles"}, "kind='articles' is made from a file: set articles_path"),
        ({"kind": "relation"}, "kind='relation' is made from a file: set relation_path"),
        (
            {"kind": "fake_movies_real_actors", "facts_path": "x.csv"},
            "facts_path goes with kind='custom' only: drop facts_path, or use kind='custom'",
        ),
    ],
)
def test_python_names_the_field_before_naming_the_folder(tmp_path, fields, message):
    with pytest.raises(DatasetError, match=message) as err:
        Workspace.at(tmp_path).dataset_folder(DatasetConfig(**fields))
    assert err.value.param is not None
    with pytest.raises(DatasetError, match=message):
        default_dataset_name(DatasetConfig(**fields))


def test_extra_facts_columns_are_ignored_with_a_warning(tmp_path, caplog):
    facts = tmp_path / "casts.csv"
    facts.write_text(
        "movie_title,first_actor,notes,second_actor,genre,studio\n"
        "Red Dog,Ana Smith,x,John Ponce,drama,Acme\n"
        "Blue Cat,Mia Lopez,y,Tom Hardy,comedy,Acme\n"
    )
    with caplog.at_level(logging.WARNING, logger="graft"):
        out = generate_dataset(DatasetConfig(kind="custom", facts_path=facts), tmp_path / "d")
    said = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"facts file {facts}: columns notes, studio ")
    assert "genre" not in said[0].split("ignored")[0]
    assert (out / "facts.jsonl").read_text().count('"genre": "drama"') == 1


def test_a_split_set_of_an_unsplit_dataset_says_how_to_split(dataset):
    with pytest.raises(FinetuneError, match="is not split") as err:
        training_data.load_fact_dataset(dataset, "A")
    said = str(err.value)
    assert "graft-exp data --split" in said and "data kind" in said
    assert "articles and relation datasets cannot be split" in said
