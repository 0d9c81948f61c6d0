"""The attribution experiment from Python (:mod:`graft.study.designs.attribution`,
:mod:`graft.study.specs.attribution`): a request run on a tiny llama pair writes the run
folder the command writes, its tables are the files, the printed lines are its numbers; a
bad request is one line before anything loads; docs/reference/attribution.md's example runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

import graft
from graft.core import DEFAULT_KINDS
from graft.errors import ExperimentError
from graft.models.tiny import perturbed_copy, tiny_model
from graft.study import AttributionRequest, attribution_lines, run_attribution
from tests.study.test_entity_prompts import dataset

TEXT, TARGET, ENTITY = "the cat sat on the mat and", " a", "cat"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "attribution.md"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny llama and a copy 2% away, saved as model folders: (base, donor)."""
    root = tmp_path_factory.mktemp("attribution_pair")
    base = tiny_model("llama")
    for name, model in (("base", base), ("donor", perturbed_copy(base, seed=100, scale=0.02))):
        model.save_pretrained(root / name)
        graft.tiny_tokenizer().save_pretrained(root / name)
    return str(root / "base"), str(root / "donor")


@pytest.mark.slow
def test_a_request_writes_the_run_folder_and_its_lines(models, tmp_path):
    base, donor = models
    request = AttributionRequest(
        donor, TEXT, TARGET, ENTITY, base=base, kinds="mlp", verify=2, multi_cell=True
    )
    done = run_attribution(request, tmp_path / "run")
    written = {p.relative_to(done.folder.path).as_posix() for p in done.folder.path.rglob("*")}
    tables = ["estimates", "summary", "verify", "multicell", "multicell_summary"]
    assert {*(f"{t}.csv" for t in tables), "config.json", "figures/attribution_map.png"} <= written
    assert pl.read_csv(done.folder.path / "estimates.csv").equals(done.table)
    assert len(done.table) == 4 * 2  # layers x units (FE, LT), one kind
    assert pl.read_csv(done.folder.path / "verify.csv")["real"].len() == 2
    assert done.multicell is not None and done.multicell_summary is not None
    record = json.loads((done.folder.path / "config.json").read_text())
    assert record["options"]["kinds"] == ["mlp"] and record["options"]["entity"] == [ENTITY]
    assert record["cells"] == len(done.table) and set(done.timings) == {
        "attribution_seconds",
        "verify_seconds",
        "multicell_seconds",
    }
    lines = attribution_lines(done)
    assert re.fullmatch(
        rf"attribution: 8 cells in \d+\.\d s -> {tmp_path}/run/estimates.csv", lines[0]
    )
    assert lines[1].startswith("verify: 2 real grafts") and "Pearson" in "".join(lines)
    assert lines[-5].startswith("multi-cell: 7 real grafts")
    again = run_attribution(request, tmp_path / "run")  # resumed: the same tables
    assert again.table.equals(done.table)


def test_the_record_keeps_the_code_as_the_run_began(models, tmp_path, monkeypatch):
    """config.json is stored when the run ends: the commit and dirty state it records are
    the ones the run started from, not a change made while it computed."""
    import graft.study.designs.attribution as design

    tree = {"dirty": False}
    monkeypatch.setattr(design, "git_dirty", lambda: tree["dirty"])
    monkeypatch.setattr("graft.results.folder.git_dirty", lambda: tree["dirty"])
    estimate = design.attribute

    def edited_meanwhile(*args, **kwargs):
        tree["dirty"] = True
        return estimate(*args, **kwargs)

    monkeypatch.setattr(design, "attribute", edited_meanwhile)
    request = AttributionRequest(models[1], TEXT, TARGET, ENTITY, base=models[0], kinds=["o"])
    done = run_attribution(request, tmp_path / "run")
    assert tree["dirty"] and done.config["git_dirty"] is False
    assert json.loads((done.folder.path / "config.json").read_text())["git_dirty"] is False


