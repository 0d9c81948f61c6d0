"""The per-model exactness benchmark: its numbers on a tiny model, against the float32 bound
and against each other."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.real_model_bound import COLUMNS, keep_norms_in_dtype, main, model_names
from graft.errors import GraftError
from graft.models.tiny import tiny_model
from graft.results.publish import read_provenance

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_the_bound_of_a_tiny_model_is_measured_and_printed(tmp_path, capsys):
    out = tmp_path / "bound.json"
    args = ["--model", "tiny-gpt2", "--prompts", "1", "--json", str(out), "--out", str(tmp_path)]
    assert main(args) == 0
    [result] = json.loads(out.read_text())
    entry = read_provenance(tmp_path)["benchmarks"]["real_model_bound"]
    assert entry["command"].startswith("python -m benchmarks.real_model_bound --model tiny-gpt2")
    assert entry["machine"]["torch_threads"] == 1
    assert (tmp_path / "real_model_bound.csv").read_text().startswith("model,dtype,")
    assert result["rows"] == 16  # 8 E1 grafts + 8 component sets on one prompt
    assert 0 < result["graft_vs_ref"] <= 1e-5  # float32 rounding, not 0: one pass vs cached
    assert result["graft_vs_ref"] == max(
        result["graft_vs_ref_e1"], result["graft_vs_ref_components"]
    )
    for key in ("ref_none_vs_plain", "paper_none_vs_plain", "graft_none_vs_plain"):
        assert result[key] <= 1e-5
    assert result["max_abs_logit"] > 0.1
    assert result["relative"] == pytest.approx(result["graft_vs_ref"] / result["max_abs_logit"])
    table = capsys.readouterr().out
    assert all(header in table for header in COLUMNS.values())
    assert "| tiny-gpt2 | float32 | 16 |" in table


def test_tiny_names_every_family_and_a_donor_goes_with_one_model(capsys):
    assert model_names(["tiny", "smollm2-135m"])[-1] == "smollm2-135m"
    assert len(model_names(["tiny"])) == 8
    assert main(["--model", "tiny", "--donor", "somewhere"]) == 2
    assert "--donor goes with one --model" in capsys.readouterr().err


@pytest.mark.slow
def test_float64_casts_the_model_up_and_the_bound_falls_to_rounding_of_float64(tmp_path, capsys):
    out = tmp_path / "bound.json"
    args = ["--model", "tiny-llama", "--prompts", "1", "--dtype", "float64", "--json", str(out)]
    assert main(args) == 0
    [result] = json.loads(out.read_text())
    assert result["dtype"] == "float64"
    assert 0 <= result["graft_vs_ref"] <= 1e-10  # float32's ~1e-6 gone: it was rounding
    assert result["ref_none_vs_plain"] <= 1e-10
    assert "| tiny-llama | float64 | 16 |" in capsys.readouterr().out


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3"])
def test_norms_in_dtype_compute_the_same_function_in_float64(family):
    model = tiny_model(family, seed=0).to(torch.float64)
    ids = torch.tensor([[3, 7, 11, 5, 2]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        assert keep_norms_in_dtype(model) >= 2 * model.config.num_hidden_layers + 1
        after = model(input_ids=ids).logits
    assert 0 < (after - before).abs().max() <= 1e-5  # float32 rounding at the norms, gone


def test_norms_in_dtype_go_with_float64_and_refuse_an_unknown_norm(capsys):
    assert main(["--model", "tiny-llama", "--norms-in-dtype"]) == 2
    assert "--norms-in-dtype goes with --dtype float64" in capsys.readouterr().err

    class OddRMSNorm(torch.nn.Module):
        pass

    with pytest.raises(GraftError, match="knows the Llama and Gemma RMSNorms, not OddRMSNorm"):
        keep_norms_in_dtype(torch.nn.Sequential(OddRMSNorm()))


@pytest.mark.slow
def test_norms_in_dtype_take_a_gemma_bound_to_float64_rounding(tmp_path):
    out = tmp_path / "bound.json"
    args = ["--model", "tiny-gemma3", "--prompts", "1", "--dtype", "float64", "--norms-in-dtype"]
    assert main([*args, "--json", str(out)]) == 0
    [result] = json.loads(out.read_text())
    assert result["norms"] == "in dtype"
    assert result["graft_vs_ref"] <= 1e-12
