"""graft.results.record: a run's config.json read back typed, a replicated run's
replicates and a record of an older graft (fields absent) alike; no record is bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graft.errors import DamagedFileError
from graft.results import ModelEntry, ReplicateEntry, RunRecord, read_run_record

REPLICATED = {
    "experiment": "component",
    "options": {"model": "smollm2-135m", "data_seed": 0, "finetune_seeds": [0, 1]},
    "grafts": [
        {"name": "SFT", "group": "sft", "spec": "-"},
        {"name": "O+FFN", "group": "sft", "spec": "LT:all:o,mlp"},
        {"name": "SFT", "group": "reversal", "spec": "-"},
    ],
    "base": {"path": "/ws/base", "fingerprint": "ab"},
    "donors": {"sft": {"path": "/ws/donor", "fingerprint": "cd"}},
    "dataset": {"path": "/ws/data-seed0", "manifest_sha256": "ef"},
    "replicates": [
        {"label": "f0", "data_seed": 0, "finetune_seed": 0, "dataset": {"path": "/ws/d0"}},
        {"label": "f1", "data_seed": 0, "finetune_seed": 1, "dataset": {"path": "/ws/d0"}},
    ],
    "pairs": ["sft", "reversal"],
    "run_key": "k" * 32,
    "command": "graft-exp component",
    "git_dirty": False,
    "resumes": [{"time": "t"}, "not a record"],
}


def test_a_replicated_runs_record_reads_back_typed(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(REPLICATED))
    record = read_run_record(tmp_path)
    assert record == read_run_record(tmp_path / "config.json")  # a folder or its file
    assert (record.experiment, record.model, record.run_key) == (
        "component",
        "smollm2-135m",
        "k" * 32,
    )
    assert record.graft_names == ["SFT", "O+FFN"]  # in run order, each once
    assert [g.group for g in record.grafts] == ["sft", "sft", "reversal"]
    assert record.base == ModelEntry("/ws/base", "ab")
    assert record.donors == {"sft": ModelEntry("/ws/donor", "cd")}
    assert record.dataset == Path("/ws/data-seed0")
    assert record.replicates[1] == ReplicateEntry("f1", 0, 1, Path("/ws/d0"))
    assert record.pairs == ("sft", "reversal") and record.runs == ()
    assert record.resumes == ({"time": "t"},)  # what is no record of a resume is left out
    assert record.git_dirty is False and record.git_commit is None
    assert record.raw["grafts"][1]["spec"] == "LT:all:o,mlp"


def test_an_older_records_absent_fields_read_as_empty():
    record = RunRecord.from_json({"grafts": [{"name": "PRE"}]})
    assert (record.experiment, record.model, record.run_key) == ("custom", "?", "")
    assert record.base is None and record.donors == {} and record.dataset is None
    assert record.replicates == () and record.packages is None and record.graft_names == ["PRE"]


def test_no_record_or_a_damaged_one_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no run's record"):
        read_run_record(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(DamagedFileError, match="not a JSON object"):
        read_run_record(tmp_path)
