"""``graft-exp attribution`` on a tiny llama pair saved as model folders: the table, the map,
config.json and ``--verify``'s real grafts (their estimates the table's, the real effects
those of ``graft_texts``); bad input exits 2 and writes nothing."""

from __future__ import annotations

import json

import polars as pl
import pytest
import torch

import graft
from graft.models.tiny import perturbed_copy, tiny_model
from tests.cli.test_experiments import invoke

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


@pytest.mark.slow
def test_table_map_and_verify(folders, tmp_path):
    out = tmp_path / "out"
    args = [
        "attribution",
        "--base-model",
        str(folders / "base"),
        "--donor-model",
        str(folders / "donor"),
    ]
    args += ["--text", TEXT, "--target", TARGET, "--entity", ENTITY, "--out", str(out)]
    result = invoke(*args, "--kind", "o", "--kind", "mlp", "--verify", "3")
    table = pl.read_csv(out / "attribution.csv")
    assert table.columns == ["prompt", "layer", "unit", "kind", "estimate"]
    assert len(table) == 4 * 2 * 2  # layers x units x kinds
    assert (out / "figures" / "attribution_map.png").stat().st_size > 0
    record = json.loads((out / "config.json").read_text())
    assert record["kinds"] == ["o", "mlp"] and record["verify"] == 3
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


def test_bad_input_exits_2_and_writes_nothing(folders, tmp_path):
    out = tmp_path / "out"
    common = [
        "attribution",
        "--base-model",
        str(folders / "base"),
        "--donor-model",
        str(folders / "donor"),
    ]
    common += ["--out", str(out)]
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
    assert not out.exists()
