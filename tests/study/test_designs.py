"""The paper's designs (graft.study.designs), built without running: which runs each needs,
with which models, prompts and folders, and the bad input each refuses. Running them is
tested through the commands (tests/cli) and docs/reference/api.md's example (tests/test_api_readme.py)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from graft.core import LocalExecutor
from graft.errors import ExperimentError, SpecError
from graft.remote import RemoteConfig
from graft.study import (
    ExperimentConfig,
    LensAnalysis,
    ModelSource,
    component_design,
    layers_design,
    lens_design,
    patching_design,
    position_design,
    resolve,
)
from graft.study.analyses.patching import PatchingExecutor
from graft.study.designs import run_methods, summary_lines
from graft.study.running.runner import default_out


def specs(tmp_path: Path, **options):
    return resolve(ExperimentConfig(model="tiny-llama", workspace=str(tmp_path), **options))


def test_position_is_one_run_with_the_protocols_donor(tmp_path):
    ours = position_design(specs(tmp_path), positions=["FE", "LT"])
    ((name, request),) = ours.runs.items()
    assert name == "" and ours.folder == default_out(request.specs)
    assert [g.name for g in request.grafts] == ["PRE", "SFT", "FE", "LT"]
    assert request.donors == {"sft": ModelSource("one")} and request.data_direction == "one"
    assert request.specs.experiment == "position"
    paper = position_design(specs(tmp_path, protocol="paper"), positions=["LT"]).runs[""]
    assert paper.donors == {"sft": ModelSource("both")}
    assert (paper.data_direction, paper.out_tag) == ("both", "paper")
    given = position_design(specs(tmp_path, protocol="paper"), ["LT"], variant="one").runs[""]
    assert given.donors == {"sft": ModelSource("one")} and given.data_direction == "one"


def test_component_runs_each_pair_into_its_folder_and_combines_several(tmp_path):
    design = component_design(specs(tmp_path, out=str(tmp_path / "e3")), layers="h2")
    assert list(design.runs) == ["sft", "reversal"] and design.finish is not None
    sft, reversal = design.runs["sft"], design.runs["reversal"]
    assert sft.specs.execution.out == str(tmp_path / "e3" / "sft")
    assert (sft.specs.data.directions, reversal.specs.data.directions) == (
        ("forward",),
        ("reverse",),
    )
    assert (reversal.base, reversal.donors) == (ModelSource("one"), {"sft": ModelSource("both")})
    assert {g.group for g in reversal.grafts} == {"reversal"}
    alone = component_design(specs(tmp_path), pairs=["reversal"])
    assert list(alone.runs) == ["reversal"] and alone.finish is None


@pytest.mark.parametrize(
    ("options", "error", "param"),
    [
        ({"pairs": ["sideways"]}, ExperimentError, "pairs"),
        ({"pairs": []}, ExperimentError, "pairs"),
        ({"layers": "q5"}, SpecError, "layers"),
        ({"fe": "mpl"}, SpecError, "fe"),
    ],
)
def test_component_names_the_argument_of_bad_input(tmp_path, options, error, param):
    with pytest.raises(error) as info:
        component_design(specs(tmp_path), **options)
    assert info.value.param == param


def test_layers_refuses_what_the_protocols_rule_lacks(tmp_path):
    design = layers_design(specs(tmp_path), n_layers=8, positions=["LT"], windows="halves")
    assert [g.name for g in design.runs[""].grafts][2:] == ["LT | h1", "LT | h2"]
    with pytest.raises(ExperimentError, match="halves and quarters only") as info:
        layers_design(specs(tmp_path, protocol="paper"), n_layers=8, windows="eighths")
    assert info.value.param == "windows"
    with pytest.raises(ExperimentError, match="positive integer width"):
        layers_design(specs(tmp_path), n_layers=8, windows="0")


def test_lens_is_the_sft_run_with_the_lens_as_its_analysis(tmp_path):
    design = lens_design(specs(tmp_path), graft_specs=["mine=LT:h2:o"], top_k=7)
    request = design.runs[""]
    (analysis,) = request.analyses
    assert isinstance(analysis, LensAnalysis) and analysis.top_k == 7
    assert [g.name for g in request.grafts] == ["PRE", "SFT", "FE", "LT", "FE+LT", "mine"]
    with pytest.raises(SpecError) as info:
        lens_design(specs(tmp_path), graft_specs=["LT:all"])
    assert info.value.param == "graft_specs"
    remote = RemoteConfig(mode="simulate")
    with pytest.raises(ExperimentError, match="this machine only"):
        lens_design(specs(tmp_path, remote=remote))


@pytest.mark.slow  # loads the tiny model for its architecture and tokenizer
def test_patching_runs_one_folder_per_direction_and_method(tmp_path):
    design = patching_design(
        specs(tmp_path, out=str(tmp_path / "sweep")), units=["LT"], kinds=["attn", "residual"]
    )
    assert list(design.runs) == [
        "restore-weights",
        "restore-activation",
        "restore-residual",
        "break-weights",
        "break-activation",
        "break-residual",
    ]
    broken = design.runs["break-weights"]
    assert broken.base == ModelSource("one") and broken.donors == {"pre": ModelSource()}
    assert broken.specs.execution.out == str(tmp_path / "sweep" / "break-weights")
    # layer reuse (the default): weights on the engine's executor resuming from the first
    # changed layer, patching on the patching executor; without it the engine's default
    weights = design.runs["restore-weights"].executor
    assert isinstance(weights, LocalExecutor) and weights.resume_layers
    assert isinstance(design.runs["restore-activation"].executor, PatchingExecutor)
    whole = patching_design(
        specs(tmp_path, out=str(tmp_path / "whole")), units=["LT"], kinds=["attn"], reuse=False
    )
    assert whole.runs["restore-weights"].executor is None
    assert not whole.runs["restore-activation"].executor.reuse
    with pytest.raises(ExperimentError) as info:
        patching_design(specs(tmp_path), window=99)
    assert info.value.param == "window"


def test_a_sweeps_runs_and_findings_lines():
    assert run_methods(["weights", "patching"], ["residual"], []) == ["weights", "residual"]
    assert run_methods(["patching"], ["mlp"], []) == ["activation"]
    assert run_methods(["patching"], ["residual"], ["FE"]) == ["activation", "residual"]
    findings = pl.DataFrame(
        {
            "direction": ["restore"],
            "kind": ["mlp"],
            "unit": ["LT"],
            "method": ["weights"],
            "peak_effect": [0.8],
            "peak_layer": [3],
            "first_layer_half": [None],
            "layers_tested": [4],
            "layers_differ": [1],
        }
    )
    assert summary_lines(findings) == [
        "restore mlp LT [weights]: peak effect 0.80 at layer 3, half reached never; "
        "methods differ at 1 of 4 layers"
    ]
