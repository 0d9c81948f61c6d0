"""A run resolved once (graft.study.specs.run) and the protocols as objects
(graft.study.specs.protocol): defaults applied in one place, frozen specs, the run record's
schema and its round trip."""

from __future__ import annotations

import dataclasses
import json

import pytest

from graft.errors import ExperimentError
from graft.study.specs.config import ExperimentConfig, Replicate
from graft.study.specs.protocol import GRAFT, PAPER, protocol_of
from graft.study.specs.run import RECORD_SCHEMA, RunSpecs, resolve


def test_resolve_applies_every_protocol_default_once():
    ours = resolve(ExperimentConfig("position"))
    assert ours.protocol is GRAFT
    assert ours.analysis.head_policy == "base" and ours.execution.dtype is None
    assert ours.donors.preset is None and ours.donors.finetune_seeds == (0,)
    assert ours.data.data_seeds == (0,) and ours.replicates == (Replicate(0, 0),)
    paper = resolve(ExperimentConfig("position", protocol="paper"))
    assert paper.protocol is PAPER
    assert (paper.analysis.head_policy, paper.execution.dtype, paper.donors.preset) == (
        "paper",
        "float32",
        "paper",
    )
    given = resolve(
        ExperimentConfig(
            "position", protocol="paper", head_policy="base", dtype="bfloat16", preset="cpu"
        )
    )
    assert (given.analysis.head_policy, given.execution.dtype, given.donors.preset) == (
        "base",
        "bfloat16",
        "cpu",
    )
    assert resolve(given) is given  # resolved specs pass through


def test_options_and_specs_are_frozen():
    cfg = ExperimentConfig("position", templates=["qa"], finetune_seeds=[1, 2])
    assert cfg.templates == ("qa",) and cfg.finetune_seeds == (1, 2)  # normalised
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.n = 3  # type: ignore[misc]
    run = resolve(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.data.n = 3  # type: ignore[misc]
    assert run.replicated and len(run.replicates) == 2


def test_every_protocol_choice_is_a_field_and_unknown_names_are_one_line():
    assert protocol_of("paper") is PAPER and protocol_of(PAPER) is PAPER
    differs = [
        f.name
        for f in dataclasses.fields(GRAFT)
        if getattr(GRAFT, f.name) != getattr(PAPER, f.name)
    ]
    assert set(differs) == {f.name for f in dataclasses.fields(GRAFT)}  # each field a choice
    with pytest.raises(ExperimentError, match="protocol 'ours' unknown: use graft or paper"):
        protocol_of("ours")


def test_the_configs_hold_the_protocol_object_and_records_its_name():
    """A name given to a config is looked up once; what is written holds the name."""
    assert ExperimentConfig("position").protocol is GRAFT
    cfg = ExperimentConfig("position", protocol="paper")
    assert cfg.protocol is PAPER and ExperimentConfig("position", protocol=PAPER) == cfg
    assert resolve(cfg).record()["protocol"] == "paper"
    assert json.loads(json.dumps(resolve(cfg).record()))["protocol"] == "paper"
    assert dataclasses.replace(cfg, protocol="graft").protocol is GRAFT


def test_the_record_has_a_schema_and_reads_back_into_the_same_specs():
    cfg = ExperimentConfig(
        "position", protocol="paper", n=5, templates=("qa",), finetune_seeds=(0, 1), workspace="ws"
    )
    run = resolve(cfg)
    record = json.loads(json.dumps(run.record()))  # as config.json stores it
    assert record["schema"] == RECORD_SCHEMA
    assert record["head_policy"] == "paper" and record["dtype"] == "float32"
    assert "remote" not in record and "progress" not in record
    back = RunSpecs.from_record(record)
    assert back.data == run.data and back.donors == run.donors and back.analysis == run.analysis
    assert back.protocol is run.protocol and back.replicates == run.replicates
    assert back.record() == run.record()
    # a record of a run of one leaves out the replicate options, and reads back too
    one = resolve(ExperimentConfig("position")).record()
    assert "finetune_seeds" not in one
    assert RunSpecs.from_record(one).replicates == (Replicate(0, 0),)
    # a record written before records had a schema reads back the same way
    old = {k: v for k, v in record.items() if k != "schema"}
    assert RunSpecs.from_record(old).record() == run.record()
