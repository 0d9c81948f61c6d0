"""graft.study.analyses.top1: a tiny run's top-1 kinds, each row's top-1 token classified
against the names of the dataset its prompt came from, written into the run folder."""

from __future__ import annotations

from collections import Counter

import polars as pl
import pytest

from graft.core.language.spec import parse_spec
from graft.results import read_run_record
from graft.results.top1_kinds import KINDS, Top1Classifier
from graft.study.analyses.top1 import TOP1_KINDS, group_columns, write_top1_kinds
from graft.study.data.datasets import load_facts
from graft.study.running.runner import NamedGraft
from graft.study.specs.grafts import reference
from tests.study.tiny_run import run_with_donor, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_runs_top1_kinds_are_classified_against_its_datasets_names(dataset, donor_path, tmp_path):
    config = tiny_config(tmp_path / "run", dataset=str(dataset))
    grafts = [reference("PRE", None), NamedGraft("LT", parse_spec("LT:all:all"))]
    run = run_with_donor(config, grafts, donor_path)
    assert group_columns(run.examples) == ["template", "graft"]  # one seed, one group
    record = read_run_record(run.folder.path)  # the stored record, read back typed
    assert record == run.record
    assert (record.experiment, record.model, record.graft_names) == (
        "custom",
        "tiny-llama",
        ["PRE", "LT"],
    )
    assert record.dataset == dataset and record.donors["sft"].path == str(donor_path)
    assert record.run_key and record.replicates == () and record.pairs == ()

    table = write_top1_kinds(run.folder, run.examples, run.record)

    facts = load_facts(dataset)
    classify = Top1Classifier(
        {f.first_actor for f in facts} | {f.second_actor for f in facts},
        {f.movie_title for f in facts},
    ).kind
    want = Counter(
        (row["graft"], classify(row["top10_tokens"][0]))
        for row in run.examples.iter_rows(named=True)
    )
    assert table.height == 2 * len(KINDS)  # every kind of both grafts, zeros too
    got = {(r["graft"], r["kind"]): r["count"] for r in table.iter_rows(named=True)}
    assert got == {(g, k): want[g, k] for g in ("PRE", "LT") for k in KINDS}
    assert set(table["n"]) == {2}
    stored = pl.read_parquet(run.folder.path / f"{TOP1_KINDS}.parquet")
    assert stored.equals(table)
    assert (run.folder.path / f"{TOP1_KINDS}.csv").is_file()
