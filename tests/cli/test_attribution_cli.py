"""``graft-exp attribution`` on a tiny llama pair saved as model folders: the table, the map,
config.json and ``--verify``'s real grafts (their estimates the table's, the real effects
those of ``graft_texts``), ``--verify all`` and ``--multi-cell`` with their summaries, a run
folder ``graft-exp publish`` takes; bad input exits 2 and writes nothing."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch

import graft
from graft.models.tiny import perturbed_copy, tiny_model
from tests.cli.test_experiments import invoke
from tests.study.test_entity_prompts import dataset

TEXT, TARGET, ENTITY = "the cat sat on the mat and", " a", "cat"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("attribution_models")
    base = tiny_model("llama")
    tok = graft.tiny_tokenizer()
    for name, model in (("base", base), ("donor", perturbed_copy(base, seed=100, scale=0.02))):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


def attribution(folders) -> list[str]:
    """``graft-exp attribution`` on the tiny base and donor folders."""
    base, donor = str(folders / "base"), str(folders / "donor")
    return ["attribution", "--base-model", base, "--donor-model", donor]


@pytest.mark.slow
def test_table_map_and_verify(folders, tmp_path):
    out = tmp_path / "out"
    args = attribution(folders)
    args += ["--text", TEXT, "--target", TARGET, "--entity", ENTITY, "--out", str(out)]
    result = invoke(*args, "--kind", "o", "--kind", "qkv", "--verify", "3", "--estimator", "linear")
    table = pl.read_csv(out / "estimates.csv")
    assert table.columns == ["prompt", "layer", "unit", "kind", "estimate"]
    assert len(table) == 4 * 2 * 2  # layers x units x kinds
    assert (out / "figures" / "attribution_map.png").stat().st_size > 0
    record = json.loads((out / "config.json").read_text())
    assert record["options"]["kinds"] == ["o", "qkv"] and record["options"]["verify"] == 3
    assert record["options"]["estimator"] == "linear"
    linear = graft.attribute(
        *(graft.load_model(str(folders / n)) for n in ("base", "donor")),
        None,
        TEXT,
        TARGET,
        fields={"FE": ENTITY},
        kinds=["o", "qkv"],
        estimator="linear",
    )
    assert np.allclose(table["estimate"], linear["estimate"], rtol=1e-5, atol=1e-9)
    assert record["git_commit"] and record["machine"]["cpu_count"] and record["command"]
    assert record["cells"] == len(table) and record["verify_seconds"] > 0
    checked = pl.read_csv(out / "verify.csv")
    assert len(checked) == 3 and "real" in result.output
    joined = checked.join(table, on=["prompt", "layer", "unit", "kind"], suffix="_table")
    assert joined["estimate"].to_list() == joined["estimate_table"].to_list()
    base, donor = graft.load_model(str(folders / "base")), graft.load_model(str(folders / "donor"))
    tok = base.tokenizer
    target = tok(TARGET, add_special_tokens=False)["input_ids"][0]
    specs = [
        "none",
        *(f"{u}:{ly}:{k}" for u, ly, k in checked.select("unit", "layer", "kind").iter_rows()),
    ]
    logits = graft.graft_texts(base, donor, None, TEXT, specs, fields={"FE": ENTITY})
    real = logits.double().log_softmax(-1)[:, target]
    assert torch.allclose(
        torch.tensor(checked["real"].to_list(), dtype=torch.float64), real[1:] - real[0], atol=1e-5
    )


@pytest.mark.slow
def test_every_cell_and_multi_cell_sets_then_publish(folders, tmp_path):
    out, results = tmp_path / "out", tmp_path / "results"
    args = [*attribution(folders), "--text", TEXT, "--target", TARGET, "--entity", ENTITY]
    args += ["--kind", "mlp", "--verify", "all", "--multi-cell", "--out", str(out)]
    result = invoke(*args)
    table, checked = pl.read_csv(out / "estimates.csv"), pl.read_csv(out / "verify.csv")
    assert len(checked) == len(table) == 4 * 2  # every cell grafted
    summary = pl.read_csv(out / "summary.csv")
    assert summary.select("unit", "kind").rows() == [("FE", "mlp"), ("LT", "mlp"), ("all", "mlp")]
    assert (summary["verified"] == summary["cells"]).all()
    assert summary.filter(pl.col("unit") == "all")["top_k_overlap"].is_not_null().all()
    assert "agreement with the real grafts" in result.output and "Pearson" in result.output
    multi = pl.read_csv(out / "multicell.csv")
    assert multi["set"].to_list() == ["layer"] * 4 + ["FE", "LT", "FE+LT"]
    assert "multi-cell: 7 real grafts" in result.output
    sets = pl.read_csv(out / "multicell_summary.csv")
    assert sets["set"].to_list() == ["layer", "FE", "LT", "FE+LT"]
    invoke(*args)  # the same command again: resumes the folder, same tables
    assert pl.read_csv(out / "estimates.csv").equals(table)
    refused = invoke(*args[:-2], "--kind", "o", "--out", str(out), code=2)
    assert "different configuration" in refused.output
    published = invoke("publish", str(out), "--to", str(results))
    assert "attribution_summary.csv" in published.output
    provenance = json.loads((results / "provenance.json").read_text())
    entry = provenance["experiments"]["attribution"]
    assert entry["missing"] == [] and entry["experiment"] == "attribution"
    assert {"attribution_estimates.csv", "attribution_multicell.csv"} <= set(entry["files"])


def test_bad_input_exits_2_and_writes_nothing(folders, tmp_path):
    out = tmp_path / "out"
    common = [*attribution(folders), "--out", str(out)]
    result = invoke(*common, "--text", TEXT, "--target", TARGET, "--entity", "dog", code=2)
    assert "--entity 'dog' does not occur" in result.output
    invoke(
        *common,
        "--text",
        TEXT,
        "--text",
        TEXT,
        "--target",
        "a",
        "--target",
        "b",
        "--target",
        "c",
        code=2,
    )
    result = invoke(*common, "--text", TEXT, "--target", TARGET, "--kind", "nothing", code=2)
    assert "kind 'nothing'" in result.output
    result = invoke(*common, "--text", TEXT, "--target", TARGET, "--verify", "some", code=2)
    assert "'some': give a number of cells" in result.output
    result = invoke(*common, "--text", TEXT, "--target", TARGET, "--estimator", "exact", code=2)
    assert "'exact' is not one of 'local', 'linear'" in result.output
    assert not out.exists()


def test_a_datasets_prompts_are_the_texts_targets_and_entities(folders, tmp_path):
    # the handmade dataset's words are not the tiny tokenizer's, so the run is compared with
    # the same prompts given as --text / --target / --entity
    data = dataset(tmp_path / "data")
    common = [*attribution(folders), "--kind", "o"]
    invoke(*common, "--dataset", str(data), "--n-prompts", "2", "--out", str(tmp_path / "a"))
    record = json.loads((tmp_path / "a" / "config.json").read_text())["options"]
    assert record["texts"] == ["Ann Lee starred in a movie with", "Cy Dunn starred in a movie with"]
    assert record["targets"] == [" Bo Ray", " Di Fox"] and record["entity"] == [
        "Ann Lee",
        "Cy Dunn",
    ]
    assert (record["dataset"], record["template"], record["n"]) == (str(data), "headline", 2)
    by_hand = []
    for text, target, entity in zip(
        record["texts"], record["targets"], record["entity"], strict=True
    ):
        by_hand += ["--text", text, "--target", target, "--entity", entity]
    invoke(*common, *by_hand, "--out", str(tmp_path / "b"))
    assert pl.read_csv(tmp_path / "a" / "estimates.csv").equals(
        pl.read_csv(tmp_path / "b" / "estimates.csv")
    )


def test_a_dataset_excludes_text_and_bad_choices_exit_2(folders, tmp_path):
    out = tmp_path / "out"
    data = dataset(tmp_path / "data")
    common = [*attribution(folders), "--out", str(out)]
    result = invoke(*common, "--dataset", str(data), "--text", TEXT, code=2)
    assert "drop --text, --target and --entity" in result.output
    result = invoke(*common, "--text", TEXT, "--target", TARGET, "--n-prompts", "3", code=2)
    assert "add --dataset" in result.output
    result = invoke(*common, "--dataset", str(data), "--template", "movie", code=2)
    assert "templates there: headline, qa" in result.output
    result = invoke(*common, code=2)
    assert "--text and --target (repeat), or --dataset" in result.output
    assert not out.exists()
