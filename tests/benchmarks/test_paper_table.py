"""The README's results table (benchmarks.paper_table) and the committed figures' redraw
(benchmarks.results_figures) from saved summaries."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from benchmarks import paper_table, results_figures

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_table_of_the_committed_results():
    text = paper_table.table(
        [
            ("A", "smollm2-135m", str(RESULTS / "smollm2-cpu-seeds012")),
            ("D", "gemma3-270m", str(RESULTS / "gemma3-cpu-paper-seed0")),
        ]
    )
    lines = text.splitlines()
    assert lines[0].startswith("| paper's finding")
    # D's LT 35/50 against Gemma's 53%: the exact binomial test rejects it
    (lt,) = [line for line in lines if line.startswith("| Fig. 2: LT |") and "| D |" in line]
    assert "0.53 (paper: Gemma-1.1-2B)" in lt and "LT 0.70" in lt
    assert "**no**" in lt and "exact binomial p = 0.016" in lt
    # A's FE+LT falls short of SFT (Holm p = 0.00061): the "≈ SFT" statement fails
    (fe_lt,) = [line for line in lines if "FE+LT ≈ SFT" in line and "| A |" in line]
    assert "(paper: Llama-3.2-1B)" in fe_lt and "**no**" in fe_lt and "0.00061" in fe_lt
    # numbers no run tests: one "not run" row each (GPT2-XL's FE; the hybrid of both models)
    assert sum("no committed run" in line for line in lines) == 5
    assert not any("Pythia" in line for line in lines)  # no run stands for Pythia


def test_usage_error_is_exit_2(capsys):
    assert paper_table.main(["A=results/x"]) == 2
    assert "usage" in capsys.readouterr().err
    assert results_figures.main(["only-one"]) == 2


def test_figure_redrawn_from_a_summary_csv(tmp_path):
    rows = [
        {"group": "", "template": t, "graft": g, "n": 50, "acc@5": v, "acc@5_lo": 0.0}
        | {"acc@5_hi": 1.0}
        for t in ("headline", "qa")
        for g, v in (("PRE", 0.0), ("SFT", 1.0), ("LT", 0.7))
    ]
    csv = tmp_path / "position_summary.csv"
    pl.DataFrame(rows).write_csv(csv)
    out = results_figures.draw(csv, "gemma3-270m", "headline", tmp_path / "fig.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png", "position_summary.csv"]
