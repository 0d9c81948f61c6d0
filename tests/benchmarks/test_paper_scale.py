"""The paper-scale benchmarks' smoke runs (one layer of gpt2-xl's exact width and vocabulary)
and their input checks."""

from __future__ import annotations

import json

import polars as pl
import pytest

from benchmarks import finetune_memory, paper_scale, paper_shapes
from graft.models.paper import PAPER_CONFIGS


@pytest.mark.slow
def test_paper_scale_one_layer_of_gpt2_xl(tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = ["--shapes", "gpt2-xl", "--dtypes", "float32", "--layers", "1", "--prompts", "2"]
    argv += ["--batch-size", "8", "--repeats", "1", "--paper-examples", "1", "--device", "cpu"]
    results = tmp_path / "results"
    assert paper_scale.main([*argv, "--json", str(out), "--out", str(results)]) == 0
    (res,) = json.loads(out.read_text())["results"]
    # --out: the table as CSV, with what made it
    (row,) = pl.read_csv(results / "paper_scale.csv").to_dicts()
    assert row["shape"] == "gpt2-xl" and row["dtype"] == "float32" and row["layers"] == 1
    assert row["e1_engine_over_plain"] == pytest.approx(res["e1_engine_over_plain"])
    entry = json.loads((results / "provenance.json").read_text())["benchmarks"]["paper_scale"]
    assert entry["command"] == " ".join(
        ["python", "-m", "benchmarks.paper_scale", *argv, "--json", str(out), "--out", str(results)]
    )
    assert entry["machine"]["torch_threads"] >= 1 and "git_commit" in entry
    assert entry["settings"]["prompts"] == 2 and entry["device"] == "cpu"
    model = res["environment"]["model"]
    assert model["shape"] == "gpt2-xl" and model["layers"] == 1
    # one layer of d=1600 (30,740,800) + the 50,257 x 1,600 embedding + 1,024 positions
    # (82,049,600) + the final norm (3,200)
    assert model["params"] == 112_793_600
    assert res["rows"] == {"e1": 16, "e3": 16}
    assert res["pre_engine_vs_plain_max_abs_diff"] == 0.0
    assert res["paper"]["max_abs_diff_vs_engine"] <= 1e-5
    mem = res["memory"]
    assert mem["param_bytes_base_plus_donor"] == 2 * 4 * model["params"]
    assert mem["bound_bytes"] == pytest.approx(
        1.1 * mem["param_bytes_base_plus_donor"] + mem["activation_bytes_one_plain_batch"]
    )
    assert res["environment"]["command"].startswith("python -m benchmarks.paper_scale")
    assert "| gpt2-xl | 1 x 1600 |" in capsys.readouterr().out


@pytest.mark.slow
def test_noisy_copy_moves_every_parameter():
    base = paper_shapes.random_model("llama3.2-1b", paper_scale.DTYPES["float32"], "cpu", 1)
    donor = paper_shapes.noisy_copy(base, seed=1)
    for (name, p), q in zip(base.named_parameters(), donor.parameters(), strict=True):
        assert not p.equal(q), name


@pytest.mark.parametrize(
    "bad", [["--shapes", "gpt3"], ["--dtypes", "int8"], ["--prompts", "0"], ["--layers", "0"]]
)
def test_paper_scale_bad_input_exits_2(bad):
    with pytest.raises(SystemExit) as exc:
        paper_scale.parse_args(bad)
    assert exc.value.code == 2


@pytest.mark.parametrize("name", list(PAPER_CONFIGS))
def test_shape_config_sets_depth(name):
    assert paper_scale.shape_config(name, 3).num_hidden_layers == 3
    assert (
        paper_scale.shape_config(name).num_hidden_layers == PAPER_CONFIGS[name]().num_hidden_layers
    )


@pytest.mark.slow
def test_finetune_memory_one_layer(tmp_path, capsys):
    out = tmp_path / "ft.json"
    argv = ["--shape", "gpt2-xl", "--layers", "1", "--batch-size", "1", "--seq-len", "8"]
    assert finetune_memory.main([*argv, "--steps", "2", "--device", "cpu", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert len(res["step_seconds"]) == 2 and res["peak_bytes"] > 0
    # float32 master weights, gradients and two AdamW moments: at least 16 bytes a parameter
    assert res["peak_bytes"] >= 16 * res["environment"]["model"]["params"] * 0.95
    assert "gpt2-xl (1 layers" in capsys.readouterr().out


def test_the_host_bound_proxy_narrows_a_paper_shape_at_its_depth():
    llama = paper_scale.shape_config("llama3.2-1b", 16, 64)
    assert (llama.num_hidden_layers, llama.hidden_size, llama.intermediate_size) == (16, 64, 256)
    # 32 query heads on 8 key/value heads: the same 4:1 at a width of 64
    assert (llama.num_attention_heads, llama.num_key_value_heads, llama.head_dim) == (4, 1, 16)
    gpt2 = paper_scale.shape_config("gpt2-xl", 48, 64)
    assert (gpt2.n_layer, gpt2.n_embd, gpt2.n_head, gpt2.n_inner) == (48, 64, 4, 256)
    args = paper_scale.parse_args(["--shapes", "gpt2-xl:48,llama3.2-1b:16", "--width", "64"])
    assert args.shapes == ["gpt2-xl", "llama3.2-1b"]
    assert args.depths == {"gpt2-xl": 48, "llama3.2-1b": 16}
    assert args.threads == 1  # the proxy: one host thread, unless asked
    assert paper_scale.parse_args(["--width", "64", "--threads", "2"]).threads == 2
    assert paper_scale.parse_args([]).threads is None  # torch's default at real widths
    child = paper_scale._child_argv(args, "gpt2-xl", "float32", paper_scale.Path("x.json"))
    assert child[child.index("--threads") + 1] == "1"
    for bad in (["--shapes", "gpt2-xl:x"], ["--width", "60"], ["--threads", "0"]):
        with pytest.raises(SystemExit) as info:
            paper_scale.parse_args(bad)
        assert info.value.code == 2
