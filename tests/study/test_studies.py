"""A study from one TOML file (graft.study.studies): read and checked before anything is
written, planned (the donors shared, each once), run (donors first, a failed run recorded
while the others go on), reported per run and collected into one table whose rows are the
runs' own summaries."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

import graft.study.studies.execute as execute
from graft.errors import InputError, ResultsError
from graft.study import collect_study, plan_study, read_study, run_study, study_status
from graft.study.studies import FAILURES_FILE, study_runs
from graft.study.studies.figures import draw_study_figures, seed_means
from tests.study.study_files import TINY_OPTIONS, TINY_STUDY, tree, write_study

pytestmark = pytest.mark.usefixtures("one_thread")

#: one model x two seeds x position and necessity: two donors, each shared by two runs
SMALL = (
    'models = ["tiny-llama"]\nfinetune_seeds = [0, 1]\nexperiments = ["position", "necessity"]\n'
    + TINY_OPTIONS
)


def test_the_file_is_read_with_its_folders_resolved_against_it(tmp_path):
    study = read_study(write_study(tmp_path / "here", TINY_STUDY))
    assert list(study.models) == ["tiny-llama", "tiny-gpt2"]
    assert study.finetune_seeds == (0, 1)
    assert study.experiments == {
        "position": {"positions": ["FE", "LT"]},
        "component": {"pairs": ["sft"]},
        "necessity": {"positions": ["FE", "LT"]},
    }
    assert study.options["n_facts"] == 4 and study.options["progress"] is False
    assert study.workspace == (tmp_path / "here" / "ws").resolve()
    assert study.out == (tmp_path / "here" / "runs").resolve()
    runs = study_runs(study)
    assert [r.name for r in runs[:3]] == [
        "tiny-llama/seed0/position",
        "tiny-llama/seed0/component",
        "tiny-llama/seed0/necessity",
    ]
    assert len(runs) == 12 and len({r.folder for r in runs}) == 12
    component = runs[1]
    assert component.folder == study.out / "tiny-llama" / "seed0" / "component"
    assert component.run_folders() == {"sft": component.folder / "sft"}
    request = component.design.runs["sft"]
    assert request.specs.donors.finetune_seeds == (0,) and request.specs.data.n == 1
    assert runs[3].design.runs[""].specs.donors.finetune_seeds == (1,)
    assert tree(tmp_path) == ["here", "here/study.toml"]


def _tiny_folder(folder: Path) -> Path:
    from graft.models.tiny import tiny_config

    folder.mkdir(parents=True)
    tiny_config("llama").save_pretrained(folder)
    return folder


@pytest.mark.parametrize("entry", ["../models/myllama", "mine"])
def test_a_relative_model_folder_is_relative_to_the_file(tmp_path, monkeypatch, entry):
    target = _tiny_folder(tmp_path / ("models/myllama" if entry.startswith("..") else "study/mine"))
    text = SMALL.replace('["tiny-llama"]', f'["{entry}", "tiny-gpt2"]')
    path = write_study(tmp_path / "study", text)
    monkeypatch.chdir(tmp_path)  # the file's parent: the entry names nothing from here
    study = read_study("study/study.toml")
    assert list(study.models) == [entry, "tiny-gpt2"]
    assert study.model_source(entry) == str(target.resolve())
    assert study.model_source("tiny-gpt2") == "tiny-gpt2"
    runs = study_runs(study)
    assert runs[0].name == f"{entry}/seed0/position"  # named as the file names it
    assert runs[0].design.runs[""].specs.donors.model == str(target.resolve())
    monkeypatch.chdir(path.parent)  # the same runs from the file's own folder
    assert [r.folder for r in study_runs(read_study("study.toml"))] == [r.folder for r in runs]


def test_a_missing_relative_model_folder_names_the_file(tmp_path, monkeypatch):
    text = SMALL.replace('["tiny-llama"]', '["../models/nothing"]')
    write_study(tmp_path / "study", text)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"study\.toml: .*nothing"):
        study_runs(read_study("study/study.toml"))


BAD = [
    ("colour = 1\n" + SMALL, "unknown key 'colour'; the keys are models"),
    (SMALL.replace('"necessity"]', '"necessity", "banana"]'), "unknown experiment 'banana'"),
    (SMALL.replace('models = ["tiny-llama"]\n', ""), "no models; add models = "),
    (SMALL.replace("n = 1", "n = 1\nbogus = 2"), "[options] has no option 'bogus'"),
    (SMALL.replace("n = 1", "n = 1\nmodel = 'x'"), "[options] model: list it under models"),
    (SMALL.replace("n_boot = 10", "n_boot = 1"), "tiny-llama, finetune seed 0, position: n_boot"),
    (SMALL.replace("[0, 1]", "[0, 0]"), "finetune_seeds must be a list of distinct"),
    (SMALL.replace('["tiny-llama"]', "3"), "models must be a list of names or [models.NAME]"),
    (
        SMALL.replace('models = ["tiny-llama"]\n', "") + '[models.tiny-llama]\nseed = "a"\n',
        "tiny-llama, finetune seed 0, position: ",
    ),
    (SMALL + "oops", "is not valid TOML"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_a_bad_file_is_one_line_naming_the_key(tmp_path, text, message):
    path = write_study(tmp_path, text)
    with pytest.raises(InputError) as caught:
        study_runs(read_study(path))
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert tree(tmp_path) == ["study.toml"]


def test_an_experiment_option_is_its_designs_and_is_checked(tmp_path):
    bad = SMALL.replace('experiments = ["position", "necessity"]\n', "")
    bad += "[experiments.position]\nlayers = 'q4'\n"
    with pytest.raises(InputError, match=r"\[experiments.position\] has no option 'layers'; use "):
        read_study(write_study(tmp_path, bad))
    spec = bad.replace("[experiments.position]", "[experiments.component]")
    spec = spec.replace("layers = 'q4'", "layers = 'q9'")
    with pytest.raises(InputError, match="tiny-llama, finetune seed 0, component: "):
        study_runs(read_study(write_study(tmp_path, spec)))


def test_the_plan_shares_each_donor_and_writes_nothing(tmp_path):
    study = read_study(write_study(tmp_path, SMALL))
    plan = plan_study(study)
    assert [p.run.name for p in plan.runs] == [
        "tiny-llama/seed0/position",
        "tiny-llama/seed0/necessity",
        "tiny-llama/seed1/position",
        "tiny-llama/seed1/necessity",
    ]
    assert len(plan.donors) == 2  # one per finetune seed, each shared by two runs
    for donor, seed in zip(plan.donors.values(), (0, 1), strict=True):
        assert donor.runs == [f"tiny-llama/seed{seed}/position", f"tiny-llama/seed{seed}/necessity"]
        assert donor.request.config.seed == seed and not donor.plan.finished
        assert donor.plan.folder.is_relative_to(study.workspace)
    assert plan.runs[0].donors == plan.runs[1].donors != plan.runs[2].donors
    # the donor's finetune time goes to the first run that needs it
    assert plan.runs[0].seconds > 0 and plan.runs[1].seconds == 0
    assert plan.seconds == pytest.approx(sum(d.plan.seconds for d in plan.donors.values()))
    lines = plan.lines()
    assert (
        lines[0].startswith("plan of study")
        and "4 runs: 1 model x 2 finetune seeds x 2 experiments" in lines[1]
    )
    assert "donors: 2 (2 to finetune" in lines[2] and lines[-1].startswith("total: ")
    assert tree(tmp_path) == ["study.toml"]
    statuses = study_status(study)
    assert [s.state for s in statuses] == ["not started"] * 4
    with pytest.raises(ResultsError, match="no run of .* has finished yet"):
        collect_study(study)
    assert tree(tmp_path) == ["study.toml"]


def test_a_failed_run_is_recorded_and_the_others_go_on(tmp_path, monkeypatch):
    study = read_study(write_study(tmp_path, SMALL.replace("[0, 1]", "[0]")))
    made, ran = [], []
    monkeypatch.setattr(execute, "run_donor_job", lambda request, *a, **k: made.append(request))

    def fake_run(design, echo=None):
        ran.append(design.folder)
        if design.experiment == "position":
            raise RuntimeError("out of luck\nsecond line")
        return "done"

    monkeypatch.setattr(execute, "run_design", fake_run)
    said: list[str] = []
    result = run_study(study, echo=said.append)
    assert len(made) == 1  # the shared donor once, before the runs
    assert [p.name for p in ran] == ["position", "necessity"]  # the failure did not stop it
    assert result.failed == {"tiny-llama/seed0/position": "RuntimeError: out of luck"}
    assert list(result.runs) == ["tiny-llama/seed0/necessity"] and not result.ok
    record = json.loads((study.out / FAILURES_FILE).read_text())
    assert record == result.failed
    assert said[-1].startswith("study: 1 runs done, 1 failed")
    states = {s.run.name: (s.state, s.detail) for s in study_status(study)}
    assert states["tiny-llama/seed0/position"] == ("failed", "RuntimeError: out of luck")
    assert states["tiny-llama/seed0/necessity"][0] == "not started"  # the fake wrote nothing


def test_a_donor_that_fails_fails_its_runs_without_running_them(tmp_path, monkeypatch):
    study = read_study(write_study(tmp_path, SMALL.replace("[0, 1]", "[0]")))

    def broken(*args, **kwargs):
        raise OSError("disk on fire")

    monkeypatch.setattr(execute, "run_donor_job", broken)
    monkeypatch.setattr(execute, "run_design", lambda *a, **k: pytest.fail("ran"))
    result = run_study(study)
    assert set(result.failed) == {"tiny-llama/seed0/position", "tiny-llama/seed0/necessity"}
    assert all("disk on fire" in error for error in result.failed.values())
    assert len(result.donors) == 1


def test_a_long_failure_is_recorded_whole_with_its_fix(tmp_path, monkeypatch):
    study = read_study(write_study(tmp_path, SMALL.replace("[0, 1]", "[0]")))
    reason = "the donor is weak: " + "x" * 600 + "; set allow_weak_donor = true to use it"
    monkeypatch.setattr(execute, "run_donor_job", lambda *a, **k: None)

    def weak(design, echo=None):
        raise InputError(reason + "\nsecond line")

    monkeypatch.setattr(execute, "run_design", weak)
    said: list[str] = []
    result = run_study(study, echo=said.append)
    record = json.loads((study.out / FAILURES_FILE).read_text())
    assert record["tiny-llama/seed0/position"] == f"InputError: {reason}"
    assert record == result.failed
    assert any(line.endswith("allow_weak_donor = true to use it") for line in said)


def _collected_like() -> pl.DataFrame:
    rows = []
    for model in ("m1", "m2"):
        for seed in (0, 1):
            for template in ("headline", "qa"):
                for graft, value in (("PRE", 0.1), ("LT", 0.5)):
                    acc = value + seed / 10 + (template == "qa") / 10
                    rows.append((model, seed, "position", "", template, graft, acc))
    columns = ["model", "finetune_seed", "experiment", "run", "template", "graft", "acc@5"]
    return pl.DataFrame(rows, schema=columns, orient="row")


def test_the_figure_has_each_seeds_mean_over_templates_per_model(tmp_path):
    table = _collected_like()
    means = seed_means(table, "acc@5").sort("model", "finetune_seed", "label")
    got = means.filter(pl.col("model") == "m1").sort("finetune_seed", "label")
    assert got["label"].to_list() == ["LT", "PRE", "LT", "PRE"]
    assert got["acc@5"].to_list() == pytest.approx([0.55, 0.15, 0.65, 0.25])
    (png,) = draw_study_figures(table, tmp_path / "figures")
    assert png == tmp_path / "figures" / "position_acc5.png" and png.stat().st_size > 1000
    assert (tmp_path / "figures" / "position_acc5.pdf").is_file()


@pytest.mark.slow
def test_the_example_study_file_parses_and_plans(tmp_path):
    """examples/study.toml: every run made; one model and seed planned (the whole plan of
    24 runs of the paper's models takes minutes here)."""
    study = read_study(Path(__file__).resolve().parents[2] / "examples" / "study.toml")
    runs = study_runs(study)
    assert len(runs) == 2 * 3 * 4 and runs[-1].name == "gemma3-270m/seed2/lens"
    first = next(iter(study.models))
    small = replace(study, models={first: {}}, finetune_seeds=(0,), workspace=tmp_path / "ws")
    plan = plan_study(small)
    assert [p.run.experiment for p in plan.runs] == ["position", "component", "necessity", "lens"]
    assert len(plan.donors) == 1 and plan.lines()[-1].startswith("total: ")
    assert tree(tmp_path) == []


@pytest.mark.slow
def test_a_study_plans_runs_reports_and_collects(tmp_path):
    """2 tiny models x 2 finetune seeds x position, component, necessity, end to end."""
    study = read_study(write_study(tmp_path, TINY_STUDY))
    plan = plan_study(study)
    assert len(plan.runs) == 12 and len(plan.donors) == 4
    assert tree(tmp_path) == ["study.toml"]
    result = run_study(study)
    assert result.ok and len(result.runs) == 12
    assert all(d.exists() for d in plan.donors)  # the planned donors are the ones made
    assert {s.state for s in study_status(study)} == {"done"}
    again = run_study(study)  # resumes: every run finds its batches done
    resumed = [run for done in again.runs.values() for run in done.runs.values()]
    assert again.ok and len(resumed) == 12 and not any(any(r.computed.values()) for r in resumed)
    collected = collect_study(study)
    table = collected.table
    assert collected.folder == study.out / "collected" and not collected.missing
    assert pl.read_parquet(collected.files["summary.parquet"]).equals(table)
    assert pl.read_csv(collected.files["summary.csv"]).height == table.height
    heights = 0
    for run in study_runs(study):
        for name, folder in run.run_folders().items():
            own = pl.read_parquet(folder / "summary.parquet")
            mine = table.filter(
                (pl.col("model") == run.model)
                & (pl.col("finetune_seed") == run.finetune_seed)
                & (pl.col("experiment") == run.experiment)
                & (pl.col("run") == name)
            )
            assert mine["run_folder"].unique().to_list() == [str(folder)]
            assert mine.select(own.columns).equals(own), run.name  # values, not only shapes
            heights += own.height
    assert table.height == heights
    assert table.select("model", "finetune_seed").unique().height == 4
    provenance = json.loads(collected.files["provenance.json"].read_text())
    assert len(provenance["runs"]) == 12
    first = provenance["runs"][0]
    assert first["folder"] == str(study.out / "tiny-llama" / "seed0" / "position")
    assert first["experiment"] == "position" and first["command"] and first["run_key"]
    figures = sorted(p.name for p in (collected.folder / "figures").glob("*.png"))
    assert figures == ["component_acc5.png", "necessity_acc5.png", "position_acc5.png"]


def test_the_how_to_shows_the_example_study_file_as_it_is():
    """docs/how-to/study.md calls its TOML block examples/study.toml, which had grown
    (n_boot, component's layers, necessity) while the page's copy stayed behind."""
    import re
    import tomllib

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "how-to" / "study.md").read_text(encoding="utf-8")
    block = re.search(r"examples/study\.toml\).*?```toml\n(.*?)```", page, re.S)
    assert block is not None
    example = (root / "examples" / "study.toml").read_text(encoding="utf-8")
    assert tomllib.loads(block.group(1)) == tomllib.loads(example)
