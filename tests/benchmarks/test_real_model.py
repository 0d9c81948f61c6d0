"""The real-model benchmark's smoke run on a tiny model, and its input checks."""

from __future__ import annotations

import json

import polars as pl
import pytest

from benchmarks import real_model


@pytest.mark.slow
def test_smoke_run_writes_every_figure(tmp_path, capsys):
    out, results = tmp_path / "bench.json", tmp_path / "results"
    argv = ["--model", "tiny-llama", "--prompts", "2", "--batch-size", "8", "--repeats", "1"]
    argv += ["--paper-examples", "1", "--json", str(out), "--out", str(results)]
    assert real_model.main(argv) == 0
    data = json.loads(out.read_text())
    # --out: the ratios as one CSV row, with what made them
    (row,) = pl.read_csv(results / "real_model.csv").to_dicts()
    assert row["model"] == "tiny-llama" and row["prompts"] == 2 and row["batch_size"] == 8
    assert row["e3_engine_over_plain"] == pytest.approx(data["e3"]["value"])
    assert row["paper_over_engine_per_example"] == pytest.approx(data["paper"]["ratio"]["value"])
    entry = json.loads((results / "provenance.json").read_text())["benchmarks"]["real_model"]
    assert entry["command"] == " ".join(["python", "-m", "benchmarks.real_model", *argv])
    assert "git_commit" in entry and entry["settings"]["paper_examples"] == 1
    assert data["rows"] == {"e1": 16, "e3": 16, "fe_lt": 2}
    assert data["pre_engine_vs_plain_max_abs_diff"] == 0.0
    assert data["paper"]["examples"] == 1
    assert data["paper"]["max_abs_diff_vs_engine"] <= 1e-5
    for key in ("e1", "e3"):
        assert data[key]["value"] > 0 and data[key]["goal"].startswith("<=")
    mem = data["memory"]
    assert mem["param_bytes_base_plus_donor"] > 0
    if "ratio" in mem:  # the kernel let the benchmark reset its peak-RSS mark
        net = (mem["peak_rss_timed_runs"] - mem["rss_fixed_costs"]) / mem["bound_bytes"]
        assert mem["ratio_without_fixed_costs"]["value"] == pytest.approx(net)
        assert mem["ratio"]["value"] > mem["ratio_without_fixed_costs"]["value"]
    assert data["environment"]["command"].endswith(f"--out {results}")
    text = capsys.readouterr().out
    assert "(a) E1 position mix" in text and ("PASS" in text or "FAIL" in text)


def test_unknown_model_is_one_line_exit_2(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert real_model.main(["--model", "no-such-model", "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown model") and "\n" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    "bad",
    [["--prompts", "0"], ["--paper-examples", "40"], ["--device", "gpu7"], ["--dtype", "int8"]],
)
def test_bad_counts_exit_2(bad):
    with pytest.raises(SystemExit) as exc:
        real_model.parse_args(bad)
    assert exc.value.code == 2


@pytest.mark.slow
def test_too_many_prompts_is_one_line_exit_2(capsys):
    assert real_model.main(["--model", "tiny-llama", "--prompts", "100000"]) == 2
    err = capsys.readouterr().err.strip()
    assert "usable headline prompts" in err and "\n" not in err


def test_out_that_is_a_file_is_exit_2(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("")
    with pytest.raises(SystemExit) as exit_:
        real_model.parse_args(["--out", str(taken)])
    assert exit_.value.code == 2