def test_a_datasets_prompts_are_the_requests(models, tmp_path):
    data = dataset(tmp_path / "data")
    request = AttributionRequest(models[1], base=models[0], kinds=["o"], dataset=data, n_prompts=1)
    done = run_attribution(request, tmp_path / "run")
    assert done.config["options"]["texts"] == ["Ann Lee starred in a movie with"]
    assert (done.config["options"]["dataset"], done.config["options"]["n"]) == (str(data), 1)
    assert attribution_lines(done)[0].startswith("attribution: 8 cells in ")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "give the prompts: texts and targets"),
        ({"texts": TEXT, "targets": ["a", "b"]}, "targets: one per text (1), or one for all"),
        ({"texts": TEXT, "targets": TARGET, "entity": ["cat", "mat"]}, "entity: one per text (1)"),
        ({"texts": TEXT, "targets": TARGET, "entity": "dog"}, "entity 'dog' does not occur"),
        ({"texts": TEXT, "dataset": "data"}, "drop texts, targets and entity"),
        ({"texts": TEXT, "targets": TARGET, "n_prompts": 3}, "choose a dataset's prompts"),
        ({"dataset": "data", "n_prompts": 0}, "n_prompts=0: give 1 or more"),
        ({"texts": TEXT, "targets": TARGET, "metric": "prob"}, "metric 'prob': choose logprob"),
        (
            {"texts": TEXT, "targets": TARGET, "estimator": "exact"},
            "estimator 'exact': choose local or linear",
        ),
        ({"texts": TEXT, "targets": TARGET, "verify": -1}, "verify=-1: give a number of cells"),
        ({"texts": TEXT, "targets": TARGET, "verify": "all"}, "verify='all': give a number"),
    ],
)
def test_a_bad_request_is_one_line_before_anything_loads(fields, message):
    with pytest.raises(ExperimentError) as caught:
        AttributionRequest("no-such-donor", **fields)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_strings_are_one_prompt_and_no_kinds_the_default_kinds():
    request = AttributionRequest("donor", TEXT, TARGET, ENTITY, kinds=())
    assert (request.texts, request.targets, request.entity) == ((TEXT,), (TARGET,), (ENTITY,))
    assert request.kinds == DEFAULT_KINDS


@pytest.mark.slow
def test_the_pages_python_example_runs(models, tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    code = next(b for b in blocks if "run_attribution(" in b)
    assert len(code.splitlines()) <= 12
    tiny = code.replace("AttributionRequest(\n", "AttributionRequest(\n    base=base,\n")
    assert tiny != code
    monkeypatch.chdir(tmp_path)
    namespace = {"base": models[0], "finetuned_folder": models[1]}
    exec(compile(tiny, "docs/reference/attribution.md", "exec"), namespace)
    assert (tmp_path / "attrib" / "estimates.csv").is_file()
    assert namespace["done"].checked is not None and len(namespace["done"].checked) == 5


def test_the_agreement_lines_give_the_interval_where_the_summary_has_one():
    from types import SimpleNamespace

    rows = [
        {"prompt": p, "layer": 0, "unit": "LT", "kind": "o", "estimate": e, "real": e * e}
        for p, e in enumerate(float(x) for x in range(1, 13))
    ]
    checked = pl.DataFrame(rows)
    table = checked.drop("real")
    done = SimpleNamespace(
        out="run",
        table=table,
        checked=checked,
        summary=graft.results.cell_summary(table, checked),
        multicell=None,
        multicell_summary=None,
        timings={"attribution_seconds": 1.0, "verify_seconds": 2.0},
    )
    low, high = graft.results.pearson_interval(checked)
    lines = [line for line in attribution_lines(done) if "Pearson" in line]  # LT and all
    assert len(lines) == 2 and all(f"[{low:.3f}, {high:.3f}]" in line for line in lines)
    done.summary = graft.results.cell_summary(table.head(3), checked.head(3))  # 3 prompts
    assert "[" not in next(line for line in attribution_lines(done) if "Pearson" in line)
